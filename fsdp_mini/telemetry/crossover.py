"""The α-β model of a step, read from the ledger, and a bandwidth sweep fitted to it (lab 06, the
assessment's task 2): a step on a link of b GB/s takes T(b) = C + L + B/b, C the compute, L the
latency terms of its collectives, B the ring bytes one rank sends.

    lat, ring = ledger_costs(records, N, latency_us)        # L seconds, B bytes
    solve_crossover((C, L_f, B_f), (C, L_d, B_d), margin)   # GB/s below which FSDP loses
    kit = predict_from_ledger(per_rank, latency_us, margin) # C, L, B of a run without a link
    crossover_table(swept, bandwidths, kit, margin)         # the sweep beside the model
"""

from __future__ import annotations

import math

from ..comm.ledger import ring_bytes
from ..comm.link import Link
from ..training import median_of_slowest

__all__ = ["crossover_table", "ledger_costs", "measured_crossover", "predict_from_ledger",
           "solve_crossover"]


def solve_crossover(fsdp: tuple, ddp: tuple, margin: float) -> float:
    """GB/s below which FSDP's step is more than (1 + margin) × DDP's; each of ``fsdp``, ``ddp``
    is (C seconds, L seconds, B bytes) of one step. ``inf``: slower at every bandwidth; 0: never.

    >>> round(solve_crossover((0.2, 0.0018, 28.8e6), (0.2, 0.0003, 19.2e6), 0.1), 3)
    0.414
    """
    (c_f, l_f, b_f), (c_d, l_d, b_d) = fsdp, ddp
    num = b_f - (1 + margin) * b_d            # bytes that cost more, as b falls
    den = (1 + margin) * (c_d + l_d) - c_f - l_f  # the time the margin leaves for them
    if num <= 0:
        return 0.0 if den > 0 else math.inf
    return math.inf if den <= 0 else num / den / 1e9


def ledger_costs(records: list[dict], world_size: int, latency_us: float) -> tuple[float, float]:
    """(L seconds, B bytes) of one step's collectives, read from ledger records (as dicts):
    L = Σ latency terms, B = Σ ring bytes, so its α-β time on a link of b GB/s is L + B/(b·10⁹)."""
    alpha_only = Link(1.0, latency_us)
    return (sum(alpha_only.cost(r["op"], 0, world_size) for r in records),
            sum(ring_bytes(r["op"], r["payload_bytes"], world_size) for r in records))


def _slowest(per_rank: list[dict], key, what: str) -> float:
    return median_of_slowest([r[key][what] for r in per_rank])


def predict_from_ledger(per_rank: list[dict], latency_us: float, margin: float) -> dict:
    """The kit's prediction for a job measured without a link (:func:`crossover_rank` with no
    bandwidths): C, DDP's compute (the step less its time blocked; the same for both), and each
    strategy's L and B read from its ledger; the crossover by :func:`solve_crossover`; and
    ``no_link``, each strategy's measured step (median of the slowest rank)."""
    n = len(per_rank)
    compute = _slowest(per_rank, ("ddp", None), "compute")
    base = {s: (compute, *ledger_costs(per_rank[0][s, None]["records"], n, latency_us))
            for s in ("ddp", "fsdp")}
    # Note: the whole measured step too: it holds fixed costs C + L lacks (FSDP's more of them)
    no_link = {s: _slowest(per_rank, (s, None), "seconds") for s in ("ddp", "fsdp")}
    return {"base": base, "no_link": no_link,
            "predicted": solve_crossover(base["fsdp"], base["ddp"], margin)}


def crossover_table(per_rank: list[dict], bandwidths, prediction: dict, margin: float) -> dict:
    """The sweep measured beside ``prediction`` (:func:`predict_from_ledger`): per bandwidth,
    each step time (median, slowest rank), the model's C + L + B/b, and FSDP / DDP; per strategy
    the line T = a + B'/b through the measured times: ``fit`` holds (a, B'), a the strategy's
    measured step without a link (the line's b = ∞, so the line agrees with it), B' the bytes the
    link was *seen* to carry in a step (least squares in 1/b of what the link added). ``with_overhead`` is the α-β
    crossover again, with each strategy's measured step without a link (``no_link``: compute,
    latency, gloo's own time and FSDP's per-unit overhead) in place of C + L; ``inf`` when
    FSDP's overhead alone exceeds the margin.

    Note: run it on slow links, where the link's time is most of a step: near the crossover
    gloo's own time and a shared machine's noise are as large as what the link adds.
    """
    base, alone = prediction["base"], prediction["no_link"]
    rows = []
    for bw in bandwidths:
        row = {"bw": bw}
        for s in ("ddp", "fsdp"):
            c, lat, b = base[s]
            row[s] = _slowest(per_rank, (s, bw), "seconds")
            row[s + " model"] = c + lat + b / (bw * 1e9)
        row["ratio"], row["ratio model"] = row["fsdp"] / row["ddp"], row["fsdp model"] / row["ddp model"]
        rows.append(row)
    fit = {s: (alone[s], _slope([1 / (r["bw"] * 1e9) for r in rows],
                                [r[s] - alone[s] for r in rows])) for s in ("ddp", "fsdp")}
    measured = {s: (alone[s], 0.0, base[s][2]) for s in ("ddp", "fsdp")}
    return {"rows": rows, "fit": fit, "seen_bytes": {s: fit[s][1] for s in fit},
            "with_overhead": solve_crossover(measured["fsdp"], measured["ddp"], margin),
            "predicted": prediction["predicted"]}


def _slope(xs, ys) -> float:
    """The least-squares slope of the line through the origin and (x, y)."""
    return sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)


def measured_crossover(rows: list[dict], margin: float) -> float:
    """Where the measured FSDP / DDP ratio crosses 1 + margin, in GB/s: between the swept
    bandwidths that bracket it (log-interpolated), ``inf`` when FSDP loses at every one swept
    (none is fast enough), 0 when it loses at none. ``rows``: :func:`crossover_table`'s.

    >>> measured_crossover([{"bw": 0.1, "ratio": 1.44}, {"bw": 0.4, "ratio": 1.0}], 0.2)
    0.2
    """
    limit, rows = 1 + margin, sorted(rows, key=lambda r: r["bw"])
    if all(r["ratio"] > limit for r in rows):
        return math.inf
    if rows[0]["ratio"] <= limit:
        return 0.0
    lo, hi = next((a, b) for a, b in zip(rows, rows[1:]) if a["ratio"] > limit >= b["ratio"])
    f = math.log(lo["ratio"] / limit) / math.log(lo["ratio"] / hi["ratio"])
    return round(lo["bw"] * (hi["bw"] / lo["bw"]) ** f, 12)
