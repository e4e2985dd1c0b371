"""DDP vs FSDP on a simulated network: below which bandwidth does FSDP's 1.5× traffic cost?

    python benchmarks/link_crossover.py [--quick] [--out build/link_crossover.png]
                                        [--latency-us 50] [--world-size 4]

One launch (gloo). Every rank trains the GPT under ddp, fsdp and fsdp with ``prefetch=1``,
without a link (before and after the sweep) and on
``fsdp_mini.Link(bandwidth_gbs=b, latency_us=α)`` for each b of the sweep. It prints, per
bandwidth, the median step time of each variant beside the α-β model's prediction and their ratio,
finds the crossover, and saves a plot of step time against bandwidth.

The model. Without a link a step takes C + R: C the compute, R the time it was blocked in
collectives (gloo's own time; the dashboard's timeline splits a step the same way). On a link,
M(b) = Σ over one step's collectives of Link.cost(op, payload, N), the payloads read from the
ledger (the ring model: (N-1)α + (N-1)/N·bytes/b per all-gather or reduce-scatter, twice that per
all-reduce), and ``wait()`` returns at the later of gloo and the link, so
- ddp and fsdp without prefetch: T = C + max(R, M(b)). Nothing overlaps: fsdp waits for each
  all-gather, its reduce-scatters share the one link with the next all-gather, and at this model
  size the default 25 MB bucket holds the whole gradient, so DDP's one all-reduce starts after
  backward;
- fsdp with prefetch: T = C + max(R, M(b) − C), perfect overlap (a lower bound: the first
  gather and the last reduce-scatter cannot hide).

The variants take turns step by step (a slow spell of the machine falls on all alike), so each
step gives a gap, FSDP's step time less DDP's. The crossover: FSDP's traffic costs at b when its
excess, the median gap at b less the median gap without a link, is above the noise: the spread
(median absolute deviation) of the gaps at b plus that of the gaps without a link. The model's
crossover is where its own excess equals the median noise.

Note: with more ranks than cores (4 on 2), a rank asleep on the simulated link gives its core to
the others, so the measured time can be below the model (ratio < 1).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from functools import partial

import torch

import fsdp_mini
from fsdp_mini.comm.ledger import ring_bytes
from fsdp_mini.models import GPTConfig, SyntheticText, make_model
from fsdp_mini.training import train_in_turns

FULL = {"model": "default", "bandwidths": (0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1.0, 10.0),
        "steps": 7}
QUICK = {"model": "tiny", "bandwidths": (0.001, 0.005, 0.02, 0.1, 1.0), "steps": 7}
WARMUP = 1


def sweep_rank(rank: int, world_size: int, variants, spec: dict) -> dict:
    """{(variant, bandwidth or None): step seconds, compute seconds (the step less the time
    blocked in collectives), and the collectives of one step}."""
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(spec["model"])
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    out = {}
    for bw in (None, *spec["bandwidths"], None):  # Note: no link first and last, against drift
        models = {}
        for name, strategy, options in variants:
            link = fsdp_mini.Link(bw, spec["latency_us"]) if bw else None
            m = make_model(cfg)
            models[name] = fsdp_mini.parallelize(m, strategy, units=list(m.blocks), link=link,
                                                 optimizer=partial(torch.optim.AdamW, lr=1e-3),
                                                 **options)
        # Note: the variants take turns, step by step, so a slow spell of the machine falls on
        # all of them alike (train_in_turns).
        got = train_in_turns(models, lambda step: data.local_batch(
            step, spec["global_batch"], rank, world_size), spec["steps"], warmup=WARMUP)
        for name, times in got.items():  # Note: no link twice: both runs in one row
            row = out.setdefault((name, bw), {"seconds": [], "compute": []})
            row["seconds"] += times["seconds"]
            row["compute"] += times["compute"]
            row["ops"] = [(r["op"], r["payload_bytes"]) for r in times["records"]]
    return out


# -- the model --------------------------------------------------------------------------------

def comm_model(ops, world_size: int, latency_us: float) -> tuple[float, float]:
    """(L, B) of one step: M(b) = L + B / (b·10⁹), latency seconds and ring bytes."""
    alpha_only = fsdp_mini.Link(1.0, latency_us)
    latency = sum(alpha_only.cost(op, 0, world_size) for op, _ in ops)
    return latency, sum(ring_bytes(op, payload, world_size) for op, payload in ops)


def predict(name: str, base: tuple[float, float], model: tuple[float, float], bw) -> float:
    """T = C + max(R, M(b) - overlap): the rank waits for the later of gloo and the link; only
    prefetch overlaps (perfectly: overlap = C). ``bw`` None: no link, T = C + R."""
    compute, real = base
    if bw is None:
        return compute + real
    comm = model[0] + model[1] / (bw * 1e9)
    return compute + max(real, comm - (compute if "prefetch" in name else 0.0))


def spread(xs) -> float:
    """The median absolute deviation: a spread that one step slowed by the machine leaves be."""
    mid = statistics.median(xs)
    return statistics.median(abs(x - mid) for x in xs)


def _gaps(times: dict, bw) -> list[float]:
    """FSDP's time less DDP's, step by step (they ran side by side)."""
    return [f - d for f, d in zip(times["fsdp", bw], times["ddp", bw])]


def crossover(bandwidths, above) -> float | None:
    """The bandwidth where ``above(b)`` (excess − noise) turns from > 0 to <= 0, going up,
    interpolated in log b; None if it never does inside the sweep."""
    values = [above(b) for b in bandwidths]
    for (b0, v0), (b1, v1) in zip(zip(bandwidths, values), zip(bandwidths[1:], values[1:])):
        if v0 > 0 >= v1:
            t = v0 / (v0 - v1)
            return math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0)))
    return None


def analyse(per_rank: list[dict], names: list[str], world_size: int, latency_us: float,
            bandwidths) -> dict:
    # Note: a step ends for the job when its slowest rank ends it.
    seconds, computes = ({key: [max(s) for s in zip(*(r[key][what] for r in per_rank))]
                          for key in per_rank[0]} for what in ("seconds", "compute"))
    median = {key: statistics.median(v) for key, v in seconds.items()}
    compute = {n: statistics.median(computes[n, None]) for n in names}
    base = {n: (compute[n], median[n, None] - compute[n]) for n in names}  # (C, R)
    models = {n: comm_model(per_rank[0][n, None]["ops"], world_size, latency_us) for n in names}
    rows = []
    for bw in bandwidths:
        row = {"bw": bw}
        for n in names:
            pred = predict(n, base[n], models[n], bw)
            row[n] = (median[n, bw], pred, median[n, bw] / pred)
        gap, gap0 = _gaps(seconds, bw), _gaps(seconds, None)
        row["excess"] = statistics.median(gap) - statistics.median(gap0)
        row["noise"] = spread(gap) + spread(gap0)
        rows.append(row)
    by_bw = {row["bw"]: row for row in rows}
    noise = statistics.median(row["noise"] for row in rows)
    def excess(b):  # the model's
        return ((predict("fsdp", base["fsdp"], models["fsdp"], b)
                 - predict("ddp", base["ddp"], models["ddp"], b))
                - (predict("fsdp", base["fsdp"], None, None)
                   - predict("ddp", base["ddp"], None, None)))
    grid = [10 ** (k / 50) for k in range(-250, 151)]  # 1e-5 … 1e3 GB/s
    return {"rows": rows, "base": base, "models": models, "noise": noise,
            "measured": crossover(bandwidths, lambda b: by_bw[b]["excess"] - by_bw[b]["noise"]),
            "predicted": crossover(grid, lambda b: excess(b) - noise),
            "traffic_ratio": models["fsdp"][1] / models["ddp"][1]}


# -- output -----------------------------------------------------------------------------------

def table(result: dict, names: list[str]) -> str:
    head = f"{'GB/s':>6} " + " ".join(f"{n + ' ms':>14} {'pred':>6} {'ratio':>5}" for n in names)
    head += f" {'excess ms':>9} {'noise ms':>8}"
    lines = [head, "-" * len(head)]
    for row in result["rows"]:
        cells = " ".join(f"{row[n][0] * 1e3:14.1f} {row[n][1] * 1e3:6.1f} {row[n][2]:5.2f}"
                         for n in names)
        lines.append(f"{row['bw']:6g} {cells} {row['excess'] * 1e3:9.1f} "
                     f"{row['noise'] * 1e3:8.1f}")
    lines.append(f"{'none':>6} " + " ".join(
        f"{sum(result['base'][n]) * 1e3:14.1f} {result['base'][n][0] * 1e3:6.1f} {'':5}"
        for n in names) + "   (no link: step; C, the step less its time blocked)")
    return "\n".join(lines)


def plot(result: dict, names: list[str], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bws = [row["bw"] for row in result["rows"]]
    fine = [bws[0] * (bws[-1] / bws[0]) ** (i / 99) for i in range(100)]
    for n, color in zip(names, ("tab:blue", "tab:orange", "tab:green")):
        ax.plot(bws, [row[n][0] * 1e3 for row in result["rows"]], "o", color=color,
                label=f"{n} measured")
        ax.plot(fine, [predict(n, result["base"][n], result["models"][n], b) * 1e3
                       for b in fine], "--", color=color, lw=1, label=f"{n} α-β model")
    if result["measured"]:
        ax.axvline(result["measured"], color="grey", lw=1,
                   label=f"crossover measured {result['measured']:.3g} GB/s")
    if result["predicted"]:
        ax.axvline(result["predicted"], color="grey", lw=1, ls=":",
                   label=f"crossover model {result['predicted']:.3g} GB/s")
    ax.set(xscale="log", yscale="log", xlabel="link bandwidth (GB/s)", ylabel="step time (ms)",
           title=title)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.legend(fontsize=7)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _where(result: dict) -> str:
    if result["measured"]:
        return f"below {result['measured']:.3g} GB/s"
    rows = result["rows"]
    if all(row["excess"] > row["noise"] for row in rows):
        return f"at every bandwidth of the sweep (up to {rows[-1]['bw']:g} GB/s)"
    return f"at no bandwidth of the sweep (down to {rows[0]['bw']:g} GB/s)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI size: tiny GPT, 5 bandwidths")
    parser.add_argument("--out", default="build/link_crossover.png", help="where the plot goes")
    parser.add_argument("--latency-us", type=float, default=50.0)
    parser.add_argument("--world-size", type=int, default=4)
    args = parser.parse_args(argv)
    spec = {**(QUICK if args.quick else FULL), "latency_us": args.latency_us, "global_batch": 8}
    variants = [("ddp", "ddp", {}), ("fsdp", "fsdp", {}), ("fsdp+prefetch", "fsdp", {"prefetch": 1})]
    names = [v[0] for v in variants]
    started = time.perf_counter()
    per_rank = fsdp_mini.launch(sweep_rank, args.world_size, variants, spec, timeout=300)
    result = analyse(per_rank, names, args.world_size, args.latency_us, spec["bandwidths"])
    params = make_model(GPTConfig.sized(spec["model"])).num_params()
    print(f"{spec['model']} GPT ({params:,} parameters), world size {args.world_size} (gloo), "
          f"latency {args.latency_us:g} µs, median of {spec['steps'] - WARMUP} steps "
          f"(slowest rank); FSDP sends {result['traffic_ratio']:.2f}x DDP's bytes")
    print(table(result, names))
    print(f"crossover: FSDP's extra traffic costs more than noise {_where(result)} "
          f"(measured); the α-β model says {result['predicted'] or math.nan:.3g} GB/s for the "
          f"median noise "
          f"{result['noise'] * 1e3:.1f} ms")
    ratios = [row[n][2] for row in result["rows"] for n in names]
    print(f"measured / predicted: {min(ratios):.2f} to {max(ratios):.2f} "
          f"(median {statistics.median(ratios):.2f}); {time.perf_counter() - started:.0f} s")
    plot(result, names, args.out, f"{spec['model']} GPT, N = {args.world_size}, "
                                  f"α = {args.latency_us:g} µs")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
