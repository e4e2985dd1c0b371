"""One entry point for every strategy: ``parallelize(module, strategy, optimizer=...)``.

    model, optimizer = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                             optimizer=partial(torch.optim.AdamW, lr=1e-3))
    loss = model(x, y)[1]; loss.backward(); optimizer.step(); optimizer.zero_grad()

The module is changed in place (hooks, flat buffers) and returned; ``model.fsdp_mini`` holds the
strategy's state: its ``comm`` (with the ``ledger`` of collectives), buckets or units.

Used like plain torch means the habits too: a parameter that gets no gradient keeps
``grad is None`` and the optimizer leaves it alone; ``requires_grad_(False)`` after
``parallelize`` freezes it; ``model.zero_grad()`` works; ``print(model)`` and reading a weight
are safe at any time (under fsdp outside forward a weight is this rank's 1-D piece of it;
``summon_full_params`` gathers the whole ones). One thing is not plain torch: clip with
``fsdp_mini.clip_grad_norm_(model, max_norm)``, not ``torch.nn.utils.clip_grad_norm_``, whose
norm under zero and fsdp would be one rank's (the kit raises an error where it can see that).
"""

from __future__ import annotations

import inspect
import math
from collections import OrderedDict
from contextlib import contextmanager
from functools import partial
from numbers import Real

import torch
from torch import nn

from .arguments import count, flag
from .comm.collectives import Comm, Ledger
from .fsdp.algorithm import FSDP
from .fsdp.meta_init import MetaInit, check_meta_init, has_meta
from .precision.policy import no_param_dtype
from .registry import get_strategy
from .strategy import Strategy
from .theory import STRATEGIES  # noqa: F401  (public: the kit's own strategy names)
from .wrap import make_parallel


def parallelize(module: nn.Module, strategy: str, optimizer=partial(torch.optim.AdamW, lr=1e-3),
                units=None, *, process_group=None, ledger: Ledger | None = None, recorder=None,
                check_collectives: bool = False, link=None, param_init_fn=None, device=None,
                **options):
    """Apply ``strategy`` to ``module``; return ``(module, optimizer)``, used like plain torch.

    Args:
        strategy: "single", "ddp", "zero1", "zero2", "fsdp" or "hsdp" (FSDP inside groups of
            ``shard_size=S`` ranks, replicated across them: :mod:`fsdp_mini.fsdp.hsdp`), or the name
            of a strategy added with ``register_strategy``, or such a class itself.
        optimizer: a factory called with the parameters this rank must optimise, e.g.
            ``partial(torch.optim.SGD, lr=0.1, momentum=0.9)``. Under zero and fsdp these are
            *pieces*: the part of each parameter inside this rank's shard (possibly empty).
        units: for "fsdp", the submodules that are gathered and freed one at a time (e.g.
            ``list(model.blocks)``; any iterable of modules); the root holds the rest. Ignored by
            other strategies, so one loop can try them all.
        process_group: defaults to the whole world (or a single process without
            ``torch.distributed``).
        ledger: where collectives are recorded (a new :class:`~fsdp_mini.Ledger` if None).
        recorder: anything with ``mark(label)`` (a memory tracker, a telemetry Recorder), told
            about phases; its ``attach(module, optimizer)``, if it has one, is called at the end.
        check_collectives: debug mode: ranks compare every collective before issuing it and
            raise a clear error on the first mismatch instead of hanging (see ``comm``).
        link: a simulated network, ``fsdp_mini.Link(bandwidth_gbs=1.0, latency_us=50)``: every
            collective then takes at least its α-β ring time on it (:mod:`fsdp_mini.comm.link`).
            Time only: the model trains to the same numbers. No effect at world size 1.
        param_init_fn: for a model built on the meta device (``with torch.device("meta"):``),
            the function that initialises it in place, called with each unit's module (fsdp,
            hsdp: one unit at a time, then the root; other strategies: once, with the whole
            model). Default: every module's own ``reset_parameters()``. See
            :mod:`fsdp_mini.fsdp.meta_init`. Ignored for a model with real tensors.
        device: where a meta model is materialised (default: the CPU; on GPUs pass
            ``fsdp_mini.rank_device()``). Ignored for a model with real tensors.
        options: ``bucket_mb`` (ddp, zero1, zero2); for fsdp ``reshard_after_forward``,
            ``prefetch`` (False; True or k: issue the next k units' all-gathers ahead, see
            :mod:`fsdp_mini.fsdp.prefetch`) and ``activation_checkpointing`` (False; True:
            recompute each unit's activations in backward), ``offload`` (False; True: shards,
            gradients and optimizer state in CPU memory, see :mod:`fsdp_mini.buffers.offload`).
            Mixed precision (:mod:`fsdp_mini.precision.policy`): ``reduce_dtype`` (every strategy
            but single: the dtype gradients are reduced in, e.g. ``torch.bfloat16``; None keeps the
            parameters' dtype) and, for fsdp, ``param_dtype`` (the dtype units are gathered
            and computed in; the shards stay fp32). fp16 needs loss scaling:
            :class:`fsdp_mini.ShardedGradScaler`.

    Gradient clipping: use ``fsdp_mini.clip_grad_norm_(model, max_norm)``. Under zero1, zero2
    and fsdp, ``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)`` would see only this
    rank's gradients (unreduced, absent or sharded) and clip by a per-rank norm; under zero1 and
    fsdp the next ``optimizer.step()`` raises an error when it finds them changed.
    """
    units = _unit_list(units)
    is_class = isinstance(strategy, type) and issubclass(strategy, Strategy)
    cls = strategy if is_class else get_strategy(strategy)
    _check_arguments(module, cls, optimizer, options)
    _check_plumbing(ledger=ledger, recorder=recorder, check_collectives=check_collectives,
                    device=device)
    check_meta_init(module, param_init_fn, device)
    comm = Comm(process_group, ledger, check_collectives=check_collectives, link=link)
    if has_meta(module):
        options = _materialize(module, cls, comm, units, param_init_fn, device, options)
    if "units" in inspect.signature(cls.__init__).parameters:
        options = {**options, "units": units}
    engine = cls(module, comm, recorder=recorder, **options)
    optim = optimizer(engine.optimizer_params())
    make_parallel(module, optim, engine)
    if hasattr(recorder, "attach"):
        recorder.attach(module, optim)  # telemetry: start listening to this model
    return module, optim


def full_state_dict(model: nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """The full, unsharded tensors under the original module's ``state_dict()`` keys, on every
    rank. Collective under fsdp: every rank must call it."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"full_state_dict(model) must be an nn.Module (parallelized or not), got "
                        f"{model!r} (a {type(model).__name__})")
    engine = getattr(model, "fsdp_mini", None)
    if engine is None:
        return OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items())
    return engine.full_state_dict()


@contextmanager
def summon_full_params(model: nn.Module, writeback: bool = False):
    """Inside the block, every parameter of ``model`` is whole, under its usual attribute.

    Under fsdp the units are all-gathered (a collective: every rank must enter the block) and
    ``model.c.weight`` is the whole weight instead of this rank's piece; on exit they are freed
    again. Changes made inside are kept only with ``writeback=True`` (each rank then keeps its
    shard of what it wrote: write the same values on every rank). Example::

        with fsdp_mini.summon_full_params(model):
            print(model.blocks[0].mlp.fc.weight.norm())     # the whole weight's norm, every rank
    """
    engine = _engine_of(model)
    if not isinstance(writeback, bool):
        raise TypeError(f"writeback must be True (keep what the block writes) or False, got "
                        f"{writeback!r}")
    if isinstance(engine, FSDP):
        with engine.summon(writeback):
            yield model
        return
    params = list(model.parameters())  # already whole; undo changes unless writeback
    saved = None if writeback else [p.detach().clone() for p in params]
    try:
        yield model
    finally:
        if saved is not None:
            with torch.no_grad():
                for p, value in zip(params, saved):
                    p.copy_(value)


@contextmanager
def no_sync(model: nn.Module):
    """Inside the block, ``backward()`` accumulates gradients on this rank and sends nothing; the
    next backward outside it communicates their sum, once. Gradient accumulation, k micro-batches::

        with fsdp_mini.no_sync(model):
            for x, y in micro_batches[:-1]:
                (model(x, y)[1] / k).backward()         # local: no gradient collective
        x, y = micro_batches[-1]
        (model(x, y)[1] / k).backward()                 # one all-reduce / reduce-scatter of the sum
        optimizer.step(); optimizer.zero_grad()

    What counts is where ``backward()`` runs. Every rank must use it for the same micro-batches.
    ddp and zero2 keep whole ``p.grad`` (zero2 then holds 4Ψ of gradients instead of 4Ψ/N);
    zero1 changes nothing (it reduce-scatters at ``optimizer.step()`` anyway); fsdp keeps each
    unit's whole flat gradient (4Ψ per rank instead of 4Ψ/N, k−1 fewer reduce-scatters; it still
    all-gathers for every forward and backward). See :mod:`fsdp_mini.buffers.accumulate`.
    ``optimizer.step()`` while gradients kept here were never sent raises an error. Blocks nest:
    the outermost one decides.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"no_sync takes the model returned by fsdp_mini.parallelize, got a "
                        f"{type(model).__name__}")
    engine = getattr(model, "fsdp_mini", None)
    if engine is None:
        raise ValueError(f"no_sync: this {type(model).__name__} was not parallelized, so it has no "
                         f"gradient communication to skip; call fsdp_mini.parallelize first (a "
                         f"plain model accumulates gradients over backward() calls by itself)")
    was = engine.sync_gradients
    engine.set_gradient_sync(False)
    try:
        yield model
    finally:
        engine.set_gradient_sync(was)


def expected_costs(model: nn.Module, optim_bytes: int | None = None) -> dict[str, float]:
    """What the formulas of :mod:`fsdp_mini.theory` predict for this parallelized model, with
    its own padding: bytes sent per rank per step, and persistent model-state bytes per rank
    (Adam's two moments per parameter unless ``optim_bytes`` says otherwise)."""
    if optim_bytes is not None:
        optim_bytes = count("expected_costs(optim_bytes)", optim_bytes, at_least=0,
                            unit="optimizer bytes per parameter")
    return _engine_of(model).expected_costs(optim_bytes)


def _engine_of(model: nn.Module):
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected the model returned by fsdp_mini.parallelize, got {model!r} "
                        f"(a {type(model).__name__})")
    engine = getattr(model, "fsdp_mini", None)
    if engine is None:
        raise ValueError("this model was not parallelized: call fsdp_mini.parallelize first")
    return engine


def _unit_list(units) -> list:
    """``units`` as a list, read once (a generator would be used up by the checks)."""
    if units is None:
        return []
    if isinstance(units, nn.Module) and not isinstance(units, (nn.ModuleList, nn.Sequential)):
        raise TypeError(f"units must be an iterable of modules, e.g. units=list(model.blocks); "
                        f"got one {type(units).__name__}: write units=[that_module]")
    try:
        return list(units)
    except TypeError:
        raise TypeError(f"units must be an iterable of modules, e.g. units=list(model.blocks); "
                        f"got a {type(units).__name__}") from None


def _check_arguments(module, cls, optimizer, options) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"parallelize expects an nn.Module, got a {type(module).__name__}")
    if getattr(module, "fsdp_mini", None) is not None:
        raise ValueError("this module was already parallelized; build a fresh module for each "
                         "strategy")
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"{type(module).__name__} has no trainable parameters: nothing to "
                         f"train or shard")
    unknown = set(options) - cls.options()
    if "param_dtype" in unknown and "reduce_dtype" in cls.options():
        raise TypeError(no_param_dtype(cls.strategy))
    if unknown:
        allowed = ", ".join(sorted(cls.options())) or "none"
        raise TypeError(f"unknown option(s) for {cls.strategy!r}: {', '.join(sorted(unknown))}; "
                        f"allowed: {allowed}")
    if "bucket_mb" in options:
        mb = options["bucket_mb"]
        if isinstance(mb, bool) or not isinstance(mb, Real) or not math.isfinite(mb) or mb <= 0:
            raise ValueError(f"bucket_mb must be positive, a number of megabytes such as 25; got "
                             f"{mb!r}")
    for name in ("reshard_after_forward", "activation_checkpointing", "offload"):
        if name in options:
            flag(f"parallelize({name})", options[name])
    ahead = options.get("prefetch", 0)
    if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 0:
        if not isinstance(ahead, bool):
            raise ValueError(f"prefetch must be True, False or how many units to gather ahead "
                             f"(an int >= 0, e.g. prefetch=1); got {ahead!r}")
    _check_optimizer_factory(optimizer)


def _check_plumbing(*, ledger, recorder, check_collectives, device) -> None:
    """parallelize's keyword arguments that are not options of a strategy, checked by name."""
    flag("parallelize(check_collectives)", check_collectives)
    if ledger is not None and not isinstance(ledger, Ledger):
        raise TypeError(f"parallelize(ledger) must be None (a new one) or a fsdp_mini.Ledger, "
                        f"got {ledger!r} (a {type(ledger).__name__})")
    if recorder is not None and not callable(getattr(recorder, "mark", None)):
        raise TypeError(f"parallelize(recorder) must be None or have a mark(label) method (a "
                        f"memory tracker, a telemetry Recorder), got {recorder!r} (a "
                        f"{type(recorder).__name__})")
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
            raise TypeError(f"parallelize(device) must be None, a device name such as 'cpu' or "
                            f"'cuda:0', or a torch.device, got {device!r} (a "
                            f"{type(device).__name__})")
        try:
            torch.device(device)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"parallelize(device) {device!r} is not a device: {e}") from None


def _materialize(module, cls, comm, units, param_init_fn, device, options) -> dict:
    """A meta model: fsdp (and its subclasses) materialise it unit by unit while they shard it
    (they get ``meta_init``); other strategies keep it whole, so it is materialised whole now."""
    by_unit = getattr(cls, "materializes_units", False)
    meta = MetaInit(module, units if by_unit else (), param_init_fn, device)
    meta.sync_rng(comm)  # Note: the same init on every rank, whatever the world size
    if by_unit:
        return {**options, "meta_init": meta}
    meta.materialize(module)
    return options


def _check_optimizer_factory(optimizer) -> None:
    if isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer):
        got = ("an optimizer instance" if isinstance(optimizer, torch.optim.Optimizer)
               else f"a{'n' * (type(optimizer).__name__[0] in 'aeiou')} "
                    f"{type(optimizer).__name__}")
        raise TypeError(f"optimizer must be a factory called with the parameters to optimise, "
                        f"e.g. functools.partial(torch.optim.AdamW, lr=1e-3), not {got}")
    # Note: tried on a throwaway parameter, so a wrong factory fails before the module changes.
    made = optimizer([nn.Parameter(torch.zeros(1))])
    if not isinstance(made, torch.optim.Optimizer):
        raise TypeError(f"the optimizer factory returned a {type(made).__name__}, not a "
                        f"torch.optim.Optimizer; pass e.g. functools.partial(torch.optim.AdamW, "
                        f"lr=1e-3)")
