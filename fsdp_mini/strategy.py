"""What every strategy offers the rest of the kit, with the defaults of plain data parallelism.

A strategy is built as ``Strategy(module, comm, **options)`` by ``parallelize``; it changes the
module in place (hooks, flat buffers) and then answers these questions for the optimizer, the
memory tracker, the formulas and the clipping code. ``Single`` is the reference: no parallelism.
"""

from __future__ import annotations

import torch
from torch import nn

from .comm import Comm


class Strategy:
    """Defaults: every rank holds whole parameters and whole gradients (single, ddp)."""

    strategy = "?"

    def __init__(self, module: nn.Module, comm: Comm):
        self.module, self.comm = module, comm

    def optimizer_params(self) -> list[nn.Parameter]:
        """What the optimizer factory is called with."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def before_step(self) -> None:
        """Called by ``optimizer.step()`` before the update."""

    def after_step(self) -> None:
        """Called by ``optimizer.step()`` after the update."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Called by ``model.zero_grad()`` and ``optimizer.zero_grad()``, after torch's own."""

    def grads_for_norm(self) -> tuple[list[torch.Tensor], bool]:
        """The gradients to clip, and whether they are disjoint shards (the norm then sums over
        ranks) rather than whole copies, the same on every rank."""
        return [p.grad for p in self.module.parameters() if p.grad is not None], False

    def after_clip(self) -> None:
        """``fsdp_mini.clip_grad_norm_`` has scaled the gradients."""

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        params = list(self.module.parameters())
        return {"params": params, "grads": [p.grad for p in params]}


class Single(Strategy):
    """No parallelism: the reference every strategy must reproduce."""

    strategy = "single"
