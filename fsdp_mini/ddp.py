"""DDP: every rank holds the whole model; gradients are averaged with all-reduce.

Per rank, fp32 with Adam: params 4Ψ + grads 4Ψ + Adam moments 8Ψ = 16Ψ bytes, whatever N is.
Traffic per step: one all-reduce of all gradients, 2(N-1)/N x 4Ψ bytes sent per rank.

Example, N = 2, one bucket with a 2-element gradient::

    after backward:     rank0 grad [1 2]        rank1 grad [3 4]      (local batch halves)
    all-reduce (sum):   rank0      [4 6]        rank1      [4 6]
    divide by N:        rank0      [2 3]        rank1      [2 3]      = gradient of the whole batch

Gradients are all-reduced in buckets launched from gradient-ready hooks, so communication of the
last layers overlaps with backward of the first ones (see :mod:`fsdp_mini.buckets`).
"""

from __future__ import annotations

import torch
from torch import nn

from .buckets import BucketScheduler, grad_or_zeros, grad_ready_order, split_into_buckets
from .comm import Comm, Handle
from .memory import allocating


def broadcast_module_states(module: nn.Module, comm: Comm) -> None:
    """Make every rank start from rank 0's parameters and buffers."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            comm.broadcast(t.data, label=f"sync/{name}")


class DDP:
    """The state DDP adds to a module: buckets, their hooks and the in-flight all-reduces."""

    strategy = "ddp"

    def __init__(self, module: nn.Module, comm: Comm, bucket_mb: float = 25.0, recorder=None):
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        self.module, self.comm, self.recorder = module, comm, recorder
        broadcast_module_states(module, comm)
        self.buckets = split_into_buckets(grad_ready_order(module), int(bucket_mb * 2**20))
        self._in_flight: list[tuple[int, torch.Tensor, Handle]] = []
        self.scheduler = BucketScheduler(self.buckets, self._all_reduce_bucket, self._finish)
        module.register_forward_hook(lambda *_: self._mark("ddp/forward_done"))

    def _mark(self, label: str) -> None:
        if self.recorder is not None:
            self.recorder.mark(label)

    def _all_reduce_bucket(self, i: int) -> None:
        # Note: the previous bucket's all-reduce overlapped with the backward that filled this
        # one; finishing it now keeps at most one bucket copy waiting, not the whole model.
        self._collect()
        with allocating("comm_buffers"), torch.no_grad():
            flat = torch.cat([grad_or_zeros(p).reshape(-1) for p in self.buckets[i]])
        handle = self.comm.all_reduce(flat, label=f"bucket{i}", async_op=True)
        self._in_flight.append((i, flat, handle))
        self._mark(f"bucket{i}/launched")

    def _collect(self) -> None:
        """Wait for the buckets in flight and write their averaged gradients back."""
        with torch.no_grad():
            for i, flat, handle in self._in_flight:
                handle.wait()
                flat.div_(self.comm.world_size)
                for p, g in zip(self.buckets[i], _split_like(flat, self.buckets[i])):
                    if p.grad is None:
                        with allocating("grads"):
                            p.grad = g.clone()
                    else:
                        p.grad.copy_(g)
        self._in_flight.clear()

    def _finish(self) -> None:
        """End of backward: every parameter now holds the gradient of the whole global batch."""
        self._collect()
        self._mark("ddp/backward_end")

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        params = list(self.module.parameters())
        return {"params": params, "grads": [p.grad for p in params],
                "comm_buffers": [flat for _, flat, _ in self._in_flight]}


def _split_like(flat: torch.Tensor, params: list[nn.Parameter]) -> list[torch.Tensor]:
    return [g.view_as(p) for g, p in zip(flat.split([p.numel() for p in params]), params)]
