"""Communication layer: every collective of the engine goes through :class:`Comm`.

Each call is written in a per-rank :class:`Ledger` with the bytes the *algorithm* moves, so the
numbers a learner sees are the ones the ZeRO/FSDP formulas talk about, whatever the backend does
underneath (gloo on CPU emulates some collectives; NCCL picks rings or trees).

Logical bytes sent by one rank, ring model (N = world size, payload = the whole logical tensor):

==============  =================================  =========================================
op              payload                            bytes this rank sends
==============  =================================  =========================================
all_gather      the gathered (full) tensor         (N-1)/N x payload  = (N-1) x shard bytes
reduce_scatter  the full input tensor              (N-1)/N x payload  = (N-1) x shard bytes
all_reduce      the tensor                         2(N-1)/N x payload (reduce-scatter + all-gather)
broadcast       the tensor                         (N-1)/N x payload  (per-rank average of a
                                                   pipelined chain: N-1 links carry it once)
barrier         nothing                            0
==============  =================================  =========================================

Example, N = 4, all-gather of a unit whose padded flat parameter holds 8 floats (32 bytes)::

    before:  rank0 [a0 a1]  rank1 [b0 b1]  rank2 [c0 c1]  rank3 [d0 d1]      (shards, 8 B each)
    after:   every rank [a0 a1 b0 b1 c0 c1 d0 d1]                             (payload 32 B)
    ledger:  each rank sent 3/4 x 32 = 24 B  (it forwarded the 3 shards it did not own)

At world size 1 (no process group) the collectives are local copies and send 0 bytes, so the
same strategy code runs in a single process.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

# Note: torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class CollectiveRecord:
    """One collective as the ledger saw it."""

    op: str
    label: str
    payload_bytes: int
    sent_bytes: float
    step: int
    start: float  # wall clock (time.time()) when it was issued
    seconds: float = float("nan")  # issue -> completion seen by this rank (host clock)


@dataclass
class OpTotal:
    calls: int = 0
    payload_bytes: int = 0
    sent_bytes: float = 0.0
    seconds: float = 0.0


@dataclass
class Ledger:
    """Per-rank list of collectives, with totals per op and per step.

    ``step`` numbers the training steps, so totals can be asked per step. It advances by itself:
    ``optimizer.step()`` of a parallelized model closes the current step, and the next collective
    opens the following one. A loop may also call ``ledger.next_step()`` itself (at the start or
    the end of each iteration); a step is never counted twice. Listeners (``subscribe``) are
    called with each record once it has completed.
    """

    records: list[CollectiveRecord] = field(default_factory=list)
    step: int = 0
    _listeners: list[Callable[[CollectiveRecord], None]] = field(default_factory=list)
    _step_closed: bool = False

    def next_step(self) -> int:
        """Start a new step now."""
        self.step += 1
        self._step_closed = False
        return self.step

    def step_done(self) -> None:
        """The optimizer stepped: the next collective belongs to the next step."""
        self._step_closed = True

    def _step_for_new_record(self) -> int:
        if self._step_closed:
            self.next_step()
        return self.step

    def reset(self) -> None:
        """Forget all records (the step counter is kept)."""
        self.records.clear()

    def subscribe(self, listener: Callable[[CollectiveRecord], None]) -> None:
        self._listeners.append(listener)

    def _issued(self, record: CollectiveRecord) -> None:
        self.records.append(record)

    def _completed(self, record: CollectiveRecord) -> None:
        for listener in self._listeners:
            listener(record)

    def select(self, step: int | None = None, op: str | None = None) -> list[CollectiveRecord]:
        return [r for r in self.records
                if (step is None or r.step == step) and (op is None or r.op == op)]

    def totals(self, step: int | None = None) -> dict[str, OpTotal]:
        """Totals per op, over all records or over one step."""
        out: dict[str, OpTotal] = {}
        for r in self.select(step):
            t = out.setdefault(r.op, OpTotal())
            t.calls += 1
            t.payload_bytes += r.payload_bytes
            t.sent_bytes += r.sent_bytes
            t.seconds += r.seconds
        return out

    def sent_bytes(self, step: int | None = None) -> float:
        return sum(r.sent_bytes for r in self.select(step))

    def steps(self) -> list[int]:
        return sorted({r.step for r in self.records})


class Handle:
    """An in-flight collective. ``wait()`` blocks until it is done and stamps its duration."""

    def __init__(self, work, record: CollectiveRecord, ledger: Ledger, t0: float):
        self._work, self._record, self._ledger, self._t0 = work, record, ledger, t0
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        if self._work is not None:
            self._work.wait()
        self._record.seconds = time.perf_counter() - self._t0
        self.done = True
        self._ledger._completed(self._record)


class CollectiveMismatchError(RuntimeError):
    """Ranks were about to issue different collectives (the classic cause of a hang)."""


class SequenceCheck:
    """Debug mode: before every collective, the ranks compare what they are about to issue.

    Collectives pair up by order alone: if rank 1 skips a unit's all-gather, its next all-gather
    meets rank 0's previous one, and the job hangs or silently mixes two units. With the check on,
    every rank first shares (op, label, elements, dtype) over a side channel, and on the first
    difference every rank raises a :class:`CollectiveMismatchError` naming both sides, at once.
    Cost: one all-gather of one integer (a hash of the description) per collective; the
    descriptions themselves travel only when the hashes differ. None when off.
    """

    def __init__(self, group, world_size: int):
        # Note: a gloo side channel, so the check also works when the job itself runs on NCCL.
        same = dist.get_backend(group) == "gloo"
        self.group = group if same else dist.new_group(dist.get_process_group_ranks(group),
                                                       backend="gloo")
        self.world_size, self.calls = world_size, 0

    def __call__(self, op: str, label: str, tensor: torch.Tensor | None, step: int) -> None:
        self.calls += 1
        mine = (op, label, 0 if tensor is None else tensor.numel(),
                "-" if tensor is None else str(tensor.dtype).replace("torch.", ""))
        digest = torch.tensor([zlib.crc32(repr(mine).encode())], dtype=torch.int64)
        digests = torch.empty(self.world_size, dtype=torch.int64)
        _all_gather_flat(digests, digest, group=self.group)
        if bool((digests != digests[0]).any()):
            everyone: list = [None] * self.world_size
            dist.all_gather_object(everyone, mine, group=self.group)
            odd = next(r for r, theirs in enumerate(everyone) if theirs != everyone[0])
            raise CollectiveMismatchError(
                f"collective mismatch at step {step}, collective #{self.calls} of this job: "
                f"rank 0 issues {_describe(everyone[0])} but rank {odd} issues "
                f"{_describe(everyone[odd])}. Every rank must issue the same collectives in the "
                f"same order (a rank that skips a unit or a batch breaks the pairing).")


def _describe(fingerprint) -> str:
    op, label, numel, dtype = fingerprint
    return f"{op} {label!r} ({numel} {dtype} elements)"


class Comm:
    """The collectives fsdp_mini uses, on one process group, each written in ``ledger``.

    ``Comm()`` outside a process group (or with a group of one rank) runs every collective as a
    local copy, so strategies work unchanged in a single process. ``check_collectives=True``
    turns on :class:`SequenceCheck` (debug mode).
    """

    def __init__(self, group=None, ledger: Ledger | None = None, check_collectives: bool = False):
        self.ledger = ledger if ledger is not None else Ledger()
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

    # -- the collectives ------------------------------------------------------------------------

    def all_gather(self, output: torch.Tensor, shard: torch.Tensor, label: str,
                   async_op: bool = False) -> Handle | None:
        """Concatenate every rank's ``shard`` into ``output`` (``output.numel() == N * shard.numel()``)."""
        _check_flat_sizes("all_gather", output, shard, self.world_size)
        nbytes = _nbytes(output)
        return self._run("all_gather", label, shard, nbytes, (self.world_size - 1) * _nbytes(shard),
                         lambda: _all_gather_flat(output, shard, group=self.group, async_op=async_op),
                         lambda: output.copy_(shard), async_op)

    def reduce_scatter(self, output: torch.Tensor, full: torch.Tensor, label: str,
                       async_op: bool = False) -> Handle | None:
        """Sum ``full`` over ranks and leave this rank's 1/N slice of the sum in ``output``."""
        _check_flat_sizes("reduce_scatter", full, output, self.world_size)
        return self._run("reduce_scatter", label, output, _nbytes(full),
                         (self.world_size - 1) * _nbytes(output),
                         lambda: _reduce_scatter_flat(output, full, op=dist.ReduceOp.SUM,
                                                      group=self.group, async_op=async_op),
                         lambda: output.copy_(full), async_op)

    def all_reduce(self, tensor: torch.Tensor, label: str, async_op: bool = False,
                   op: str = "sum") -> Handle | None:
        """Sum (or, with ``op="max"``, the maximum of) ``tensor`` over ranks, in place."""
        n = self.world_size
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        return self._run("all_reduce", label, tensor, _nbytes(tensor),
                         2 * (n - 1) * _nbytes(tensor) / n,
                         lambda: dist.all_reduce(tensor, op=reduce_op, group=self.group,
                                                 async_op=async_op),
                         lambda: None, async_op)

    def broadcast(self, tensor: torch.Tensor, label: str, src: int = 0,
                  async_op: bool = False) -> Handle | None:
        """Copy rank ``src``'s ``tensor`` to every rank (``src`` is a rank of this group)."""
        n = self.world_size
        src_global = dist.get_global_rank(self.group, src) if self.group is not None else src
        return self._run("broadcast", label, tensor, _nbytes(tensor), (n - 1) * _nbytes(tensor) / n,
                         lambda: dist.broadcast(tensor, src=src_global, group=self.group,
                                                async_op=async_op),
                         lambda: None, async_op)

    def barrier(self, label: str = "barrier") -> None:
        self._run("barrier", label, None, 0, 0, lambda: dist.barrier(group=self.group),
                  lambda: None, False)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _run(self, op, label, tensor, payload, sent, distributed_call, local_call, async_op):
        step = self.ledger._step_for_new_record()
        if self.check is not None:
            self.check(op, label, tensor, step)
        record = CollectiveRecord(op, label, payload, sent, step, time.time())
        self.ledger._issued(record)
        t0 = time.perf_counter()
        work = distributed_call() if self.world_size > 1 else local_call()
        handle = Handle(work if self.world_size > 1 else None, record, self.ledger, t0)
        if async_op:
            return handle
        handle.wait()
        return None


def broadcast_module_states(module: torch.nn.Module, comm: Comm) -> None:
    """Make every rank start from rank 0's parameters and buffers."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            comm.broadcast(t.data, label=f"sync/{name}")


@dataclass
class Reduction:
    """A gradient reduction in flight: the buffer sent, where this rank's result lands, the
    handle to wait on, and the slots this rank had no gradient for (see :mod:`fsdp_mini.absent`).
    ``target`` says what it reduces (a bucket index, a unit's flat group)."""

    target: object
    sent: torch.Tensor
    result: torch.Tensor
    handle: Handle
    absent: list[int]

    def mean(self, world_size: int) -> torch.Tensor:
        """Wait for the sum over ranks, then divide it by N: the gradient of the global batch."""
        self.handle.wait()
        return self.result.div_(world_size)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check_flat_sizes(op: str, full: torch.Tensor, shard: torch.Tensor, world_size: int) -> None:
    if full.numel() != world_size * shard.numel():
        raise ValueError(f"{op}: the full tensor has {full.numel()} elements but {world_size} "
                         f"shards of {shard.numel()} make {world_size * shard.numel()}; pad the "
                         f"flat tensor to a multiple of the world size")
