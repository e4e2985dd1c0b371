"""Lab 04's scaffolding: what ZeRO-1 and ZeRO-2 share, ready made (the flat buffer, the
optimizer's slice, the hook at the end of backward), so that the learner writes only the ZeRO
part: ``my_slice``, ``reduce_gradients`` and ``after_step``."""

from __future__ import annotations

import torch
from torch import nn

from ...buffers.buckets import BucketScheduler
from ...buffers.flat import FlatLayout, ParamSlot
from ...comm.collectives import broadcast_module_states
from ...comm.ledger import ring_bytes
from ...memory import allocating
from ...strategy import Strategy

__all__ = ["ZeroScaffold"]


class ZeroScaffold(Strategy):
    """What ZeRO-1 and ZeRO-2 share, ready made, so that you write only the ZeRO part.

    ``self.flat``   every trainable parameter end to end in one 1-D buffer, padded with zeros to
                    a multiple of N (the same on every rank); the module's weights are views of it
    ``self.shard``  ``nn.Parameter(self.flat[start:stop])`` with ``(start, stop) = my_slice()``:
                    all the optimizer sees, so its state has Ψ/N elements
    ``self.comm``   ``all_reduce``, ``reduce_scatter``, ``all_gather``, each in the ledger

    At the end of each backward, ``reduce_gradients(flat_grad)`` gets this rank's own gradients
    laid out like ``self.flat`` (each ``p.grad`` is moved in there and set to None); the wrapped
    optimizer calls ``after_step()`` after its update. Example, Ψ = 5, N = 2:
    ``flat = [a b c d e 0]``, rank 0 owns ``[a b c]``, rank 1 owns ``[d e 0]``.
    Note: one backward per step (no gradient accumulation), to keep the lab's code short.
    """

    grad_collective = "all_reduce"  # what reduce_gradients sends, for the formula

    def __init__(self, module: nn.Module, comm, recorder=None):
        super().__init__(module, comm, recorder)
        broadcast_module_states(module, comm)
        self.params = list({id(p): p for p in module.parameters() if p.requires_grad}.values())
        self.layout = FlatLayout([ParamSlot(p, [], []) for p in self.params], comm.world_size)
        with torch.no_grad(), allocating("params"):
            self.flat = self.layout.flatten([p.detach() for p in self.params])
        for p, view in zip(self.params, self.layout.views(self.flat)):
            p.data = view  # the module's weights now live inside the flat buffer
        start, stop = _as_range(self.my_slice())
        self.shard = nn.Parameter(self.flat[start:stop])
        self.scheduler = BucketScheduler([self.params], lambda i: None, self._backward_end)
        self._grad_buffer = None  # the flat gradient, while backward ends
        self.grad_was_view = False  # self.shard.grad shared flat_grad's storage (for the checker)
        self.watched = None  # the checker sets a list: what reduce_gradients changed, per step
        # Note: phase marks, as in the kit's strategies: a dashboard samples memory there, so it
        # sees the activations (after forward) and the flat gradient (a comm buffer) before the
        # reduction.
        module.register_forward_hook(lambda *_: self.mark(self.strategy, "forward_done"))

    def _backward_end(self) -> None:
        try:
            with torch.no_grad():
                with allocating("comm_buffers"):
                    self._grad_buffer = flat_grad = torch.zeros_like(self.flat)
                for p, view in zip(self.params, self.layout.views(flat_grad)):
                    if p.grad is not None:
                        view.copy_(p.grad)
                        p.grad = None
                self.mark(self.strategy, "grads_flattened")  # a comm buffer, not reduced yet
                if self.watched is not None:  # Note: the checker's run only
                    self._watch_reduce(flat_grad)
                else:
                    self.reduce_gradients(flat_grad)
                grad = self.shard.grad
                self.grad_was_view = grad is not None and (
                    grad.untyped_storage().data_ptr() == flat_grad.untyped_storage().data_ptr())
        finally:
            self._grad_buffer = None
        self.mark(self.strategy, "backward_end")

    def _watch_reduce(self, flat_grad: torch.Tensor) -> None:
        """``reduce_gradients``, noting which storages its all-reduces reduced (for the checker)."""
        comm, reduced = self.comm, []
        real = comm.all_reduce

        def all_reduce(tensor, *args, **kwargs):
            reduced.append(tensor.untyped_storage().data_ptr())
            return real(tensor, *args, **kwargs)
        comm.all_reduce = all_reduce
        try:
            self.reduce_gradients(flat_grad)
        finally:
            del comm.all_reduce
        self.watched.append(("weights" if self.flat.untyped_storage().data_ptr() in reduced
                             else "grads" if reduced else None))

    def my_slice(self):
        raise NotImplementedError("write my_slice in your subclass")

    def reduce_gradients(self, flat_grad: torch.Tensor) -> None:
        raise NotImplementedError("write reduce_gradients in your subclass")

    def optimizer_params(self) -> list[nn.Parameter]:
        return [self.shard]

    def grads_for_norm(self):
        return [g for g in (self.shard.grad,) if g is not None], True

    def memory_categories(self) -> dict[str, list]:
        grads = [self.shard.grad] + [p.grad for p in self.params]
        kept = {g.untyped_storage().data_ptr() for g in grads if g is not None}
        buffer = self._grad_buffer  # a comm buffer, unless it now holds the gradient kept (ZeRO-1)
        if buffer is not None and buffer.untyped_storage().data_ptr() in kept:
            buffer = None
        return {"params": [self.flat], "grads": grads, "comm_buffers": [buffer]}

    def padded_numel(self) -> int:
        return self.layout.padded_numel

    def sent_bytes_per_step(self) -> float:
        payload, n = self.layout.padded_numel * self.element_size(), self.comm.world_size
        return ring_bytes(self.grad_collective, payload, n) + ring_bytes("all_gather", payload, n)


def _as_range(value) -> tuple[int, int]:
    try:
        start, stop = (int(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"my_slice must return two integers (start, stop), got {value!r}") from None
    return start, stop
