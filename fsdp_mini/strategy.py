"""What every strategy offers the rest of the kit, with the defaults of plain data parallelism.

A strategy is a class. ``parallelize(module, "name", **options)`` builds it as
``Strategy(module, comm, recorder=..., **options)``: it changes the module in place (hooks, flat
buffers) and then answers the questions of the optimizer, the memory tracker, the formulas and
the clipping code, through the methods below. Its keyword options are those of its
``__init__``. To add a strategy, subclass :class:`Strategy` in a module of its own and register
it (the kit's own are listed in :mod:`fsdp_mini.registry`)::

    class NaiveDDP(fsdp_mini.Strategy):
        strategy = "naive_ddp"                     # the name parallelize() takes
        def __init__(self, module, comm, recorder=None):
            super().__init__(module, comm, recorder)
            ...                                     # hooks that all-reduce each gradient
    fsdp_mini.register_strategy(NaiveDDP)
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from . import theory
from .buffers.flat import param_slots
from .comm.collectives import Comm


@dataclass(frozen=True)
class PieceRange:
    """Which part of an original parameter a tensor holds: elements ``[lo, hi)`` of it,
    flattened. Example: rank 1 of 2 holds ``fc.weight`` (2x3) from 3 to 6, i.e.
    ``PieceRange(("fc.weight",), 3, 6, (2, 3))``. Tied weights have several names."""

    names: tuple[str, ...]
    lo: int
    hi: int
    shape: tuple[int, ...]


class Mark(str):
    """A phase boundary for memory timelines: reads as ``"unit/phase"`` (any ``mark(label)``
    accepts it), and carries ``unit`` and ``phase`` as fields for whoever wants them."""

    def __new__(cls, unit: str, phase: str) -> "Mark":
        mark = super().__new__(cls, f"{unit}/{phase}" if unit else phase)
        mark.unit, mark.phase = unit, phase
        return mark


class Strategy:
    """Defaults: every rank holds whole parameters and whole gradients (single, ddp)."""

    strategy = "?"                    # the name ``parallelize`` takes
    sharded: tuple[str, ...] = ()     # which parts of the model state it splits over the ranks
    traffic = "0"                     # what one step sends, for people: "2Ψ" (times 4(N−1)/N)
    sync_gradients = True             # False inside ``fsdp_mini.no_sync`` (set_gradient_sync)

    def __init__(self, module: nn.Module, comm: Comm, recorder=None):
        self.module, self.comm, self.recorder = module, comm, recorder
        self.step_listeners: list = []  # called with no argument once a whole step is done

    @classmethod
    def options(cls) -> set[str]:
        """The keyword options ``parallelize`` accepts for this strategy."""
        params = inspect.signature(cls.__init__).parameters
        return {name for name, p in params.items()
                if name not in ("self", "module", "comm", "recorder", "units", "meta_init")
                and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def mark(self, unit: str, phase: str) -> None:
        """Tell the recorder (a telemetry Recorder, a memory tracker...) a phase boundary."""
        if self.recorder is not None:
            self.recorder.mark(Mark(unit, phase))

    # -- around the optimizer (called by the parallelized optimizer and model) ------------------

    def optimizer_params(self) -> list[nn.Parameter]:
        """What the optimizer factory is called with."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def set_gradient_sync(self, enabled: bool) -> None:
        """``fsdp_mini.no_sync`` calls this with False on entry and restores the value on exit:
        while False, a backward only accumulates gradients on this rank (no collective), and the
        next backward with True communicates their sum. The default only remembers it in
        ``sync_gradients``: enough where backward sends nothing (single, zero1), and harmless
        where a strategy ignores it (its backward then simply communicates every time)."""
        self.sync_gradients = enabled

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
        """``fsdp_mini.clip_grad_norm_`` (or ``ShardedGradScaler.unscale_``) has scaled the
        gradients in place."""

    # -- what it holds, and what the formulas say it should --------------------------------------

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        params = list(self.module.parameters())
        return {"params": params, "grads": [p.grad for p in params]}

    def full_state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """The whole tensors under the module's ``state_dict()`` keys (collective if sharded)."""
        return OrderedDict((k, v.detach().clone()) for k, v in self.module.state_dict().items())

    def param_pieces(self) -> list[tuple[torch.Tensor, PieceRange]]:
        """Every parameter tensor this rank holds (trainable or frozen), with the part of the
        original parameter it is (see :mod:`fsdp_mini.checkpoint.save_load`). Default: whole
        parameters, ``(w, PieceRange(("fc.weight",), 0, 6, (2, 3)))``; fsdp returns its 1-D
        pieces."""
        return [(s.param, PieceRange(tuple(s.names), 0, s.numel, tuple(s.shape)))
                for s in param_slots(self.module)]

    def optimizer_param_ranges(self) -> list[tuple[torch.Tensor, PieceRange]]:
        """Each tensor the optimizer updates, with the part of an original parameter it is.
        Default: the module's own tensors (``param_pieces``); zero returns its bucket pieces."""
        return self.param_pieces()

    def numel(self) -> tuple[int, int]:
        """Elements of the original model: (trainable, frozen), each parameter counted once."""
        params = {id(p): p for p in self.module.parameters()}.values()
        return (sum(p.numel() for p in params if p.requires_grad),
                sum(p.numel() for p in params if not p.requires_grad))

    def padded_numel(self) -> int:
        """Trainable elements as laid out for communication (padded to a multiple of N)."""
        return self.numel()[0]

    def padded_frozen_numel(self) -> int:
        return self.numel()[1]

    def element_size(self) -> int:
        return next(iter(self.module.parameters())).element_size()

    def sent_bytes_per_step(self) -> float:
        return 0.0

    def expected_costs(self, optim_bytes: int | None = None) -> dict[str, float]:
        """What the formulas predict for this rank: bytes sent per step, model-state bytes kept
        between steps (Adam's two moments unless ``optim_bytes`` says otherwise)."""
        trainable, frozen = self.numel()
        sizes = theory.StateBytes.adam(self.element_size(), optim_bytes)
        return {"sent_bytes_per_step": self.sent_bytes_per_step(),
                "persistent_bytes": theory.persistent_bytes(
                    self.sharded, trainable, self.comm.world_size, self.padded_numel(),
                    self.padded_frozen_numel(), sizes)}

    @classmethod
    def formulas(cls, element_size: int = 4) -> dict[str, str]:
        """The formulas as a person writes them, for the dashboard."""
        sizes = theory.StateBytes.adam(element_size)
        sent = "0" if cls.traffic == "0" else f"{cls.traffic}·{element_size}(N−1)/N"
        return {"memory": theory.memory_formula(cls.sharded, sizes), "sent": sent}


class Single(Strategy):
    """No parallelism: the reference every strategy must reproduce."""

    strategy = "single"
