"""Lab 06: making FSDP fast: units, prefetch, reshard_after_forward, and the bandwidth below which
FSDP is slower than DDP.

    labs.check_predict_crossover(predict_crossover)    # ✔/✘ against the kit's α-β model
    labs.alpha_beta_crossover(3.2e6, 4, 4, 0.2, 50, 0.1)  # the kit's own answer: 0.414 GB/s

The measurements (the variants on one link, the bandwidth sweep) are in ``runs.py``.

The α-β model (``fsdp_mini.Link`` charges exactly this): a step takes T(b) = C + L + B/b, C the
compute, L the latency terms ((N-1)α per all-gather or reduce-scatter, 2(N-1)α per all-reduce),
B the ring bytes one rank sends (``ring_bytes`` of the ledger's payloads), b the bandwidth. FSDP
without prefetch waits for every collective, and DDP at this size sends one bucket after
backward, so neither hides its communication. "FSDP is slower" means: its step takes more than
(1 + margin) × DDP's. Solving T_f(b) = (1 + m)·T_d(b) for b::

    b* = (B_f − (1+m)·B_d) / ((1+m)·(C_d + L_d) − C_f − L_f)

Example: Ψ = 3.2 M, N = 4, 4 units, C = 0.2 s, α = 50 µs, m = 0.1: B_d = 2·¾·12.8 MB = 19.2 MB,
B_f = 28.8 MB, L_d = 0.3 ms, L_f = 12·3·50 µs = 1.8 ms; b* = 7.68 MB / 18.53 ms = 0.414 GB/s.
"""

from __future__ import annotations

import math

from ..common.report import CheckResult
from .runs import (OPTION_VARIANTS, crossover_rank, crossover_table, ledger_costs,
                   measured_crossover, options_rank, predict_from_ledger, solve_crossover, timeline)

__all__ = ["OPTION_VARIANTS", "alpha_beta_crossover", "check_predict_crossover", "crossover_rank",
           "crossover_table", "ledger_costs", "measured_crossover", "options_rank",
           "predict_from_ledger",
           "solve_crossover", "timeline"]


def alpha_beta_crossover(psi: float, world_size: int, units: int, compute_s: float,
                         latency_us: float, margin: float, mistake: str | None = None) -> float:
    """The kit's answer to the exercise (fp32: 4 B per parameter), or, with ``mistake``, what a
    typical slip gives (see ``MISTAKES``). FSDP: 3 collectives per unit (forward all-gather,
    backward all-gather, reduce-scatter), 3Ψ in all; DDP: one all-reduce, 2Ψ.

    >>> round(alpha_beta_crossover(3.2e6, 4, 4, 0.2, 50, 0.1), 3)
    0.414
    """
    n, alpha, payload = world_size, latency_us * 1e-6, 4 * psi
    ring = 1.0 if mistake == "ring" else (n - 1) / n
    b_d, b_f = 2 * ring * payload, (2 if mistake == "2psi" else 3) * ring * payload
    if mistake == "latency":
        alpha = 0.0
    hops = 1 if mistake == "alpha once" else n - 1          # messages of a ring collective
    calls = {"unit once": 3 / units, "2 per unit": 2}.get(mistake, 3)  # FSDP's, per unit
    l_d = (1 if mistake == "all-reduce once" else 2) * hops * alpha
    l_f = calls * units * hops * alpha
    c_f = 0.0 if mistake == "overlap" else compute_s  # FSDP's T = max(C, comm): comm dominates
    if mistake == "margin on fsdp":  # (1 + m)·T_f(b) = T_d(b): the margin multiplies FSDP's step
        m = 1 + margin
        num, den = m * b_f - b_d, compute_s + l_d - m * (c_f + l_f)
        b = (0.0 if den > 0 else math.inf) if num <= 0 else (
            math.inf if den <= 0 else num / den / 1e9)
    else:
        b = solve_crossover((c_f, l_f, b_f), (compute_s, l_d, b_d), margin)
    return {"bits": b * 8, "gib": b * 1e9 / 2**30, "bytes_per_s": b * 1e9,
            "inverted": 1 / b if 0 < b < math.inf else b}.get(mistake, b)


MISTAKES = {
    "2psi": ("FSDP's traffic counted as DDP's 2Ψ: then FSDP never sends more than DDP",
             ("FSDP gathers each unit twice (forward and backward) and reduce-scatters its "
             "gradient once: 3 collectives of Ψ, 3Ψ, against DDP's one all-reduce of 2Ψ")),
    "ring": ("the (N−1)/N of the ring is missing: each rank sends (N−1)/N of the payload",
             ("an all-gather or reduce-scatter sends (N−1)/N × payload per rank, an all-reduce "
             "twice that (fsdp_mini.comm.ledger.ring_bytes)")),
    "latency": (("latency left out: each collective also costs (N−1)α, and FSDP issues many more "
                "of them than DDP"), "add L = 3·units·(N−1)α for FSDP and 2(N−1)α for DDP"),
    "overlap": (("FSDP's communication assumed hidden behind its compute: without prefetch it "
                "waits for every collective"), "T_fsdp = C + L_f + B_f/b, like DDP's, not max(C, …)"),
    "alpha once": (("α paid once per collective: a ring collective sends N−1 messages, each "
                    "paying α once: its latency is (N−1)α, not α"),
                   "L_d = 2(N−1)α for the all-reduce, L_f = 3·units·(N−1)α for FSDP"),
    "unit once": (("FSDP's latency counted once per step, not for every unit: each unit issues "
                   "its own 3 collectives"), "L_f = 3·units·(N−1)α: 3 collectives for every unit"),
    "2 per unit": (("2 collectives per unit in FSDP's latency: the backward all-gather is "
                    "missing (each unit is gathered again for backward: 3 per unit)"),
                   "L_f = 3·units·(N−1)α: forward all-gather, backward all-gather, reduce-scatter"),
    "all-reduce once": (("DDP's all-reduce charged (N−1)α: an all-reduce is a reduce-scatter then "
                         "an all-gather, 2(N−1) messages, 2(N−1)α"), "L_d = 2(N−1)α"),
    "margin on fsdp": (("the margin on the wrong side: FSDP loses when T_f(b) > (1 + m)·T_d(b); "
                        "the (1 + m) multiplies DDP's step, not FSDP's"),
                       "solve C_f + L_f + B_f/b = (1+m)(C_d + L_d + B_d/b) for b"),
    "bits": ("off by 8: bits and bytes mixed up", "the ledger and Link count bytes; GB/s = 10⁹ B/s"),
    "gib": ("off by 1e9/2³⁰ = 0.93: GiB/s instead of GB/s", "Link's bandwidth_gbs is 10⁹ B/s"),
    "bytes_per_s": ("the answer is in B/s: divide by 10⁹ for GB/s", ""),
    "inverted": ("bandwidth multiplied where it divides: time = bytes / bandwidth",
                 "solve C_f + L_f + B_f/b = (1+m)(C_d + L_d + B_d/b) for b"),
}

# (Ψ, N, units, C seconds, α µs, margin): a laptop GPT, a tiny one, a large job, a latency-bound
# one; then the two calls the lab makes after the check: its own GPT (5 units, margin 0.2, with a
# compute of the order section 3 measures) and the 7B job of section 4
SCENARIOS = [(3.2e6, 4, 4, 0.2, 50.0, 0.1), (30e3, 2, 2, 0.01, 50.0, 0.1),
             (1e9, 8, 32, 2.0, 10.0, 0.05), (1e8, 16, 48, 0.5, 20.0, 0.1),
             (3.2e6, 4, 5, 0.02, 50.0, 0.2), (7e9, 64, 64, 2.0, 10.0, 0.10)]


def check_predict_crossover(fn) -> CheckResult:
    """Your ``predict_crossover(psi, world_size, units, compute_s, latency_us, margin)`` against
    :func:`alpha_beta_crossover` on six jobs (the last two as the lab calls it after the check);
    a wrong answer is matched to a typical mistake."""
    from ..common.exercise import not_written_yet
    result = CheckResult(f"your crossover ({getattr(fn, '__name__', fn)})")
    if not_written_yet(fn):
        return result.wrong("not written yet", hint="replace `...` with your formula").finish()
    got = []
    for s in SCENARIOS:
        try:
            got.append(float(fn(*s)))
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            return result.wrong(f"predict_crossover{s} raised {type(e).__name__}: {e}").finish()
    want = [alpha_beta_crossover(*s) for s in SCENARIOS]
    if all(_near(g, w) for g, w in zip(got, want)):
        result.ok(f"the crossover of all {len(SCENARIOS)} jobs matches the α-β model: " +
                  ", ".join(f"{w:.3g} GB/s" for w in want))
        return _check_edges(result, fn).finish()
    bad = next(i for i, (g, w) in enumerate(zip(got, want)) if not _near(g, w))
    said = (f"Ψ = {SCENARIOS[bad][0]:.3g}, N = {SCENARIOS[bad][1]}, {SCENARIOS[bad][2]} units: "
            f"you say {got[bad]:.4g} GB/s, the α-β model {want[bad]:.4g} GB/s")
    for key, (what, hint) in MISTAKES.items():
        # Note: with 2Ψ the extra bytes are negative: a raw formula gives b* <= 0
        if all(_near(g, alpha_beta_crossover(*s, mistake=key)) or (key == "2psi" and g <= 0)
               for g, s in zip(got, SCENARIOS)):
            return result.wrong(f"{said}: {what}", hint=hint).finish()
    return result.wrong(said, hint="T(b) = C + L + B/b for each; B_d = 2(N−1)/N·4Ψ, B_f = "
                        "3(N−1)/N·4Ψ; solve T_f(b) = (1+m)·T_d(b) for b").finish()


def _check_edges(result: CheckResult, fn) -> CheckResult:
    """The two edges of the formula, on the laptop job (Ψ = 3.2 M, N = 4, 4 units, C = 0.2 s):
    margin 0: same compute, more bytes and more latency: FSDP loses at every bandwidth (inf);
    margin 0.6: FSDP sends at most 1.5x DDP's bytes, so the bytes never cost it 60 % (0.0)."""
    for margin, want, why, hint in (
            (0.0, math.inf, "with the same compute, more bytes and more latency FSDP is slower "
             "at every bandwidth", "when the time the margin leaves is ≤ 0, return math.inf"),
            (0.6, 0.0, "FSDP sends at most 1.5x DDP's bytes and its latency fits in the margin: "
             "it never loses by 60 %", "when FSDP's bytes are within (1 + margin) × DDP's "
             "(margin ≥ 0.5) and time is left, return 0.0")):
        said = "inf" if want == math.inf else "0 GB/s: FSDP never loses"
        try:
            got = float(fn(3.2e6, 4, 4, 0.2, 50.0, margin))
        except Exception as e:  # noqa: BLE001
            result.wrong(f"with margin {margin:g} your function raised {type(e).__name__}: {e}",
                         hint=hint)
            continue
        result.check(got == want, f"margin {margin:g}: {said} ({why})",
                     f"margin {margin:g}: you say {got:.4g} GB/s, but {why}", hint=hint)
    return result


def _near(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= 0.015 * abs(b) + 1e-12

