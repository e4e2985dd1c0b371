"""ZeRO-1 and ZeRO-2: shard the optimizer state (and the gradients), keep full parameters.

Trainable parameters are packed into flat buckets, each padded to a multiple of N and split into N
shards. Rank r *owns* shard r of every bucket: only it keeps optimizer state for those elements
and only it updates them.

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
"""

from __future__ import annotations

import torch
from torch import nn

from .buckets import BucketScheduler, grad_or_zeros, grad_ready_order, split_into_buckets
from .comm import Comm, Handle
from .ddp import broadcast_module_states
from .flat import FlatLayout, ParamSlot
from .memory import allocating


class ZeroBucket:
    """A flat, padded buffer holding some parameters, and this rank's shard of it. With
    ``flat_grad``, the parameters' gradients live in a second flat buffer of the same layout."""

    def __init__(self, params: list[nn.Parameter], comm: Comm, flat_grad: bool):
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
        self.shard = nn.Parameter(self.flat[start:end])  # shares storage with the bucket
        self.flat_grad = None
        if flat_grad:
            with allocating("grads"):
                self.flat_grad = torch.zeros_like(self.flat)
            self.adopt_grads()

    def adopt_grads(self) -> None:
        """Make every ``p.grad`` a view of ``flat_grad`` (autograd then accumulates in place).
        A gradient someone replaced (``model.zero_grad()`` sets them to None) is copied back."""
        with torch.no_grad():
            for p, view in zip(self.params, self.layout.views(self.flat_grad)):
                if p.grad is None:
                    view.zero_()
                elif p.grad.data_ptr() != view.data_ptr():
                    view.copy_(p.grad)
                p.grad = view


class Zero:
    """ZeRO stage 1 (``shard_grads=False``) or 2 (``shard_grads=True``) state of a module."""

    def __init__(self, module: nn.Module, comm: Comm, shard_grads: bool, bucket_mb: float = 25.0,
                 recorder=None):
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        self.module, self.comm, self.recorder = module, comm, recorder
        self.shard_grads = shard_grads
        self.strategy = "zero2" if shard_grads else "zero1"
        broadcast_module_states(module, comm)
        groups = split_into_buckets(grad_ready_order(module), int(bucket_mb * 2**20))
        self.buckets = [ZeroBucket(params, comm, flat_grad=not shard_grads) for params in groups]
        self._in_flight: dict[int, tuple[torch.Tensor, torch.Tensor, Handle]] = {}
        if shard_grads:
            self.scheduler = BucketScheduler(groups, self._reduce_scatter_bucket, self._finish)
        module.register_forward_hook(lambda *_: self.mark(f"{self.strategy}/forward_done"))

    def mark(self, label: str) -> None:
        if self.recorder is not None:
            self.recorder.mark(label)

    # -- ZeRO-2: during backward ----------------------------------------------------------------

    def _reduce_scatter_bucket(self, i: int) -> None:
        self._collect_shard_grads()  # at most one bucket copy waits (see ddp._all_reduce_bucket)
        bucket = self.buckets[i]
        with torch.no_grad(), allocating("comm_buffers"):
            full = bucket.layout.flatten([grad_or_zeros(p) for p in bucket.params])
        self._launch(i, full)
        for p in bucket.params:  # the full gradients are no longer needed
            p.grad = None
        self.mark(f"bucket{i}/launched")

    def _collect_shard_grads(self) -> None:
        """Each rank keeps the averaged gradient of the shards it owns."""
        for i, mine in self._wait_all():
            shard = self.buckets[i].shard
            if shard.grad is None:
                shard.grad = mine
            else:
                shard.grad.add_(mine)  # gradient accumulation over micro-batches

    def _finish(self) -> None:
        """End of backward: the last buckets' shard gradients."""
        self._collect_shard_grads()
        self.mark(f"{self.strategy}/backward_end")

    # -- ZeRO-1: at the optimizer step ----------------------------------------------------------

    def reduce_scatter_grads(self) -> None:
        """Every bucket's accumulated gradient, reduce-scattered: shard.grad = this rank's part."""
        for i, bucket in enumerate(self.buckets):
            bucket.adopt_grads()
            self._launch(i, bucket.flat_grad)
        for i, mine in self._wait_all():
            self.buckets[i].shard.grad = mine

    # -- both -----------------------------------------------------------------------------------

    def _launch(self, i: int, full: torch.Tensor) -> None:
        with allocating("grads"):
            mine = torch.empty(self.buckets[i].layout.shard_numel, dtype=full.dtype,
                               device=full.device)
        handle = self.comm.reduce_scatter(mine, full, label=f"bucket{i}", async_op=True)
        self._in_flight[i] = (full, mine, handle)

    def _wait_all(self):
        for i, (_, mine, handle) in sorted(self._in_flight.items()):
            handle.wait()
            yield i, mine.div_(self.comm.world_size)
        self._in_flight.clear()

    def all_gather_params(self) -> None:
        """After the step: every rank gets every bucket's updated parameters."""
        for i, bucket in enumerate(self.buckets):
            self.comm.all_gather(bucket.flat, bucket.shard.detach(), label=f"bucket{i}")

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        params = [p for p in self.module.parameters()]
        return {"params": [b.flat for b in self.buckets] + params,
                "grads": [p.grad for p in params] + [b.shard.grad for b in self.buckets]
                + [b.flat_grad for b in self.buckets],
                "comm_buffers": [full for full, _, _ in self._in_flight.values()
                                 if self.shard_grads]}  # ZeRO-1 sends its grad buffer itself

    def padded_numel(self) -> int:
        return sum(b.layout.padded_numel for b in self.buckets)


class ShardedOptimizer:
    """A torch optimizer over this rank's shards, followed by an all-gather of the parameters.

    Used exactly like the optimizer it wraps: ``step()``, ``zero_grad()``, ``param_groups``,
    ``state_dict()`` (this rank's shard of the state).
    """

    def __init__(self, zero: Zero, optimizer: torch.optim.Optimizer):
        self.zero, self.optimizer = zero, optimizer

    @torch.no_grad()
    def step(self, closure=None):
        if not self.zero.shard_grads:
            self.zero.reduce_scatter_grads()
        loss = self.optimizer.step(closure)
        if not self.zero.shard_grads:
            for b in self.zero.buckets:
                b.shard.grad = None  # ZeRO-1 keeps the full gradients, not a second copy
        self.zero.all_gather_params()
        self.zero.mark(f"{self.zero.strategy}/step_end")
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. ZeRO-1's live in a flat buffer, which is zeroed, not freed."""
        self.optimizer.zero_grad(set_to_none)
        for b in self.zero.buckets:
            if b.flat_grad is not None:
                b.flat_grad.zero_()
            else:
                for p in b.params:
                    p.grad = None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        return {"optimizer_state": [v for s in self.optimizer.state.values()
                                    for v in s.values() if isinstance(v, torch.Tensor)]}

    def __repr__(self) -> str:
        return f"ShardedOptimizer({self.zero.strategy}, {self.optimizer!r})"

