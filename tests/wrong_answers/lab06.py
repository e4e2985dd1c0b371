"""Lab 06's wrong answers: ``predict_crossover`` with one slip each, as a learner writes it,
judged in one batch by the lab's check (``JUDGES``).

Each is the α-β formula of the lab (T(b) = C + L + B/b, solved for T_f(b) = (1+m)·T_d(b)) with
one knob turned, edges handled; the edge slips handle one edge wrongly.
"""

import math

from . import Wrong

EX = "06_predict_crossover"


def formula(psi, n, units, c, alpha_us, m, *, fsdp_psi=3, ring=None, alpha=None, fsdp_c=None,
            unit=1e9, hops=None, per_unit=True, fsdp_calls=3, ddp_calls=2, margin_on="ddp",
            edges=True):
    """The reference with knobs: ``hops`` the messages of a ring (N−1), ``fsdp_calls`` the
    collectives per unit, ``ddp_calls`` the latency terms of the all-reduce."""
    ring = (n - 1) / n if ring is None else ring
    a = alpha_us * 1e-6 if alpha is None else alpha
    hops = n - 1 if hops is None else hops
    b_d, b_f = 2 * ring * 4 * psi, fsdp_psi * ring * 4 * psi
    l_d = ddp_calls * hops * a
    l_f = fsdp_calls * (units if per_unit else 1) * hops * a
    c_f = c if fsdp_c is None else fsdp_c
    if margin_on == "fsdp":      # (1 + m) on the wrong side: T_d(b)·(1+m)... written T_f·(1+m)
        num, den = (1 + m) * b_f - b_d, c + l_d - (1 + m) * (c_f + l_f)
    else:
        num, den = b_f - (1 + m) * b_d, (1 + m) * (c + l_d) - c_f - l_f
    if edges:
        if num <= 0:
            return 0.0 if den > 0 else math.inf
        if den <= 0:
            return math.inf
    return num / den / unit


def slipped(**knobs):
    def predict_crossover(psi, world_size, units, compute_s, latency_us, margin):
        return formula(psi, world_size, units, compute_s, latency_us, margin, **knobs)
    return predict_crossover


def _inverted(psi, world_size, units, compute_s, latency_us, margin):
    """The time left over the bytes: b* upside down (the edges kept)."""
    b = formula(psi, world_size, units, compute_s, latency_us, margin)
    return 1 / b if 0 < b < math.inf else b


def _no_inf(*args):
    return formula(*args, edges=False)


def _no_zero(psi, n, units, c, alpha_us, m):
    a, ring = alpha_us * 1e-6, (n - 1) / n
    num = 3 * ring * 4 * psi - (1 + m) * 2 * ring * 4 * psi
    den = (1 + m) * (c + 2 * (n - 1) * a) - c - 3 * units * (n - 1) * a
    return math.inf if den <= 0 else num / den / 1e9   # the extra bytes' edge missed


def _zero_without_time(psi, n, units, c, alpha_us, m):
    """No bytes extra: 0.0, whether or not time is left (the boundary without its condition)."""
    value = formula(psi, n, units, c, alpha_us, m)
    extra = 3 * (n - 1) / n * 4 * psi - (1 + m) * 2 * (n - 1) / n * 4 * psi
    return 0.0 if extra <= 0 else value


def _strict_edges(psi, n, units, c, alpha_us, m):
    """No time left written as < 0: an exact tie (N = 1, margin 0) falls through."""
    a, ring = alpha_us * 1e-6, (n - 1) / n
    num = 3 * ring * 4 * psi - (1 + m) * 2 * ring * 4 * psi
    den = (1 + m) * (c + 2 * (n - 1) * a) - c - 3 * units * (n - 1) * a
    if num <= 0:
        return 0.0 if den >= 0 else math.inf
    return math.inf if den < 0 else num / den / 1e9 if den else math.inf


WRONG = [
    Wrong(EX, "FSDP's bytes counted as DDP's 2Ψ", slipped(fsdp_psi=2),
          ("you say fsdp never loses (0.0) where it does", "3(n−1)/n·4ψ")),
    Wrong(EX, "the ring's (N−1)/N left out", slipped(ring=1.0),
          ("n/(n−1) times the reference's", "the (n−1)/n of the ring is missing")),
    Wrong(EX, "latency left out", slipped(alpha=0.0),
          ("your fsdp latency is 0·units·(n−1)α", "ddp's 0·(n−1)α")),
    Wrong(EX, "FSDP's communication assumed hidden (C_f = 0)", slipped(fsdp_c=0.0),
          ("right in every configuration with compute s 0", "a sum, not max")),
    Wrong(EX, "bits for bytes", slipped(unit=1e9 / 8), ("8x the reference's", "bits per second")),
    Wrong(EX, "GiB/s for GB/s", slipped(unit=2**30), ("gib/s (2³⁰ b/s), not gb/s",)),
    Wrong(EX, "answer in B/s", slipped(unit=1), ("1e+09x the reference's", "bytes per second")),
    Wrong(EX, "bandwidth on the wrong side (1/b*)", _inverted,
          ("1 / the reference's", "multiplies where it divides")),
    Wrong(EX, "α paid once per collective, not N−1 times", slipped(hops=1),
          ("right in every configuration with world size 2", "n − 1 messages, each paying α")),
    Wrong(EX, "FSDP's latency counted once, not per unit", slipped(per_unit=False),
          ("your fsdp latency is 0·units·(n−1)α + 3·(n−1)α once a step",)),
    Wrong(EX, "2 collectives per unit (the backward all-gather forgotten)", slipped(fsdp_calls=2),
          ("your fsdp latency is 2·units·(n−1)α", "one in backward")),
    Wrong(EX, "DDP's all-reduce charged (N−1)α, not 2(N−1)α", slipped(ddp_calls=1),
          ("ddp's 1·(n−1)α", "2(n−1)α (an all-reduce")),
    Wrong(EX, "the margin on FSDP's side", slipped(margin_on="fsdp"),
          ("right in every configuration with margin 0", "multiplies ddp's step")),
    Wrong(EX, "no time left: no math.inf (a negative crossover)", _no_inf,
          ("raised zerodivisionerror", "no time is left", "return math.inf")),
    Wrong(EX, "no bytes extra: no 0.0 (a negative crossover)", _no_zero,
          ("the reference 0", "no bytes are extra", "return 0.0")),
    Wrong(EX, "no bytes extra: 0.0 even when no time is left", _zero_without_time,
          ("yours 0, the reference inf", "no time is left", "return math.inf")),
    Wrong(EX, "an exact tie (no time left, no bytes extra) called 'never loses'", _strict_edges,
          ("yours 0, the reference inf", "no time is left")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("06")
