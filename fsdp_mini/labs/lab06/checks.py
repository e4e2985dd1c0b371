"""Lab 06: the bandwidth below which FSDP is slower than DDP, checked beside the reference.

    labs.check_predict_crossover(predict_crossover)    # 1,620 jobs, then the lab's own six
    labs.alpha_beta_crossover(3.2e6, 4, 4, 0.2, 50, 0.1)  # the kit's own answer: 0.414 GB/s

The α-β model (``fsdp_mini.Link`` charges exactly this): a step takes T(b) = C + L + B/b; DDP one
all-reduce (B_d = 2(N−1)/N·4Ψ, L_d = 2(N−1)α), FSDP 3 collectives per unit (B_f = 3(N−1)/N·4Ψ,
L_f = 3·units·(N−1)α). FSDP loses when T_f(b) > (1 + m)·T_d(b)::

    b* = (B_f − (1+m)·B_d) / ((1+m)·(C + L_d) − C − L_f)     inf: no time left; 0: no bytes extra

The jobs: N = 1 to 64, 1 to 64 units, Ψ = 3.2 M and 7 B, no compute or some, no latency to 2 ms,
margins 0 (FSDP always loses), 0.1, 0.5 (the bytes tie), 0.6 and 2 (it never loses).
"""

from __future__ import annotations

import math

from ..common.differential import Check, Hint, near
from ..common.exercise import load_solution, not_written_yet
from ..common.records import Config, spread
from ..common.report import CheckResult, verdict_of_check
from ..common.facts import constant_ratio, fit_terms, number, pairs, right_only_with, unit_words
from ..common.facts import right_wherever_words
from .runs import *  # noqa: F401,F403
from .runs import __all__ as _RUNS

__all__ = ["alpha_beta_crossover", "check_predict_crossover", *_RUNS]

ARGS = ("psi", "world_size", "units", "compute_s", "latency_us", "margin")
# The lab's own calls: a laptop GPT, a tiny one, a large job, a latency-bound one, its GPT at
# margin 0.2 with a compute of the order section 3 measures, the 7B job of section 4
SCENARIOS = [(3.2e6, 4, 4, 0.2, 50.0, 0.1), (30e3, 2, 2, 0.01, 50.0, 0.1),
             (1e9, 8, 32, 2.0, 10.0, 0.05), (1e8, 16, 48, 0.5, 20.0, 0.1),
             (3.2e6, 4, 5, 0.02, 50.0, 0.2), (7e9, 64, 64, 2.0, 10.0, 0.10)]
UNITS = {8: "bits per second, not bytes: the ledger and Link count bytes",
         1e9: "bytes per second: GB/s is 10⁹ B/s", 1e9 / 2**30: "GiB/s (2³⁰ B/s), not GB/s (10⁹ B/s)",
         1e-3: "TB/s, not GB/s", 1e3: "MB/s, not GB/s"}


def alpha_beta_crossover(psi, world_size, units, compute_s, latency_us, margin) -> float:
    """The kit's answer (the reference solution).

    >>> round(alpha_beta_crossover(3.2e6, 4, 4, 0.2, 50, 0.1), 3)
    0.414
    """
    return _reference()(psi, world_size, units, compute_s, latency_us, margin)


def _observe(fn, cfg, record) -> None:
    value = fn(*(cfg[a] for a in ARGS))
    if number(value):   # Note: below 1 B/s is 0: where the bytes tie (margin 0.5), float noise
        value = 0.0 if abs(value) < 1e-9 else float(value)
    record.see("crossover", value)


def _model(c) -> tuple[float, float]:
    """(the bytes FSDP sends beyond (1+m)·DDP's, the time the margin leaves for them)."""
    n, m, a = c["world_size"], c["margin"], c["latency_us"] * 1e-6
    extra = (3 - 2 * (1 + m)) * (n - 1) / n * 4 * c["psi"]
    return extra, (1 + m) * (c["compute_s"] + 2 * (n - 1) * a) - c["compute_s"] - 3 * c[
        "units"] * (n - 1) * a


def _finite(d):
    return [(c, m, w) for c, m, w in pairs(d, "crossover") if m > 0 and w > 0]


def _only_edges(d) -> bool:
    """Every job where both crossovers are finite and positive agrees: only the edges differ."""
    return bool(_finite(d)) and all(abs(m / w - 1) <= 1e-6 for _, m, w in _finite(d))


def _latency(d) -> dict | None:
    """What your answers count of latency, where the bytes are right (every job without latency
    agrees): FSDP's collectives per unit and per step, DDP's (N−1)α terms."""
    if not right_only_with(d, "latency_us", lambda v: v == 0):
        return None
    rows = []
    for c, m, w in _finite(d):
        extra, left = _model(c)
        if c["latency_us"] and c["world_size"] > 1 and extra > 0:
            k = (extra / (m * 1e9) - left) / ((c["world_size"] - 1) * c["latency_us"] * 1e-6)
            rows.append(({"1+m": 1 + c["margin"], "u": c["units"], "1": 1.0}, k))
    fit = fit_terms(rows, 1e-6)
    return fit and {"F": 3 - fit["u"], "D": 2 + fit["1+m"], "E": -fit["1"]}


def _latency_words(d) -> str:
    f = _latency(d)
    if near(f["F"], 3, 1e-6) and near(f["D"] - f["E"], 2, 1e-6) and not near(f["D"], 2, 1e-6):
        return (f"from your answers, the (1 + m) multiplies {f['D']:g}·(N−1)α of DDP's "
                f"2·(N−1)α latency and leaves {-f['E']:g}·(N−1)α outside: the margin multiplies "
                f"DDP's whole step, (1 + m)·(C + L_d + B_d/b)")
    step = f" + {f['E']:g}·(N−1)α once a step" if f["E"] else ""
    return (f"from your answers, your FSDP latency is {f['F']:g}·units·(N−1)α{step} and DDP's "
            f"{f['D']:g}·(N−1)α; the model: 3·units·(N−1)α (each unit: an all-gather in forward, "
            f"one in backward, a reduce-scatter) and 2(N−1)α (an all-reduce: a reduce-scatter "
            f"then an all-gather)")


def _bytes_ratio(d) -> float | None:
    """yours / the reference's where there is no latency, if that is one number (not 1) in
    every differing job with both finite and positive: the bytes are off by that factor."""
    jobs = [(c, m / w) for c, m, w in _finite(d) if not c["latency_us"] and c in d.differ]
    r = [x for _, x in jobs]
    ok = len(r) > 1 and all(near(x, r[0], 1e-6) for x in r) and not near(r[0], 1, 1e-6)
    # Note: a factor of the bytes scales the crossover alike whatever the compute
    varied = len({c["compute_s"] for c, _ in jobs}) > 1
    bytes_factor = ok and any(near(r[0], k, 1e-6) for k in BYTES)
    return r[0] if bytes_factor and varied else None


BYTES = {0.25: "Ψ counted as bytes: Ψ is a count of parameters, 4Ψ bytes in fp32",
         4.0: "the bytes counted 4 times: 4Ψ is already in bytes", 0.5: "half the bytes",
         2.0: "twice the bytes"}


def _rounded(d) -> int | None:
    """k where every differing crossover of yours is the reference's rounded to k decimals."""
    finite = [(m, w) for c, m, w in pairs(d, "crossover") if c in d.differ and
              math.isfinite(m) and math.isfinite(w)]
    return next((k for k in range(4) if finite and all(m == round(w, k) for m, w in finite)),
                None)


def _ring(d) -> bool:
    """yours / the reference's is N/(N−1) wherever there is no latency (N > 1)."""
    r = [(c["world_size"], m / w) for c, m, w in _finite(d) if not c["latency_us"]
         and c["world_size"] > 1]
    return len(r) > 1 and all(near(x, n / (n - 1), 1e-6) for n, x in r)


# axis: (the values where an answer right only there is telling, the lesson's words)
AXES = {"world_size": ((2,), "what is right at N = 2 (N − 1 = 1) and wrong elsewhere "
                       "grows with N − 1: a ring collective sends N − 1 messages, each paying α "
                       "(none at N = 1)"),
        "units": ((1,), "per unit: every unit issues its own 3 collectives"),
        "compute_s": ((0,), "the compute: both do the same C, and FSDP without prefetch waits "
                      "for every collective: T_f = C + L_f + B_f/b, a sum, not max(C, …); the "
                      "margin multiplies DDP's compute too, (1 + m)·C, so C does not cancel"),
        "latency_us": ((0,), "the latency terms: each ring collective pays α N−1 times (an "
                       "all-reduce 2(N−1)): L_f = 3·units·(N−1)α, L_d = 2(N−1)α, with α = "
                       "latency_us·10⁻⁶ s (µs to seconds)"),
        "margin": ((0,), "the margin: FSDP loses when T_f(b) > (1 + m)·T_d(b); the (1 + m) "
                   "multiplies DDP's step, not FSDP's")}


def _ring_factors(d) -> bool:
    """Every job at N = 1 agrees (no ring term there), and where there is no latency yours /
    the reference's changes with N alone (the other job's values the same): the bytes' ring
    factors are off. Note: a misplaced margin or compute gives one ratio at every N."""
    if any(c["world_size"] == 1 for c in d.differ) or not any(
            c["world_size"] == 1 for c in d.agree) or _axis(d) not in (None, "margin"):
        return False
    by_job = {}
    for c, m, w in _finite(d):
        if not c["latency_us"] and c["world_size"] > 1:
            job = (c["units"], c["psi"], c["compute_s"], c["margin"])
            by_job.setdefault(job, set()).add(round(m / w, 9))
    return any(len(ratios) > 1 for ratios in by_job.values())


def _axis(d) -> str | None:
    return next((a for a, (vs, _) in AXES.items() if right_only_with(d, a, lambda v: v in vs)),
                None)


NO_TIME = ("(1 + m)(C + L_d) − C − L_f <= 0 (FSDP's extra latency alone is more than the "
           "margin), so FSDP loses at every bandwidth: return math.inf")


HINTS = [
    Hint(lambda d: d.raised and d.raised[0] == "ZeroDivisionError" and _model(d.config)[1] <= 0,
         f"a division by zero: here no time is left, {NO_TIME} (before dividing)"),
    Hint(lambda d: d.raised is not None, "psi, world_size, units, compute_s, latency_us and "
         "margin are numbers; compute_s is in seconds, latency_us in µs (α = latency_us·10⁻⁶ s)"),
    Hint(lambda d: not number(d.mine) and d.mine != float("inf"), "return the bandwidth in GB/s "
         "as a float (math.inf when FSDP loses at every bandwidth, 0.0 when it never loses)"),
    Hint(lambda d: unit_words(constant_ratio(d, "crossover"), UNITS), lambda d: (
        f"every crossover of yours is {constant_ratio(d, 'crossover'):.4g}x the reference's: "
        f"{unit_words(constant_ratio(d, 'crossover'), UNITS)}")),
    Hint(lambda d: len(_finite(d)) > 1 and all(near(m * w, 1, 1e-6) for _, m, w in _finite(d)),
         "yours is 1 / the reference's everywhere: the bandwidth multiplies where it divides "
         "(time = bytes / bandwidth): solve C_f + L_f + B_f/b = (1+m)(C_d + L_d + B_d/b) for b"),
    Hint(lambda d: _rounded(d) is not None, lambda d: f"yours is the reference's rounded to "
         f"{_rounded(d)} decimals: return the value as computed (round only when you print it): "
         f"at low bandwidths the rounding is most of the answer"),
    Hint(lambda d: _bytes_ratio(d) is not None, lambda d: (
        f"where there is no latency every crossover of yours is {_bytes_ratio(d):.4g}x the "
        f"reference's: the bytes are off by that factor" + next(
            (f" ({w})" for k, w in BYTES.items() if near(_bytes_ratio(d), k, 1e-6)), "") +
        "; B_d = 2(N−1)/N·4Ψ, B_f = 3(N−1)/N·4Ψ bytes")),
    Hint(_ring, "where there is no latency yours is N/(N−1) times the reference's: the (N−1)/N "
         "of the ring is missing (an all-gather or reduce-scatter sends (N−1)/N of its payload "
         "from each rank, an all-reduce twice that)"),
    Hint(lambda d: sum(m == 0 < w for _, m, w in pairs(d, "crossover")) > len(d.differ) / 2,
         "you say FSDP never loses (0.0) where it does: its bytes beyond (1 + m)·DDP's are "
         "positive there. FSDP sends 3(N−1)/N·4Ψ (each unit gathered twice and reduce-scattered "
         "once), DDP 2(N−1)/N·4Ψ"),
    Hint(lambda d: _latency(d) is not None, _latency_words),
    Hint(lambda d: d.want == float("inf") and _only_edges(d),
         f"here no time is left: {NO_TIME}"),
    Hint(lambda d: d.want == 0 and _only_edges(d), "here no bytes are "
         "extra: B_f − (1 + m)·B_d <= 0 (a margin of 0.5 or more) and time is left, so FSDP "
         "never loses: return 0.0"),
    Hint(_ring_factors, "right at N = 1, wrong at larger N even with no latency: look at the "
         "ring's factors of the bytes, B_d = 2(N−1)/N·4Ψ (one all-reduce) and B_f = "
         "3(N−1)/N·4Ψ (per unit an all-gather in forward, one in backward and a reduce-scatter, "
         "each (N−1)/N of its payload), computed as floats"),
    Hint(lambda d: _axis(d), lambda d: f"{right_wherever_words(d)}: look at "
         f"{AXES[_axis(d)][1]}"),
    Hint(lambda d: True, lambda d: (right_wherever_words(d) + "; " if right_wherever_words(d)
                                    else "") + "T(b) = C + L + B/b for each; B_d = 2(N−1)/N·4Ψ, "
         "B_f = 3(N−1)/N·4Ψ; solve T_f(b) = (1 + m)·T_d(b) for b"),
]

CHECK = Check("your crossover", _observe, configs=[], order=("crossover",),
              tolerance={"crossover": 1e-6}, hints=HINTS,
              words={"crossover": "predict_crossover(psi, world_size, units, compute_s, "
                                  "latency_us, margin)"},
              agreed="the α-β crossover of the reference, its edges (inf, 0.0) included")


def configs() -> list[Config]:
    family = spread(world_size=[1, 2, 3, 4, 8, 64], units=[1, 4, 64], psi=[3.2e6, 7e9],
                    compute_s=[0.0, 0.2, 2.0], latency_us=[0.0, 10.0, 2000.0],
                    margin=[0.0, 0.1, 0.5, 0.6, 2.0])
    return list(dict.fromkeys(family + [Config(zip(ARGS, s)) for s in SCENARIOS]))


def _reference():
    return load_solution("06_predict_crossover", "predict_crossover")


# What tests/wrong_answers/ judges many answers with: the lab's check, one batch
JUDGES = {"06_predict_crossover": lambda answers: CHECK.judge_many(answers, _reference(),
                                                                   configs())}


@verdict_of_check
def check_predict_crossover(fn) -> CheckResult:
    """Your ``predict_crossover(psi, world_size, units, compute_s, latency_us, margin)`` beside
    the reference on 1,620 jobs (the edges: FSDP never loses, always loses, exact ties, no time
    left) and the lab's six calls; the first job where they differ, and what the differing
    jobs share."""
    result = CheckResult(f"your crossover ({getattr(fn, '__name__', fn)})")
    if not_written_yet(fn):
        return result.wrong("not written yet", hint="replace `...` with your formula").finish()
    CHECK(fn, _reference(), result, configs=configs())
    return result.finish()
