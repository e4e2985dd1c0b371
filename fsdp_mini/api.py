"""One entry point for every strategy: ``parallelize(module, strategy, optimizer=...)``.

    model, optimizer = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                             optimizer=partial(torch.optim.AdamW, lr=1e-3))
    loss = model(x, y)[1]; loss.backward(); optimizer.step(); optimizer.zero_grad()

The module is changed in place (hooks, flat buffers) and returned; ``model.fsdp_mini`` holds the
strategy's state: its ``comm`` (with the ``ledger`` of collectives), buckets or units.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial

import torch
from torch import nn

from . import theory
from .comm import Comm, Ledger
from .ddp import DDP
from .fsdp import FSDP
from .zero import ShardedOptimizer, Zero

STRATEGIES = theory.STRATEGIES
_OPTIONS = {"single": set(), "ddp": {"bucket_mb"}, "zero1": {"bucket_mb"},
            "zero2": {"bucket_mb"}, "fsdp": {"reshard_after_forward"}}


class Single:
    """No parallelism: the reference every strategy must reproduce."""

    strategy = "single"

    def __init__(self, module: nn.Module, comm: Comm):
        self.module, self.comm = module, comm

    def memory_categories(self):
        params = list(self.module.parameters())
        return {"params": params, "grads": [p.grad for p in params]}


def parallelize(module: nn.Module, strategy: str, optimizer=partial(torch.optim.AdamW, lr=1e-3),
                units=None, *, process_group=None, ledger: Ledger | None = None, recorder=None,
                check_collectives: bool = False, **options):
    """Apply ``strategy`` to ``module``; return ``(module, optimizer)``, used like plain torch.

    Args:
        strategy: "single", "ddp", "zero1", "zero2" or "fsdp".
        optimizer: a factory called with the parameters this rank must optimise, e.g.
            ``partial(torch.optim.SGD, lr=0.1, momentum=0.9)``.
        units: for "fsdp", the submodules that are gathered and freed one at a time (e.g.
            ``list(model.blocks)``); the root holds the rest. Ignored by other strategies, so one
            loop can try them all.
        process_group: defaults to the whole world (or a single process without
            ``torch.distributed``).
        ledger: where collectives are recorded (a new :class:`~fsdp_mini.comm.Ledger` if None).
        recorder: anything with ``mark(label)`` (a memory tracker, a telemetry Recorder), told
            about phases; its ``attach(module, optimizer)``, if it has one, is called at the end.
        check_collectives: debug mode: ranks compare every collective before issuing it and
            raise a clear error on the first mismatch instead of hanging (see ``comm``).
        options: ``bucket_mb`` (ddp, zero1, zero2), ``reshard_after_forward`` (fsdp).
    """
    _check_arguments(module, strategy, optimizer, options)
    comm = Comm(process_group, ledger, check_collectives=check_collectives)
    if strategy == "single":
        engine = Single(module, comm)
    elif strategy == "ddp":
        engine = DDP(module, comm, recorder=recorder, **options)
    elif strategy in ("zero1", "zero2"):
        engine = Zero(module, comm, shard_grads=strategy == "zero2", recorder=recorder, **options)
    else:
        engine = FSDP(module, comm, units=units or (), recorder=recorder, **options)
    module.fsdp_mini = engine
    module.memory_categories = engine.memory_categories
    if isinstance(engine, Zero):
        optim = ShardedOptimizer(engine, optimizer([b.shard for b in engine.buckets]))
    else:
        optim = optimizer([p for p in module.parameters() if p.requires_grad])
    if hasattr(recorder, "attach"):
        recorder.attach(module, optim)  # telemetry: start listening to this model
    return module, optim


def full_state_dict(model: nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """The full, unsharded tensors under the original module's ``state_dict()`` keys, on every
    rank. Collective under fsdp: every rank must call it."""
    engine = getattr(model, "fsdp_mini", None)
    if isinstance(engine, FSDP):
        return engine.full_state_dict()
    return OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items())


def expected_costs(model: nn.Module, optim_bytes: int = 8) -> dict[str, float]:
    """What the formulas of :mod:`fsdp_mini.theory` predict for this parallelized model, with
    its own padding: bytes sent per rank per step, and persistent model-state bytes per rank."""
    engine = _engine_of(model)
    n = engine.comm.world_size
    numel, frozen = numel_trainable_and_frozen(engine)
    persistent = partial(theory.persistent_bytes, engine.strategy, numel, n,
                         optim_bytes=optim_bytes)
    if engine.strategy == "single":
        return {"sent_bytes_per_step": 0.0, "persistent_bytes": persistent(frozen_numel=frozen)}
    if engine.strategy == "ddp":
        return {"sent_bytes_per_step": theory.ddp_sent_bytes(numel, n),
                "persistent_bytes": persistent(frozen_numel=frozen)}
    if engine.strategy in ("zero1", "zero2"):
        padded = engine.padded_numel()
        return {"sent_bytes_per_step": theory.zero_sent_bytes(padded, n),
                "persistent_bytes": persistent(padded_numel=padded, frozen_numel=frozen)}
    sizes = [theory.UnitSize(
        trainable=sum(g.layout.padded_numel for g in u.groups if g.shard.requires_grad),
        frozen=sum(g.layout.padded_numel for g in u.groups if not g.shard.requires_grad),
        gathered_in_backward=u.reshard_after_forward and u is not engine.root)
        for u in engine.units]
    return {"sent_bytes_per_step": theory.fsdp_sent_bytes(sizes, n),
            "persistent_bytes": persistent(padded_numel=sum(s.trainable for s in sizes),
                                           frozen_numel=sum(s.frozen for s in sizes))}


def numel_trainable_and_frozen(engine) -> tuple[int, int]:
    """Elements of the original model: (trainable, frozen), each parameter counted once."""
    if isinstance(engine, FSDP):
        slots = [s for u in engine.units for g in u.groups for s in g.layout.slots]
        return (sum(s.numel for s in slots if s.requires_grad),
                sum(s.numel for s in slots if not s.requires_grad))
    params = {id(p): p for p in engine.module.parameters()}.values()
    return (sum(p.numel() for p in params if p.requires_grad),
            sum(p.numel() for p in params if not p.requires_grad))


def _engine_of(model: nn.Module):
    engine = getattr(model, "fsdp_mini", None)
    if engine is None:
        raise ValueError("this model was not parallelized: call fsdp_mini.parallelize first")
    return engine


def _check_arguments(module, strategy, optimizer, options) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"parallelize expects an nn.Module, got a {type(module).__name__}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if getattr(module, "fsdp_mini", None) is not None:
        raise ValueError("this module was already parallelized; build a fresh module for each "
                         "strategy")
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"{type(module).__name__} has no trainable parameters: nothing to "
                         f"train or shard")
    if isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer):
        raise TypeError("optimizer must be a factory called with the parameters to optimise, "
                        "e.g. functools.partial(torch.optim.AdamW, lr=1e-3), not an optimizer "
                        "instance")
    unknown = set(options) - _OPTIONS[strategy]
    if unknown:
        allowed = ", ".join(sorted(_OPTIONS[strategy])) or "none"
        raise TypeError(f"unknown option(s) for {strategy!r}: {', '.join(sorted(unknown))}; "
                        f"allowed: {allowed}")
