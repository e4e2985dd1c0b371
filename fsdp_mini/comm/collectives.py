"""Communication layer: every collective of the engine goes through :class:`Comm`.

Each call is written in a per-rank :class:`~fsdp_mini.comm.ledger.Ledger` with the bytes the
*algorithm* moves (the ring model, see :mod:`fsdp_mini.comm.ledger`), so the numbers a learner sees
are the ones the ZeRO/FSDP formulas talk about, whatever the backend does underneath (gloo on CPU
emulates some collectives; NCCL picks rings or trees).

Example, N = 4, all-gather of a unit whose padded flat parameter holds 8 floats (32 bytes)::

    before:  rank0 [a0 a1]  rank1 [b0 b1]  rank2 [c0 c1]  rank3 [d0 d1]      (shards, 8 B each)
    after:   every rank [a0 a1 b0 b1 c0 c1 d0 d1]                             (payload 32 B)
    ledger:  each rank sent 3/4 x 32 = 24 B  (it forwarded the 3 shards it did not own)

Every collective takes a ``label``: a :class:`~fsdp_mini.comm.ledger.Tag` (unit and phase, what the
engine passes), or any string (then the unit is that string and the phase the op).

At world size 1 (no process group) the collectives are local copies and send 0 bytes, so the
same strategy code runs in a single process.

With ``link=Link(...)`` (see :mod:`fsdp_mini.comm.link`) every collective also takes at least its
simulated α-β time on a slow network: ``Handle.wait()`` returns at max(real completion, issue +
queueing + cost), and the record carries ``simulated_seconds`` and ``simulated_queue``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..arguments import flag
from .check import CollectiveMismatchError, SequenceCheck, all_gather_flat, reduce_scatter_flat
from .ledger import CollectiveRecord, Ledger, OpTotal, Tag, ring_bytes
from .link import Link

__all__ = ["Comm", "Handle", "Reduction", "broadcast_module_states", "CollectiveMismatchError",
           "CollectiveRecord", "Ledger", "OpTotal", "Tag"]


class Handle:
    """An in-flight collective. ``wait()`` blocks until it is done and stamps its duration;
    with a simulated link, until its simulated transfer ends too (``sim_end``, perf_counter)."""

    def __init__(self, work, record: CollectiveRecord, ledger: Ledger, t0: float,
                 sim_end: float | None = None):
        self._work, self._record, self._ledger, self._t0 = work, record, ledger, t0
        self.sim_end = sim_end
        self.done, self.blocking = False, False

    def wait(self) -> None:
        if self.done:
            return
        # Note: from issue to here the rank was free to compute (the overlap); from here to the
        # end it is blocked. A blocking collective waits at once (waited stays 0).
        if not self.blocking:
            self._record.waited = time.perf_counter() - self._t0
        if self._work is not None:
            self._work.wait()
        if self.sim_end is not None:
            # Note: the bytes arrived (gloo is fast); the simulated link has not carried them yet.
            time.sleep(max(0.0, self.sim_end - time.perf_counter()))
        self._record.seconds = time.perf_counter() - self._t0
        self.done = True
        self._ledger._completed(self._record)


class Comm:
    """The collectives fsdp_mini uses, on one process group, each written in ``ledger``.

    ``Comm()`` outside a process group (or with a group of one rank) runs every collective as a
    local copy, so strategies work unchanged in a single process. ``check_collectives=True``
    turns on :class:`SequenceCheck` (debug mode). ``link`` (a :class:`~fsdp_mini.comm.link.Link`)
    makes every collective take at least its simulated time on that link.
    """

    def __init__(self, group=None, ledger: Ledger | None = None, check_collectives: bool = False,
                 name: str = "world", link: Link | None = None):
        if link is not None and not isinstance(link, Link):
            raise TypeError(f"link must be None or a fsdp_mini.Link(bandwidth_gbs=..., "
                            f"latency_us=...), got {link!r}")
        flag("Comm(check_collectives)", check_collectives)
        if ledger is not None and not isinstance(ledger, Ledger):
            raise TypeError(f"Comm(ledger) must be None (a new one) or a fsdp_mini.Ledger, got "
                            f"{ledger!r} (a {type(ledger).__name__})")
        self.link = link
        self.ledger = ledger if ledger is not None else Ledger()
        self.name = name  # written in each record: which group a collective ran on
        if dist.is_available() and dist.is_initialized():
            self.group = group if group is not None else dist.group.WORLD
            self.rank = dist.get_rank(self.group)
            self.world_size = dist.get_world_size(self.group)
        elif group is not None:
            raise RuntimeError("a process group was passed but torch.distributed is not "
                               "initialised: call dist.init_process_group first (fsdp_mini.launch "
                               "does it for you)")
        else:
            self.group, self.rank, self.world_size = None, 0, 1
        self.check = (SequenceCheck(self.group, self.world_size)
                      if check_collectives and self.world_size > 1 else None)

    @property
    def device(self) -> torch.device:
        """Where this group's collectives need their tensors: the rank's GPU under NCCL, else
        the CPU (e.g. for a norm computed from gradients offloaded to the CPU)."""
        if self.group is not None and dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # -- the collectives ------------------------------------------------------------------------

    def all_gather(self, output: torch.Tensor, shard: torch.Tensor, label: str | Tag,
                   async_op: bool = False) -> Handle | None:
        """Concatenate every rank's ``shard`` into ``output`` (``output.numel() == N * shard.numel()``)."""
        _check_flat_sizes("all_gather", output, shard, self.world_size)
        return self._run("all_gather", label, shard, _nbytes(output),
                         lambda: all_gather_flat(output, shard, group=self.group, async_op=async_op),
                         lambda: output.copy_(shard), async_op)

    def reduce_scatter(self, output: torch.Tensor, full: torch.Tensor, label: str | Tag,
                       async_op: bool = False) -> Handle | None:
        """Sum ``full`` over ranks and leave this rank's 1/N slice of the sum in ``output``."""
        _check_flat_sizes("reduce_scatter", full, output, self.world_size)
        return self._run("reduce_scatter", label, output, _nbytes(full),
                         lambda: reduce_scatter_flat(output, full, op=dist.ReduceOp.SUM,
                                                     group=self.group, async_op=async_op),
                         lambda: output.copy_(full), async_op)

    def all_reduce(self, tensor: torch.Tensor, label: str | Tag, async_op: bool = False,
                   op: str = "sum") -> Handle | None:
        """Sum (or, with ``op="max"``, the maximum of) ``tensor`` over ranks, in place."""
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        return self._run("all_reduce", label, tensor, _nbytes(tensor),
                         lambda: dist.all_reduce(tensor, op=reduce_op, group=self.group,
                                                 async_op=async_op),
                         lambda: None, async_op)

    def broadcast(self, tensor: torch.Tensor, label: str | Tag, src: int = 0,
                  async_op: bool = False) -> Handle | None:
        """Copy rank ``src``'s ``tensor`` to every rank (``src`` is a rank of this group)."""
        src_global = dist.get_global_rank(self.group, src) if self.group is not None else src
        return self._run("broadcast", label, tensor, _nbytes(tensor),
                         lambda: dist.broadcast(tensor, src=src_global, group=self.group,
                                                async_op=async_op),
                         lambda: None, async_op)

    def barrier(self, label: str | Tag = "barrier") -> None:
        self._run("barrier", label, None, 0, lambda: dist.barrier(group=self.group),
                  lambda: None, False)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _run(self, op, label, tensor, payload, distributed_call, local_call, async_op):
        tag = label if isinstance(label, Tag) else Tag(str(label), op)
        step = self.ledger._step_for_new_record()
        if self.check is not None:
            self.check(op, str(label), tensor, step)
        sent = ring_bytes(op, payload, self.world_size)
        record = CollectiveRecord(op, str(label), payload, sent, step, time.time(),
                                  unit=tag.unit, phase=tag.phase, group=self.name)
        self.ledger._issued(record)
        t0 = time.perf_counter()
        sim_end = self._simulate(record, t0) if self.link is not None else None
        work = distributed_call() if self.world_size > 1 else local_call()
        handle = Handle(work if self.world_size > 1 else None, record, self.ledger, t0, sim_end)
        if async_op:
            return handle
        handle.blocking = True
        handle.wait()
        return None

    def _simulate(self, record: CollectiveRecord, t0: float) -> float:
        """Queue ``record`` on the simulated link; return when its transfer ends (perf_counter)."""
        cost = self.link.cost(record.op, record.payload_bytes, self.world_size)
        begin = self.link.reserve(t0, cost)
        record.simulated_seconds, record.simulated_queue = cost, begin - t0
        return begin + cost


def broadcast_module_states(module: torch.nn.Module, comm: Comm) -> None:
    """Make every rank start from rank 0's parameters and buffers.

    Note: tensors on the meta device have no values yet; they are initialised identically on
    every rank when materialised (see :mod:`fsdp_mini.fsdp.meta_init`)."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_meta:
                comm.broadcast(t.data, label=Tag("sync", name))


@dataclass
class Reduction:
    """A gradient reduction in flight: the buffer sent, where this rank's result lands, the
    handle to wait on, and the slots this rank had no gradient for (see
    :mod:`fsdp_mini.buffers.absent`). ``target`` says what it reduces (a bucket index, a unit's flat
    group)."""

    target: object
    sent: torch.Tensor
    result: torch.Tensor
    handle: Handle
    absent: list[int]
    owned: bool = True  # ``sent`` was made for this reduction alone (False: a kept buffer)

    def mean(self, world_size: int) -> torch.Tensor:
        """Wait for the sum over ranks, then divide it by N: the gradient of the global batch."""
        self.handle.wait()
        return self.result.div_(world_size)

    def free_sent(self) -> None:
        """Free the buffer sent, once its result has been read (an owned buffer only).

        Note: a backend's worker thread can hold the finished work, and with it this buffer, a
        moment after the wait returns (gloo's does). On busy cores that moment reached into the
        optimizer step and added a whole bucket to its peak; freeing the storage here ends the
        buffer when the algorithm is done with it, whatever the thread does."""
        self.handle.wait()
        if self.owned:
            self.sent.untyped_storage().resize_(0)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check_flat_sizes(op: str, full: torch.Tensor, shard: torch.Tensor, world_size: int) -> None:
    if full.numel() != world_size * shard.numel():
        raise ValueError(f"{op}: the full tensor has {full.numel()} elements but {world_size} "
                         f"shards of {shard.numel()} make {world_size * shard.numel()}; pad the "
                         f"flat tensor to a multiple of the world size")
