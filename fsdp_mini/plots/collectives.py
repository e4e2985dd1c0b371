"""Collectives drawn: what each rank held before and after one (a table), and an all-reduce
sweep, time and bus bandwidth against message size (lab 02).

    show_collective("all-reduce", before, after)      # rank -> before -> after
    plot_bandwidth(rows, {"one GPT block": nbytes})   # rows of telemetry.bandwidth's sweep
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from ..telemetry.bandwidth import bandwidth_summary
from ..telemetry.units import fmt_bytes, fmt_rate, fmt_seconds

__all__ = ["plot_bandwidth", "show_collective"]


def show_collective(title: str, before: list, after: list) -> None:
    """Print one row per rank: what it held before the collective, and after it."""
    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} ranks, after {len(after)}: one value each")
    short = [["[" + " ".join(f"{v:g}" for v in torch.as_tensor(t).flatten().tolist()) + "]"
              for t in pair] for pair in zip(before, after)]
    w = max(len("before"), *(len(b) for b, _ in short))
    print(f"{title}\n  rank  {'before':<{w}}  after")
    for r, (b, a) in enumerate(short):
        print(f"  {r:<4}  {b:<{w}}  {a}")


def plot_bandwidth(rows: list[dict], marks: dict | None = None) -> Figure:
    """Time and busbw against message size, log-log; ``marks`` {label: bytes} adds lines."""
    rows, summary = sorted(rows, key=lambda r: r["bytes"]), bandwidth_summary(rows)
    fig, sizes = Figure(figsize=(11, 3.6), layout="constrained"), [r["bytes"] for r in rows]
    ax_t, ax_b = fig.subplots(1, 2)
    ax_t.loglog(sizes, [r["seconds"] * 1e6 for r in rows], "o-", color="#F4A261")
    ax_t.axhline(summary["latency_floor"] * 1e6, color="grey", ls=":", label=f"latency floor "
                 f"{fmt_seconds(summary['latency_floor'])} (the median up to "
                 f"{fmt_bytes(sizes[summary['small_sizes'] - 1])})")
    ax_t.set(xlabel="message size (bytes)", ylabel="µs per all-reduce",
             title="Time: latency for small messages, then ∝ size")
    ax_b.semilogx(sizes, [r["busbw"] / 1e9 for r in rows], "o-", color="#2A9D8F")
    ax_b.axvline(summary["n_half"], color="grey", ls=":",
                 label=f"half of peak from {fmt_bytes(summary['n_half'])}")
    ax_b.set(xlabel="message size (bytes)", ylabel="busbw (GB/s)",
             title=f"Bus bandwidth (peak {fmt_rate(summary['peak_busbw'])})")
    for label, nbytes in (marks or {}).items():
        ax_b.axvline(nbytes, color="#C44E52", ls="--", label=label)
    ax_t.legend(fontsize=8), ax_b.legend(fontsize=8)
    return fig
