"""ZeRO-1 and ZeRO-2: shard the optimizer state (and the gradients), keep full parameters.

Trainable parameters are packed into flat buckets, each padded to a multiple of N and split into N
shards. Rank r *owns* shard r of every bucket: only it keeps optimizer state for those elements
and only it updates them. Its optimizer sees one piece per original parameter (the part inside
its shard, see :mod:`fsdp_mini.buffers.flat`).

One step, per bucket, N = 2, a bucket of 4 elements::

    backward             rank0 grad [1 2 3 4]         rank1 grad [5 6 7 8]
    reduce-scatter, /N   rank0 owns [3 4]             rank1 owns [5 6]      (mean of both ranks)
    optimizer step       rank0 updates params[0:2]    rank1 updates params[2:4]
    all-gather params    both ranks hold all 4 updated parameters again

Traffic per step: reduce-scatter Ψ + all-gather Ψ = 2(N-1)/N x 4Ψ bytes, the same as DDP.
Memory per rank (fp32, Adam):
    zero1  params 4Ψ + full grads 4Ψ + Adam 8Ψ/N    gradients accumulate in a full flat buffer,
                                                     reduce-scattered by optimizer.step()
    zero2  params 4Ψ + grad shard 4Ψ/N + Adam 8Ψ/N  each bucket is reduce-scattered during
                                                     backward, as soon as its gradients are
                                                     ready, and its full gradients are freed
                                                     (``p.grad`` becomes a GradientElsewhere)

Under ``fsdp_mini.no_sync``, zero1 changes nothing (it sends nothing during backward); zero2
launches no bucket and keeps the full ``p.grad`` (4Ψ while accumulating), which the next backward
outside the block reduce-scatters, summed (see :mod:`fsdp_mini.buffers.accumulate`).

Mixed precision (:mod:`fsdp_mini.precision.policy`): ``reduce_dtype=torch.bfloat16`` reduce-scatters
the gradients in bf16 (zero2 flattens them into a bf16 buffer; zero1 casts its fp32 gradient
buffer at the step) and casts each rank's averaged shard back to fp32 for the optimizer:
(N-1)/N x (2Ψ + 4Ψ) bytes. The all-gather of the updated parameters stays fp32, and there is no
``param_dtype``: every rank keeps whole fp32 parameters; compute in bf16 with ``torch.autocast``.
"""

from __future__ import annotations

import torch
from torch import nn

from .buffers.absent import mark_absent, present_values
from .buffers.accumulate import check_synced
from .buffers.buckets import BucketScheduler, TrainableCheck, grad_ready_order, split_into_buckets
from .buffers.flat import FlatLayout, ParamSlot, ShardPieces, param_slots
from .clip import GradientElsewhere, GradWatch
from .comm.collectives import Comm, Reduction, broadcast_module_states
from .memory import allocating
from .precision.policy import MixedPrecision, cast, cast_grad
from .strategy import PieceRange, Strategy
from .theory import zero_sent_bytes


class ZeroBucket:
    """A flat, padded buffer holding some parameters, and this rank's shard of it, in pieces.
    With ``full_grads`` (ZeRO-1), the parameters' gradients live in a second flat buffer of the
    same layout."""

    def __init__(self, params: list[nn.Parameter], comm: Comm, full_grads: bool):
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) > 1:
            raise ValueError(f"a ZeRO bucket would mix parameter dtypes/devices "
                             f"{sorted(map(str, kinds))}; move or cast the model to one first")
        self.params = params
        self.layout = FlatLayout([ParamSlot(p, [], []) for p in params], comm.world_size)
        with torch.no_grad(), allocating("params"):
            self.flat = self.layout.flatten([p.detach() for p in params])
        for p, view in zip(params, self.layout.views(self.flat)):
            p.data = view  # the module's parameters now live inside the bucket
        start, end = self.layout.shard_range(comm.rank)
        self.shard = self.flat[start:end]  # shares storage with the bucket
        self.pieces = ShardPieces(self.layout, self.shard, comm.rank)
        self.flat_grad = self.grad_views = None
        if full_grads:
            with allocating("grads"):
                self.flat_grad = torch.zeros_like(self.flat)
            self.grad_views = self.layout.views(self.flat_grad)

    def adopt_grad(self, j: int) -> None:
        """ZeRO-1: move parameter j's gradient into the flat gradient buffer (if autograd made a
        fresh tensor, e.g. after ``zero_grad()`` set it to None), and make ``p.grad`` a view of
        it, so later backwards accumulate in place."""
        p, view = self.params[j], self.grad_views[j]
        if p.grad is not None and (p.grad.data_ptr() != view.data_ptr() or p.grad.shape != view.shape):
            with torch.no_grad():
                view.copy_(p.grad)
            p.grad = view

    def full_grad_to_reduce(self) -> list[int]:
        """ZeRO-1: ready the flat gradient buffer for the reduce-scatter; return the absent slots."""
        for j in range(len(self.params)):
            self.adopt_grad(j)
        absent = [j for j, p in enumerate(self.params) if p.grad is None]
        with torch.no_grad():
            present_values(self.flat_grad)
            for j in absent:
                mark_absent(self.layout.slot_view(self.flat_grad, j))
        return absent


class Zero(Strategy):
    """ZeRO stage 1 (``shard_grads=False``) or 2 (``shard_grads=True``) state of a module."""

    shard_grads = False
    traffic = "2Ψ"

    def __init__(self, module: nn.Module, comm: Comm, recorder=None, bucket_mb: float = 25.0,
                 reduce_dtype: torch.dtype | None = None):
        super().__init__(module, comm, recorder)
        self.precision = MixedPrecision(reduce_dtype=reduce_dtype).check_effect(module,
                                                                                self.strategy)
        shard_grads = self.shard_grads
        broadcast_module_states(module, comm)
        groups = split_into_buckets(grad_ready_order(module), int(bucket_mb * 2**20))
        self.buckets = [ZeroBucket(params, comm, full_grads=not shard_grads) for params in groups]
        self._known = {id(p) for b in groups for p in b}
        self._in_flight: list[Reduction] = []
        self._reduced = False  # ZeRO-1: gradients already reduce-scattered for this step
        self._owed = False  # ZeRO-2: a backward under no_sync kept unreduced gradients in p.grad
        self.watch = GradWatch(self.strategy, "each rank's own gradients, not yet averaged")
        if shard_grads:
            self.scheduler = BucketScheduler(groups, self._reduce_scatter_bucket, self._finish)
        else:
            self.scheduler = BucketScheduler(groups, lambda i: None, self._finish,
                                             on_grad=lambda i, j: self.buckets[i].adopt_grad(j))
            self.watch.remember(b.flat_grad for b in self.buckets)
        module.register_forward_pre_hook(
            TrainableCheck(module, self._known, self.strategy))
        if shard_grads:  # the stand-ins go before the next backward accumulates into p.grad
            self._names = {id(s.param): s.names[0] for s in param_slots(module)}
            module.register_forward_pre_hook(lambda *_: self._drop_stand_ins())
        module.register_forward_hook(lambda *_: self.mark(self.strategy, "forward_done"))

    def optimizer_params(self) -> list[nn.Parameter]:
        """What the optimizer updates: one piece per trainable parameter, in the module's order."""
        by_param = {id(p): piece for b in self.buckets
                    for p, piece in zip(b.params, b.pieces.params)}
        return [by_param[id(p)] for p in {id(p): p for p in self.module.parameters()}.values()
                if id(p) in by_param]

    def optimizer_param_ranges(self) -> list[tuple[torch.Tensor, PieceRange]]:
        """Each piece the optimizer updates, with the elements of its parameter it holds."""
        names = {id(s.param): tuple(s.names) for s in param_slots(self.module)}
        return [(piece, PieceRange(names[id(p)], lo, hi, tuple(p.shape)))
                for b in self.buckets
                for p, piece, (lo, hi) in zip(b.params, b.pieces.params, b.pieces.in_params())]

    # -- ZeRO-2: during backward ----------------------------------------------------------------

    def _reduce_scatter_bucket(self, i: int) -> None:
        if not self.sync_gradients:
            return  # no_sync: keep the full p.grad, accumulating; a later backward sends the sum
        self._collect_shard_grads()  # at most one bucket copy waits (see ddp._all_reduce_bucket)
        bucket = self.buckets[i]
        like = bucket.flat.new_empty(0, dtype=self.precision.reduce(bucket.flat.dtype))
        with torch.no_grad(), allocating("comm_buffers"):
            full, absent = bucket.layout.flatten_grads([p.grad for p in bucket.params], like)
        self._launch(i, full, absent)
        for p in bucket.params:  # the full gradients are no longer needed: freed
            if p.grad is not None:  # Note: a stand-in that says so (for torch's clip, above all)
                p.grad = GradientElsewhere(p, self._names[id(p)], self.strategy)
        self.mark(f"bucket{i}", "launched")

    def _collect_shard_grads(self) -> None:
        """Each rank keeps the averaged gradient of the shards it owns, in its pieces."""
        with torch.no_grad():
            for work in self._in_flight:
                bucket = self.buckets[work.target]
                mean = cast(work.mean(self.comm.world_size), bucket.flat.dtype, "grads")
                bucket.pieces.add_grads(mean, work.absent)
                work.free_sent()
        self._in_flight.clear()

    def _finish(self) -> None:
        """End of backward: ZeRO-2 collects the last buckets' shard gradients."""
        self._collect_shard_grads()
        self._owed = self.shard_grads and not self.sync_gradients
        if not self.shard_grads:
            self.watch.remember(b.flat_grad for b in self.buckets)
        self.mark(self.strategy, "backward_end")

    # -- ZeRO-1: at the optimizer step ----------------------------------------------------------

    def reduce_scatter_grads(self) -> None:
        """Every bucket's accumulated gradient, reduce-scattered into this rank's pieces."""
        self.watch.check()
        for i, bucket in enumerate(self.buckets):
            self._launch(i, bucket.flat_grad, bucket.full_grad_to_reduce())
        self._collect_shard_grads()
        self._reduced = True

    # -- both -----------------------------------------------------------------------------------

    def _launch(self, i: int, full: torch.Tensor, absent: list[int]) -> None:
        full = cast_grad(full, self.precision.reduce(full.dtype))  # zero1's fp32 buffer -> bf16
        with allocating("grads"):
            mine = torch.empty(self.buckets[i].layout.shard_numel, dtype=full.dtype,
                               device=full.device)
        handle = self.comm.reduce_scatter(mine, full, label=f"bucket{i}", async_op=True)
        owned = full is not self.buckets[i].flat_grad  # ZeRO-1's own buffer lives on
        self._in_flight.append(Reduction(i, full, mine, handle, absent, owned))

    def before_step(self) -> None:
        check_synced(self.strategy, self._owed)
        if not self.shard_grads and not self._reduced:
            self.reduce_scatter_grads()

    def after_step(self) -> None:
        """Every rank gets every bucket's updated parameters."""
        if not self.shard_grads:
            for b in self.buckets:  # ZeRO-1 keeps the full gradients, not a second copy
                b.pieces.zero_grad(set_to_none=True)
            self._reduced = False
            self.watch.remember(b.flat_grad for b in self.buckets)
        for i, bucket in enumerate(self.buckets):
            self.comm.all_gather(bucket.flat, bucket.shard, label=f"bucket{i}")
        self.mark(self.strategy, "step_end")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``model.zero_grad()`` and ``optimizer.zero_grad()`` both clear the pieces too."""
        self._owed = False
        self._drop_stand_ins()
        for b in self.buckets:
            b.pieces.zero_grad(set_to_none)
        if not self.shard_grads:
            self.watch.remember(b.flat_grad for b in self.buckets)

    def _drop_stand_ins(self) -> None:
        for b in self.buckets if self.shard_grads else ():
            for p in b.params:
                if isinstance(p.grad, GradientElsewhere):
                    p.grad = None

    def grads_for_norm(self) -> tuple[list[torch.Tensor], bool]:
        """The averaged gradients this rank owns (disjoint across ranks): its pieces'."""
        if not self.shard_grads and not self._reduced:
            self.reduce_scatter_grads()
        return [g for b in self.buckets for g in b.pieces.grads()], True

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        params = [p for p in self.module.parameters()]
        whole = [p.grad for p in params if not isinstance(p.grad, GradientElsewhere)]
        return {"params": [b.flat for b in self.buckets] + params,
                "grads": whole + [g for b in self.buckets
                                                     for g in b.pieces.grads()]
                + [b.flat_grad for b in self.buckets],
                "comm_buffers": [work.sent for work in self._in_flight
                                 if self.shard_grads]}  # ZeRO-1 sends its grad buffer itself

    def padded_numel(self) -> int:
        return sum(b.layout.padded_numel for b in self.buckets)

    def sent_bytes_per_step(self) -> float:
        grad_dtype = self.precision.reduce(self.buckets[0].flat.dtype)
        return zero_sent_bytes(self.padded_numel(), self.comm.world_size, self.element_size(),
                               reduce_bytes=grad_dtype.itemsize)


class Zero1(Zero):
    """ZeRO-1: the optimizer state is sharded; gradients are reduce-scattered at the step.

    ``fsdp_mini.no_sync`` changes nothing here: backward sends no gradient anyway, and however
    many micro-batches accumulate, ``optimizer.step()`` reduce-scatters their sum once."""

    strategy = "zero1"
    sharded = ("optim",)


class Zero2(Zero):
    """ZeRO-2: the gradients are sharded too, reduce-scattered while backward runs."""

    strategy = "zero2"
    sharded = ("grads", "optim")
    shard_grads = True
