"""Lab 01, where the memory goes on one device: measure a training step, draw it, bound the peak.

    from fsdp_mini import labs
    mem = labs.measure_step(GPTConfig.tiny(), batch_size=4)     # one step, in this process
    labs.draw_timeline(mem)                                      # memory by category, per phase
    labs.check_peak_predictor(predict_peak)                      # the exercise: a peak bound

Everything runs in the calling process: one device needs no ranks.
"""

from __future__ import annotations

import math

import torch

from ...models import GPTConfig, make_model
from ...telemetry.units import fmt_bytes
from ..common.exercise import not_written_yet
from ..common.report import CheckResult

from .runs import (OPTIMIZERS, at_peak_named, draw_timeline, make_optimizer, measure_step,
                   peak_phase, snapshot_table)

__all__ = ["OPTIMIZERS", "at_peak_named", "check_peak_predictor", "draw_timeline",
           "make_optimizer", "measure_step", "peak_phase", "snapshot_table"]


# -- the checker of the exercise -------------------------------------------------------------

TOLERANCE = 0.01  # see check_peak_predictor's docstring
_PATTERNS = (  # (bytes per parameter for sgd, momentum, adam), what went wrong, hint
    ((8, 8, 8), "you left out the optimizer state",
     "Adam keeps two moments per parameter (m and v, 4 B each); SGD with momentum keeps one"),
    ((8, 12, 12), "you counted one moment for Adam; it keeps two",
     "Adam stores m (the mean of gradients) and v (the mean of squared gradients): 8 B"),
    ((8, 8, 16), "you left out the momentum buffer of SGD with momentum (4 B per parameter)", ""),
    ((4, 8, 12), "you left out the gradients (or the parameters): each is 4 B per parameter",
     "after backward every parameter has a .grad of its own size"),
    ((16, 16, 16), "you counted Adam's state for every optimizer: plain SGD keeps none",
     "did your function ignore its optimizer argument?"),
    ((0, 4, 8), "you counted only the optimizer state", "add the parameters and the gradients"),
    ((8, 12, 20), "you counted an fp32 master copy of the weights for Adam: that belongs to "
     "mixed precision (bf16 weights, fp32 master); in this fp32 step the parameters are the "
     "master", "Adam here: parameters 4 B + gradients 4 B + m and v 8 B = 16 B"),
    ((12, 16, 20), "you counted one 4-byte copy per parameter too many",
     "parameters 4 B + gradients 4 B + optimizer state (0, 4 or 8 B)"),
)
_SCALES = ((0.5, "you used 2 bytes per value (fp16/bf16 thinking); this step is fp32: 4 B each"),
           (8, "you counted bits, not bytes (32 bits = 4 bytes)"),
           *((scale, f"you returned {unit}, not bytes") for scale, unit in (
               (1e-3, "kB"), (1e-6, "MB"), (1e-9, "GB"), (2 ** -10, "KiB"), (2 ** -20, "MiB"),
               (2 ** -30, "GiB"))))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * abs(b)


def _fmt(values) -> str:
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"


def _measure_configs(config: GPTConfig, device) -> list[dict]:
    """The steps the checker measures: three models, three batch sizes, three optimizers."""
    cases = ((GPTConfig.tiny(), 2, "sgd"),
             (GPTConfig.tiny(n_layer=3, n_embd=48, n_head=4), 8, "momentum"), (config, 4, "adam"))
    out = []
    for cfg, batch, opt in cases:
        mem = measure_step(cfg, batch, optimizer=opt, device=device)
        peaks = mem.peak_by_category
        n = make_model(cfg).num_params()
        out.append({"what": f"GPT of {n:,} parameters, batch {batch}, {opt}", "n": n,
                    "optimizer": opt, "activations": peaks["activations"],
                    "state": peaks["params"] + peaks["grads"] + peaks["optimizer_state"],
                    "peak": mem.own_peak_bytes, "phase": peak_phase(mem)})
    return out


def _call(fn, result: CheckResult, *args):
    """fn(*args) as a float, or None after a ✘ line saying what went wrong."""
    call = f"predict_peak{args}"
    try:
        value = fn(*args)
    except Exception as exc:  # the learner's code: any error becomes one line
        result.wrong(f"{call} raised {type(exc).__name__}: {exc}",
                     hint=f"n_params and activation_bytes are numbers; optimizer: {OPTIMIZERS}")
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        result.wrong(f"{call} returned {value!r} ({type(value).__name__})",
                     hint="return the number of bytes, an int or a float")
        return None
    return float(value)


def _diagnose_state(per_param: dict, measured: dict, result: CheckResult):
    """Compare the learner's bytes per parameter (no activations) with the measured ones.

    Returns (right, scale): ``scale`` is the factor of a units mistake (MB for bytes...) that
    scales the whole answer, activations included, else None."""
    if all(_close(per_param[o], measured[o]) for o in OPTIMIZERS):
        for o in OPTIMIZERS:
            result.ok(f"model state with {o}: {per_param[o]:.1f} B per parameter, as measured")
        return True, None
    got = tuple(per_param[o] for o in OPTIMIZERS)
    versus = (f"(your formula: {_fmt(got)} B per parameter for sgd, momentum, adam; "
              f"measured: {_fmt(measured[o] for o in OPTIMIZERS)})")
    for pattern, message, hint in _PATTERNS:
        if all(_close(g, p) for g, p in zip(got, pattern)):
            result.wrong(f"{message} {versus}", hint)
            return False, None
    ratios = [per_param[o] / measured[o] for o in OPTIMIZERS]
    for scale, message in _SCALES:
        if all(_close(r, scale) for r in ratios):
            result.wrong(f"{message} {versus}")
            return False, (scale if scale < 0.5 else None)
    for o in OPTIMIZERS:
        result.check(_close(per_param[o], measured[o]),
                     f"model state with {o}: {per_param[o]:.1f} B per parameter, as measured",
                     f"model state with {o}: your formula gives {per_param[o]:.3g} B per "
                     f"parameter, measured {measured[o]:.3g}",
                     hint="parameters 4 B + gradients 4 B + optimizer state per parameter")
    return False, None


def check_peak_predictor(fn, config: GPTConfig | None = None, device="cpu") -> CheckResult:
    """Check ``fn(n_params, activation_bytes, optimizer)``: an upper bound of the peak bytes of
    one fp32 step, the model state plus the activations (what a memory planner budgets).

    The checker measures three steps with ``measure_step`` (the tiny GPT with SGD, a wider one
    with momentum, ``config`` with Adam; ``config`` defaults to the tiny GPT) and calls ``fn``
    with each model's parameter count and the peak of its "activations" category:

    - the model state, ``fn(n, 0, optimizer)``, must be the measured parameters + gradients +
      optimizer state, within ``TOLERANCE`` = 1 %. The formula leaves out only Adam's step
      counters (4 B per parameter tensor, 0.02 % of the tiny GPT's state); a mistake is 25 %
      off or more (a 4-byte value out of 16);
    - ``fn(n, A, optimizer) - fn(n, 0, optimizer)`` must be ``A``, within 1 %;
    - then the bound must not be below the measured peak (no category is ever above its own
      peak). How far above it is is reported, not judged: the true peak is lower, because the
      gradients appear while backward frees the activations.

    A wrong answer is named when it matches a known mistake (the optimizer state left out, one
    Adam moment, no gradients, 2 bytes per value, activations counted twice, MB not bytes...).
    """
    result = CheckResult("your upper bound of the peak memory")
    if not_written_yet(fn):
        result.wrong("predict_peak is not written yet: write its body in the cell above",
                     hint="labs.show_solution('01_predict_peak') shows one way")
        return result.finish()
    cases = _measure_configs(config or GPTConfig.tiny(), device)
    measured = {c["optimizer"]: c["state"] / c["n"] for c in cases}
    per_param = {}
    for c in cases:
        state = _call(fn, result, c["n"], 0, c["optimizer"])
        if state is None:
            return result.finish()
        per_param[c["optimizer"]] = state / c["n"]
    state_ok, scale = _diagnose_state(per_param, measured, result)
    activations_ok = True
    for c in cases:
        total = _call(fn, result, c["n"], c["activations"], c["optimizer"])
        if total is None:
            return result.finish()
        added = (total - per_param[c["optimizer"]] * c["n"]) / c["activations"]
        c["predicted"] = total
        if scale is not None and _close(added, scale):
            activations_ok = False  # the units mistake, already named
        elif not _close(added, 1.0):
            activations_ok = False
            what = ("you counted the activations twice" if _close(added, 2.0) else
                    "you left out the activations" if abs(added) < TOLERANCE else
                    f"your bound grows by {added:.3g} x the activation bytes")
            result.wrong(f"{what} ({c['what']})",
                         hint="the activations are alive once: saved in forward, freed in "
                              "backward; add activation_bytes once")
            break
    if activations_ok:
        result.ok("activation_bytes added once, as measured")
    why = {"backward": " (the true peak is lower: the gradients appear while backward frees the "
                       "activations)",
           "step": " (the true peak is lower: it is in optimizer.step(), when the activations "
                   "are freed and only the step's temporaries are alive)"}
    told = set()
    for c in cases if state_ok and activations_ok else []:
        said = "" if c["phase"] in told else why.get(c["phase"], "")
        told.add(c["phase"])
        result.check(c["predicted"] >= c["peak"] * (1 - TOLERANCE),
                     f"{c['what']}: your bound {fmt_bytes(c['predicted'])} is "
                     f"{c['predicted'] / c['peak'] - 1:.0%} above the measured peak "
                     f"{fmt_bytes(c['peak'])}, in {c['phase']}" + said,
                     f"{c['what']}: your bound {fmt_bytes(c['predicted'])} is below the measured "
                     f"peak {fmt_bytes(c['peak'])}: a bound must not be")
    result.facts["cases"] = cases
    return result.finish()
