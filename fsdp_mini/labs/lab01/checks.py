"""Lab 01, where the memory goes on one device: measure a training step, draw it, bound the peak.

    from fsdp_mini import labs
    mem = labs.measure_step(GPTConfig.tiny(), batch_size=4)     # one step, in this process
    labs.draw_timeline(mem)                                      # memory by category, per phase
    labs.check_peak_predictor(predict_peak)                      # the exercise: a peak bound

Everything runs in the calling process: one device needs no ranks.
"""

from __future__ import annotations

import math

from ...models import GPTConfig, make_model
from ...telemetry.units import fmt_bytes
from ..common.differential import Check, Hint, near, spread
from ..common.exercise import load_solution, not_written_yet
from ..common.report import CheckResult, verdict_of_check
from .runs import (OPTIMIZERS, at_peak_named, draw_timeline, make_optimizer, measure_step,
                   peak_phase, snapshot_table)

__all__ = ["OPTIMIZERS", "at_peak_named", "check_peak_predictor", "draw_timeline",
           "make_optimizer", "measure_step", "peak_phase", "snapshot_table"]

VALUE = 4  # bytes of one fp32 value: a parameter, a gradient, a moment
HOLDS = {"sgd": "the parameter and its gradient", "momentum": "the parameter, its gradient and "
         "one momentum value", "adam": "the parameter, its gradient and Adam's two moments m, v"}
UNITS = {0.5: "2 bytes per value: this step is fp32, 4 bytes each", 8: "bits, not bytes",
         1e-3: "kB, not bytes", 1e-6: "MB, not bytes", 1e-9: "GB, not bytes",
         2**-10: "KiB, not bytes", 2**-20: "MiB, not bytes", 2**-30: "GiB, not bytes"}


LEFT_OUT = "left out"  # the call without an optimizer: the signature's default ('adam')


def _predict(fn, cfg, record) -> None:
    args = (cfg["n_params"], cfg["activation_bytes"])
    value = fn(*args) if cfg["optimizer"] == LEFT_OUT else fn(*args, cfg["optimizer"])
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    record.see("bound", value)


def _per_parameter(d) -> dict:
    """Bytes per parameter of the answer beyond the reference's, by optimizer, without
    activations (the model state): {"sgd": 0.0, "momentum": -4.0, ...}."""
    out = {}
    for cfg, m, w in d.pairs("bound"):
        if cfg["activation_bytes"] == 0 and cfg["n_params"] >= 1000 and _number(m) and \
                cfg["optimizer"] != LEFT_OUT:
            out.setdefault(cfg["optimizer"], (m - w) / cfg["n_params"])
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _state_words(d) -> str:
    extra, scale = _per_parameter(d), _state_scale(d)
    if not extra:
        return ""
    if scale is not None and near(scale, next((k for k in UNITS if near(scale, k)), 0)):
        return (f"your model state is {scale:g}x the reference's with every optimizer: "
                f"{next(w for k, w in UNITS.items() if near(scale, k))}")
    parts = [("right" if abs(e) < 0.01 else f"{abs(e):.3g} B {'too many' if e > 0 else 'short'}")
             + f" with {o}" for o, e in extra.items()]
    return (f"per parameter, your model state is {', '.join(parts)}. It is {VALUE} B per fp32 "
            f"value kept: sgd keeps {HOLDS['sgd']}, momentum {HOLDS['momentum']}, adam "
            f"{HOLDS['adam']}")


def _state_scale(d) -> float | None:
    """yours / the reference's model state (no activations) where that is one number for every
    optimizer and size."""
    ratios = [m / w for cfg, m, w in d.pairs("bound") if cfg["activation_bytes"] == 0
              and _number(m) and w]
    return ratios[0] if ratios and all(near(r, ratios[0]) for r in ratios) else None


def _activation_factors(d) -> list[float]:
    """How many times the answer adds the activation bytes (the reference: once), per model
    size and optimizer."""
    rows = {}
    for cfg, m, _ in d.pairs("bound"):
        rows.setdefault((cfg["n_params"], cfg["optimizer"]), {})[cfg["activation_bytes"]] = m
    return [(by_a[max(by_a)] - by_a[0]) / max(by_a) for by_a in rows.values()
            if 0 in by_a and max(by_a) and all(map(_number, by_a.values()))]


def _activation_words(d) -> str:
    factors = _activation_factors(d)
    if max(factors) - min(factors) < 0.01:
        return (f"your bound adds the activations {factors[0]:.3g} times; they are alive once "
                f"(saved in forward, freed in backward): add activation_bytes once")
    return ("your bound is not the model state plus the activations: how much it grows with "
            "activation_bytes depends on the model's size. A bound adds up what can be alive "
            "at once: the model state, and the activations once")


def _block(values) -> int:
    """The largest block every value is a whole multiple of (1 for exact byte counts)."""
    whole = [int(v) for v in values if _number(v) and float(v).is_integer() and v > 0]
    return math.gcd(*whole) if len(whole) == len(values) and whole else 1


def _rounded(d) -> int:
    """The block yours rounds every bound up to, where the reference's bounds are exact."""
    mine = [m for _, m, _ in d.pairs("bound")]
    block = _block(mine)
    return block if block >= 16 and _block([w for _, _, w in d.pairs("bound")]) < block else 0


HINTS = [
    Hint(lambda d: d.raised is not None, "n_params and activation_bytes are numbers (bytes); "
         "optimizer is one of 'sgd', 'momentum', 'adam'"),
    Hint(lambda d: not _number(d.mine),
         "return the number of bytes, an int or a float"),
    Hint(lambda d: any(near(d.ratio, k) for k in UNITS) and all(
        near(r, d.ratio) for r in _ratios(d)),
         lambda d: "every answer is {:g}x the reference's: {}".format(
             d.ratio, next(w for k, w in UNITS.items() if near(d.ratio, k)))),
    Hint(lambda d: d.only_where(lambda c: c["optimizer"] == LEFT_OUT), "called without an "
         "optimizer, predict_peak(n_params, activation_bytes) gives {mine:g} where the reference's "
         "default gives {want:g}: keep the signature as given, optimizer=\"adam\""),
    Hint(_rounded, lambda d: f"every bound of yours is a whole multiple of {_rounded(d)} B, "
         "the reference's are exact: a bound counts bytes (4 B per value kept), no rounding to "
         "blocks"),
    Hint(lambda d: d.config["activation_bytes"] == 0 or any(
        abs(e) >= 0.01 for e in _per_parameter(d).values()), _state_words),
    Hint(lambda d: any(not near(f, 1, 0.01) for f in _activation_factors(d)), _activation_words),
]


def _ratios(d):
    return [m / w for _, m, w in d.pairs("bound") if _number(m) and w]


CHECK = Check(
    "your upper bound of the peak memory", _predict,
    configs=spread(n_params=[1, 1000, 27_840, 3_200_000], activation_bytes=[0, 4096, 1_234_567],
                   optimizer=list(OPTIMIZERS) + [LEFT_OUT]),
    tolerance={"bound": 1e-9}, hints=HINTS,
    words={"bound": "predict_peak(n_params, activation_bytes, optimizer)"},
    agreed="the model state (4 B per value kept: parameters, gradients, optimizer state) plus "
           "the activations once, as the reference, for every optimizer and size")


def _reference():
    return load_solution("01_predict_peak", "predict_peak")


# What tests/wrong_answers/ judges many answers with: the check of the exercise, one batch
JUDGES = {"01_predict_peak": lambda answers: CHECK.judge_many(answers, _reference())}


@verdict_of_check
def check_peak_predictor(fn, config: GPTConfig | None = None, device="cpu") -> CheckResult:
    """Check ``fn(n_params, activation_bytes, optimizer)``, an upper bound of the peak bytes of
    one fp32 step (the model state plus the activations), against the reference on 48
    configurations (parameter counts from 1 to 3.2 M, no activations or some, each optimizer, and
    the optimizer left out: the signature's default);
    then measure ``config``'s step (the tiny GPT by default) and say how far above its peak the
    bound is: the true peak is lower, because the gradients appear while backward frees the
    activations."""
    result = CheckResult(CHECK.what)
    if not_written_yet(fn):
        return result.wrong("predict_peak is not written yet: write its body in the cell above",
                            hint="labs.show_solution('01_predict_peak') shows one way").finish()
    CHECK(fn, _reference(), result)
    if result.passed:
        _measured(fn, config or GPTConfig.tiny(), device, result)
    return result.finish()


WHY_LOWER = {"backward": "the gradients appear while backward frees the activations",
             "step": "it is in optimizer.step(), when the activations are freed and only the "
                     "step's temporaries are alive"}


def _measured(fn, config, device, result) -> None:
    """The lab's own step: the bound beside the measured peak (a bound must not be below it)."""
    mem = measure_step(config, 4, optimizer="adam", device=device)
    n = make_model(config).num_params()
    bound = fn(n, mem.peak_by_category["activations"], "adam")
    phase, what = peak_phase(mem), f"the GPT of {n:,} parameters, batch 4, adam"
    result.check(bound >= mem.own_peak_bytes * 0.99,
                 f"{what}: your bound {fmt_bytes(bound)} is {bound / mem.own_peak_bytes - 1:.0%} "
                 f"above the measured peak {fmt_bytes(mem.own_peak_bytes)}, in {phase} (the true "
                 f"peak is lower: {WHY_LOWER.get(phase, 'not everything is alive at once')})",
                 f"{what}: your bound {fmt_bytes(bound)} is below the measured peak "
                 f"{fmt_bytes(mem.own_peak_bytes)}: a bound must not be")
    result.facts["cases"] = [{"what": what, "n": n, "predicted": bound,
                              "peak": mem.own_peak_bytes, "phase": phase}]
