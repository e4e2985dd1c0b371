"""Lab 04's scaffolding: the kit's own ZeRO (:class:`fsdp_mini.zero.Zero`, one bucket) with the
ZeRO part left to the learner: ``my_slice``, ``reduce_gradients`` and ``after_step``."""

from __future__ import annotations

import torch
from torch import nn

from ...comm.ledger import ring_bytes
from ...memory import allocating
from ...zero import Zero


class ZeroScaffold(Zero):
    """What ZeRO-1 and ZeRO-2 share, ready made: ``self.flat`` (every trainable parameter end to
    end in one 1-D buffer, padded with zeros to a multiple of N; the module's weights are views
    of it), ``self.shard = nn.Parameter(self.flat[start:stop])`` with ``(start, stop) =
    my_slice()`` (all the optimizer sees: its state has Ψ/N elements), and ``self.comm``.

    Once backward has made every gradient, ``reduce_gradients(flat_grad)`` gets this rank's own
    gradients laid out like ``self.flat`` (each ``p.grad`` moved in there, then set to None),
    where the kit's ZeRO-2 reduce-scatters them; the wrapped optimizer calls ``after_step()``
    after its update. Example, Ψ = 5, N = 2: ``flat = [a b c d e 0]``, rank 0 owns ``[a b c]``.
    """

    shard_grads = True               # the flat gradient is handed over as soon as it is complete
    grad_collective = "all_reduce"   # what reduce_gradients sends, for the formula

    def __init__(self, module: nn.Module, comm, recorder=None):
        super().__init__(module, comm, recorder, bucket_mb=2.0**40)
        (bucket,) = self.buckets
        self.flat, self.params, self.layout = bucket.flat, bucket.params, bucket.layout
        try:
            self.slice = start, stop = tuple(int(v) for v in self.my_slice())
        except (TypeError, ValueError):
            raise TypeError(f"my_slice must return (start, stop): {self.my_slice()!r}") from None
        self.shard = nn.Parameter(self.flat[start:stop])
        self._flat_grad, self.did = None, {}  # what reduce_gradients did (for the checker)

    def _reduce_scatter_bucket(self, i: int) -> None:
        with torch.no_grad(), allocating("comm_buffers"):
            flat_grad, _ = self.layout.flatten_grads([p.grad for p in self.params], self.flat)
        for p in self.params:
            p.grad = None
        self._flat_grad, version = flat_grad, self.flat._version
        self.mark(self.strategy, "grads_flattened")  # a comm buffer, not reduced yet
        try:
            with torch.no_grad():
                self.reduce_gradients(flat_grad)
            grad, ptr = self.shard.grad, flat_grad.untyped_storage().data_ptr()
            self.did = {"wrote into self.flat (the weights)": self.flat._version != version,
                        "left self.shard.grad a view of flat_grad": grad is not None
                        and grad.untyped_storage().data_ptr() == ptr}
        finally:
            self._flat_grad = None

    def my_slice(self): ...  # yours, and the two below

    def reduce_gradients(self, flat_grad: torch.Tensor) -> None: ...

    def after_step(self) -> None: ...

    def optimizer_params(self) -> list[nn.Parameter]:
        return [self.shard]

    def grads_for_norm(self):
        return [g for g in (self.shard.grad,) if g is not None], True

    def memory_categories(self) -> dict[str, list]:  # Note: a storage in two lists: the last
        return {"params": [self.flat], "comm_buffers": [self._flat_grad],
                "grads": [self.shard.grad] + [p.grad for p in self.params]}

    def sent_bytes_per_step(self) -> float:
        payload, n = self.layout.padded_numel * self.element_size(), self.comm.world_size
        return ring_bytes(self.grad_collective, payload, n) + ring_bytes("all_gather", payload, n)
