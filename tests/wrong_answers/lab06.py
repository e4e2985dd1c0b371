"""Lab 06's wrong answers: ``predict_crossover`` with one slip each, as a learner writes it.

Each is the α-β formula of the lab (T(b) = C + L + B/b, solved for T_f(b) = (1+m)·T_d(b)) with
one knob turned; none handles the edges (a first try rarely does), except the edge slips.
"""

import math

from fsdp_mini import labs

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


def check(**knobs):
    return lambda: labs.check_predict_crossover(slipped(**knobs))


def _inverted(psi, world_size, units, compute_s, latency_us, margin):
    return 1 / formula(psi, world_size, units, compute_s, latency_us, margin, edges=False)


def _no_inf(*args):
    return formula(*args, edges=False)


def _no_zero(psi, n, units, c, alpha_us, m):
    a, ring = alpha_us * 1e-6, (n - 1) / n
    num = 3 * ring * 4 * psi - (1 + m) * 2 * ring * 4 * psi
    den = (1 + m) * (c + 2 * (n - 1) * a) - c - 3 * units * (n - 1) * a
    return math.inf if den <= 0 else num / den / 1e9   # the extra bytes' edge missed


WRONG = [
    Wrong(EX, "FSDP's bytes counted as DDP's 2Ψ", check(fsdp_psi=2),
          ("fsdp's traffic counted as ddp's 2ψ",)),
    Wrong(EX, "the ring's (N−1)/N left out", check(ring=1.0), ("(n−1)/n of the ring is missing",)),
    Wrong(EX, "latency left out", check(alpha=0.0), ("latency left out",)),
    Wrong(EX, "FSDP's communication assumed hidden (C_f = 0)", check(fsdp_c=0.0),
          ("assumed hidden behind its compute",)),
    Wrong(EX, "bits for bytes", check(unit=1e9 / 8), ("bits and bytes mixed up",)),
    Wrong(EX, "GiB/s for GB/s", check(unit=2**30), ("gib/s instead of gb/s",)),
    Wrong(EX, "answer in B/s", check(unit=1), ("the answer is in b/s",)),
    Wrong(EX, "bandwidth on the wrong side (1/b*)", lambda: labs.check_predict_crossover(_inverted),
          ("bandwidth multiplied where it divides",)),
    Wrong(EX, "α paid once per collective, not N−1 times", check(hops=1),
          ("once per collective", "its latency is (n−1)α, not α")),
    Wrong(EX, "FSDP's latency counted once, not per unit", check(per_unit=False),
          ("once per step", "every unit")),
    Wrong(EX, "2 collectives per unit (the backward all-gather forgotten)", check(fsdp_calls=2),
          ("2 collectives per unit", "backward all-gather")),
    Wrong(EX, "DDP's all-reduce charged (N−1)α, not 2(N−1)α", check(ddp_calls=1),
          ("all-reduce", "2(n−1)α")),
    Wrong(EX, "the margin on FSDP's side", check(margin_on="fsdp"),
          ("margin on the wrong side",)),
    Wrong(EX, "margin 0: no return math.inf (a negative crossover)",
          lambda: labs.check_predict_crossover(_no_inf), ("margin 0: you say", "return math.inf")),
    Wrong(EX, "margin 0.6: no return 0.0 (a negative crossover)",
          lambda: labs.check_predict_crossover(_no_zero),
          ("margin 0.6: you say -", "never loses by 60 %", "return 0.0")),
]
