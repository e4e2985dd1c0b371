"""DDP: every rank holds the whole model; gradients are averaged with all-reduce.

Per rank, fp32 with Adam: params 4Ψ + grads 4Ψ + Adam moments 8Ψ = 16Ψ bytes, whatever N is.
Traffic per step: one all-reduce of all gradients, 2(N-1)/N x 4Ψ bytes sent per rank.

Example, N = 2, one bucket with a 2-element gradient::

    after backward:     rank0 grad [1 2]        rank1 grad [3 4]      (local batch halves)
    all-reduce (sum):   rank0      [4 6]        rank1      [4 6]
    divide by N:        rank0      [2 3]        rank1      [2 3]      = gradient of the whole batch

Gradients are all-reduced in buckets launched from gradient-ready hooks, so communication of the
last layers overlaps with backward of the first ones (see :mod:`fsdp_mini.buffers.buckets`). Under
``fsdp_mini.no_sync`` no bucket is launched: ``p.grad`` accumulates on the rank, and the next
backward outside it all-reduces the sum (see :mod:`fsdp_mini.buffers.accumulate`).

Mixed precision (:mod:`fsdp_mini.precision.policy`): ``reduce_dtype=torch.bfloat16`` flattens each
bucket's gradients into a bf16 buffer, all-reduces it (2(N-1)/N x 2Ψ bytes: half) and writes the
mean back into the fp32 ``p.grad``. There is no ``param_dtype``: every rank keeps whole fp32
parameters, so nothing is gathered; compute in bf16 with ``torch.autocast`` around the forward.
"""

from __future__ import annotations

import torch
from torch import nn

from .buffers.absent import absent_everywhere
from .buffers.accumulate import check_synced
from .buffers.buckets import BucketScheduler, TrainableCheck, grad_ready_order, split_into_buckets
from .buffers.flat import FlatLayout, ParamSlot
from .comm.collectives import Comm, Reduction, broadcast_module_states
from .memory import allocating
from .precision.policy import MixedPrecision
from .strategy import Strategy
from .theory import ddp_sent_bytes


class DDP(Strategy):
    """The state DDP adds to a module: buckets, their hooks and the in-flight all-reduces."""

    strategy = "ddp"
    traffic = "2Ψ"

    def __init__(self, module: nn.Module, comm: Comm, recorder=None, bucket_mb: float = 25.0,
                 reduce_dtype: torch.dtype | None = None):
        super().__init__(module, comm, recorder)
        self.precision = MixedPrecision(reduce_dtype=reduce_dtype).check_effect(module, "ddp")
        broadcast_module_states(module, comm)
        self.buckets = split_into_buckets(grad_ready_order(module), int(bucket_mb * 2**20))
        # Note: a bucket is laid out like a flat buffer of world size 1: end to end, no padding.
        self.layouts = [FlatLayout([ParamSlot(p, [], []) for p in b], 1) for b in self.buckets]
        self._known = {id(p) for b in self.buckets for p in b}
        self._in_flight: list[Reduction] = []
        self._owed = False  # a backward under no_sync left unreduced gradients in p.grad
        self.scheduler = BucketScheduler(self.buckets, self._all_reduce_bucket, self._finish)
        module.register_forward_pre_hook(
            TrainableCheck(module, self._known, "ddp"))
        module.register_forward_hook(lambda *_: self.mark("ddp", "forward_done"))

    def _all_reduce_bucket(self, i: int) -> None:
        if not self.sync_gradients:
            return  # no_sync: autograd keeps adding into p.grad; a later backward sends the sum
        # Note: the previous bucket's all-reduce overlapped with the backward that filled this
        # one; finishing it now keeps at most one bucket copy waiting, not the whole model.
        self._collect()
        params = self.buckets[i]
        like = params[0].new_empty(0, dtype=self.precision.reduce(params[0].dtype))
        with allocating("comm_buffers"), torch.no_grad():
            flat, absent = self.layouts[i].flatten_grads([p.grad for p in params], like)
        handle = self.comm.all_reduce(flat, label=f"bucket{i}", async_op=True)
        self._in_flight.append(Reduction(i, flat, flat, handle, absent))
        self.mark(f"bucket{i}", "launched")

    def _collect(self) -> None:
        """Wait for the buckets in flight and write their averaged gradients back."""
        with torch.no_grad():
            for work in self._in_flight:
                work.handle.wait()
                flat, n = work.result, self.comm.world_size  # the sum over ranks
                layout, params = self.layouts[work.target], self.buckets[work.target]
                starts = [layout.slots[j].offset for j in work.absent]
                gone = {j for j, g in zip(work.absent, absent_everywhere(flat, starts)) if g}
                for j, (p, g) in enumerate(zip(params, layout.views(flat))):
                    if j in gone:
                        continue  # no rank had a gradient for it: it stays None, as in torch
                    # Note: the division by N is done while copying back: one pass, not two
                    if p.grad is None:
                        with allocating("grads"):
                            p.grad = torch.div(g, n).to(p.dtype)  # fp32 from reduce_dtype
                    else:
                        torch.div(g, n, out=p.grad)
                work.free_sent()  # the averages are in p.grad: the bucket copy goes now
        self._in_flight.clear()

    def _finish(self) -> None:
        """End of backward: every parameter now holds the gradient of the whole global batch."""
        self._collect()
        self._owed = not self.sync_gradients
        self.mark("ddp", "backward_end")

    def before_step(self) -> None:
        check_synced("ddp", self._owed)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._owed = False

    def sent_bytes_per_step(self) -> float:
        grad_dtype = self.precision.reduce(self.buckets[0][0].dtype)
        return ddp_sent_bytes(self.numel()[0], self.comm.world_size, grad_dtype.itemsize)

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        return {**super().memory_categories(),
                "comm_buffers": [work.sent for work in self._in_flight]}
