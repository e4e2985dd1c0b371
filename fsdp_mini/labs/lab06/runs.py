"""Lab 06's measurements: the fsdp variants side by side on one link, the DDP/FSDP bandwidth
sweep, and what is read from them (the ledger's α-β costs, the fitted lines, a timeline).

    per_rank = fsdp_mini.launch(options_rank, N, "tiny", OPTION_VARIANTS, 4, Link(0.02, 200))
    alone = fsdp_mini.launch(crossover_rank, N, "tiny", [], 4, 50.0)      # no link
    kit = predict_from_ledger(alone, 50.0, margin=0.2)                    # C, L, B -> b*
    swept = fsdp_mini.launch(crossover_rank, N, "tiny", [kit["predicted"] / 4], 4, 50.0)
    crossover_table(swept, [kit["predicted"] / 4], kit, 0.2)              # fitted bytes
"""

from __future__ import annotations

import math
from functools import partial

from ...comm.ledger import ring_bytes
from ...comm.link import Link
from ...training import median_of_slowest

__all__ = ["OPTION_VARIANTS", "crossover_rank", "crossover_table", "ledger_costs",
           "measured_crossover", "options_rank", "predict_from_ledger", "solve_crossover",
           "timeline"]

# name: (units, fsdp options); units "root" (none: the root unit holds all), "blocks", "layers"
# (each block's attention and MLP: finer). Note: all on one link, so that waiting shows.
OPTION_VARIANTS = {"root only": ("root", {}), "blocks": ("blocks", {}),
                   "layers": ("layers", {}), "blocks, prefetch": ("blocks", {"prefetch": 1}),
                   "blocks, keep gathered": ("blocks", {"reshard_after_forward": False})}


# -- measurements (rank functions) ----------------------------------------------------------------

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


def _units(model, kind: str):
    if kind == "root":
        return None
    if kind == "blocks":
        return list(model.blocks)
    return [m for b in model.blocks for m in (b.attn, b.mlp)]


def _build(kind, strategy, options, link, cfg):
    import torch

    from ...api import parallelize
    from ...models import make_model
    m = make_model(cfg)
    units = _units(m, kind) if strategy == "fsdp" else None
    return parallelize(m, strategy, units=units, link=link,
                       optimizer=partial(torch.optim.AdamW, lr=1e-3), **options)


def _run(rank, world_size, cfg, models: dict, steps: int, global_batch: int) -> dict:
    """The models in turns (:func:`~fsdp_mini.training.train_in_turns`); step 0 is warm-up."""
    from ...models import SyntheticText
    from ...training import train_in_turns
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    return train_in_turns(models, lambda step: data.local_batch(step, global_batch, rank,
                                                                world_size), steps)


def options_rank(rank, world_size, model, variants, steps, link, global_batch=4) -> dict:
    """Each fsdp variant of ``variants`` ({name: (units, options)}) on ``link``: step seconds,
    compute, the last step's ledger records, and the peak of gathered parameters."""
    import torch

    from ...memory import track_memory
    from ...models import GPTConfig, SyntheticText
    from ...training import train_step
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model)
    models = {n: _build(kind, "fsdp", opts, link, cfg) for n, (kind, opts) in variants.items()}
    out = _run(rank, world_size, cfg, models, steps, global_batch)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    for name, (net, opt) in models.items():  # Note: one more step, alone, to read the peak
        with track_memory(net, opt) as mem:
            train_step(net, opt, data.local_batch(0, global_batch, rank, world_size))
        out[name]["gathered_peak"] = mem.peak_by_category["gathered_params"]
    return out


def crossover_rank(rank, world_size, model, bandwidths, steps, latency_us, global_batch=4) -> dict:
    """ddp and fsdp (units = blocks, no prefetch) on ``Link(b, latency_us)`` for each b (both
    without a link when ``bandwidths`` is empty: key None), in turns step by step:
    {(name, b): seconds, blocked, compute, records}."""
    import torch

    from ...models import GPTConfig
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model)
    out = {}
    for bw in bandwidths or [None]:
        link = Link(bw, latency_us) if bw else None
        models = {s: _build("blocks", s, {}, link, cfg) for s in ("ddp", "fsdp")}
        got = _run(rank, world_size, cfg, models, steps, global_batch)
        out.update({(s, bw): v for s, v in got.items()})
    return out


# -- analysis -------------------------------------------------------------------------------------

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


def _pale(color: str) -> str:
    """The colour mixed 70 % with white: opaque, so overlapping bars never blend into a new hue."""
    rgb = [int(color[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(v + 0.7 * (255 - v)):02x}" for v in rgb)


def timeline(per_rank: list[dict], names, ax=None):
    """Rank 0's last step of each variant: one lane per variant, one row per kind of collective,
    a bar per collective from its issue to its end (pale: the rank computed meanwhile; dark: the
    rank waited for it). Note: bars are opaque, so where two collectives of a row are in flight
    together (queued on the link), the later pale bar covers the earlier one's pale end."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    colors = {"all_gather": "#4C72B0", "reduce_scatter": "#DD8452", "all_reduce": "#55A868"}
    drawn = [op for op in colors if any(r["op"] == op for n in names for r in per_rank[0][n]["records"])]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * len(names) * len(drawn)), layout="constrained")
    row = 0.8 / max(len(drawn), 1)          # each op its own row inside a variant's lane
    for waiting in (False, True):  # Note: every pale bar first, so no wait is covered
        for lane, name in enumerate(names):
            recs = [r for r in per_rank[0][name]["records"] if r["op"] in colors]
            t0 = min(r["start"] for r in recs)
            for r in recs:
                y = lane - 0.4 + row * (drawn.index(r["op"]) + 0.5)
                start, end = (r["start"] - t0) * 1e3, (r["start"] - t0 + r["seconds"]) * 1e3
                if waiting:
                    start += r["waited"] * 1e3
                c = colors[r["op"]] if waiting else _pale(colors[r["op"]])
                ax.barh(y, end - start, left=start, height=row * 0.85, color=c)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlabel("ms since the step's first collective (rank 0)")
    ax.set_title("rank 0's collectives, each from its issue to its end")
    handles = [Patch(color=c, label=f"{op}: {what}") for op in drawn
               for c, what in ((colors[op], "rank waiting"), (_pale(colors[op]), "rank computing"))]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax
