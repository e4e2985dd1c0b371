"""What ``parallelize`` turns the user's module and optimizer into: the same objects, with a class
that also tells the strategy about ``zero_grad`` and ``step``.

A parallelized model is still an instance of its own class (``isinstance(model, GPT)`` holds) and
its optimizer still an instance of, say, ``torch.optim.AdamW`` (learning-rate schedulers accept
it). Both get a small subclass made on the fly, in the way FSDP2's ``fully_shard`` makes
``FSDPGPT``, so that plain-torch habits keep working:

* ``model.zero_grad()`` clears every gradient the optimizer will use, including ZeRO-2's
  gradient shards, which are not the module's parameters;
* ``optimizer.zero_grad()`` clears the module's gradients too (ZeRO keeps them apart);
* ``optimizer.step()`` lets the strategy act before (ZeRO-1's reduce-scatter) and after
  (ZeRO's all-gather of the updated parameters), and counts the step for the ledger.
"""

from __future__ import annotations

import torch
from torch import nn

_CLASSES: dict[tuple[type, type], type] = {}


class ParallelModule:
    """Mixed into a parallelized module's class; ``self.fsdp_mini`` is the strategy."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.fsdp_mini.zero_grad(set_to_none)

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        """The strategy's tensors by memory category (see :mod:`fsdp_mini.memory`)."""
        return self.fsdp_mini.memory_categories()


class ParallelOptimizer:
    """Mixed into the optimizer's class; ``self.fsdp_mini`` is the strategy of its model."""

    def step(self, closure=None):
        engine = self.fsdp_mini
        engine.before_step()
        loss = super().step(closure)
        engine.after_step()
        engine.comm.ledger.step_done()
        for listener in engine.step_listeners:  # e.g. telemetry: the state is whole now
            listener()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.fsdp_mini.module.zero_grad(set_to_none)


def _subclass(mixin: type, cls: type) -> type:
    if (mixin, cls) not in _CLASSES:
        _CLASSES[(mixin, cls)] = type(f"Parallel{cls.__name__}", (mixin, cls), {})
    return _CLASSES[(mixin, cls)]


def make_parallel(module: nn.Module, optimizer: torch.optim.Optimizer, engine) -> None:
    """Give ``module`` and ``optimizer`` their parallel classes, in place."""
    # Note: object.__setattr__, so nn.Module does not try to register the strategy as a child.
    object.__setattr__(module, "fsdp_mini", engine)
    module.__class__ = _subclass(ParallelModule, type(module))
    optimizer.fsdp_mini = engine
    optimizer.__class__ = _subclass(ParallelOptimizer, type(optimizer))
