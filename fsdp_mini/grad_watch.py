"""Notice gradients changed in place between the end of backward and ``optimizer.step()``.

The usual culprit is ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``. Under
zero1 ``model.parameters()`` hold each rank's own, not yet averaged gradients; under fsdp they are
this rank's shards. Either way the norm torch computes is one rank's, so every rank clips by a
different factor (or not at all) and training silently differs from a single process. The
strategies remember the version counters of the gradients they hand over and check them at the
step; a change raises this error instead of a wrong number.
"""

from __future__ import annotations

import torch


class GradientsChangedError(RuntimeError):
    """Gradients were modified in place after backward where the kit cannot make that right."""


class GradWatch:
    def __init__(self, strategy: str, what: str):
        self.strategy, self.what = strategy, what
        self._seen: list[tuple[torch.Tensor, int]] = []

    def remember(self, tensors) -> None:
        """These gradients are as the kit left them."""
        self._seen = [(t, t._version) for t in tensors if t is not None]

    def check(self) -> None:
        if any(t._version != version for t, version in self._seen):
            raise GradientsChangedError(
                f"{self.strategy}: gradients were changed in place after backward(), before "
                f"optimizer.step(): usually torch.nn.utils.clip_grad_norm_(model.parameters(), "
                f"...). Under {self.strategy} they are {self.what}, so a norm computed from them "
                f"is this rank's alone and each rank would clip differently. Use "
                f"fsdp_mini.clip_grad_norm_(model, max_norm), which computes the norm over every "
                f"rank. To scale gradients, scale the loss before backward() instead.")
