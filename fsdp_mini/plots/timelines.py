"""Figures along time: memory through a step, and compute against communication per rank."""

from __future__ import annotations

from matplotlib.figure import Figure

from ..memory import CATEGORIES
from ..telemetry.runstate import RunState
from ..telemetry.units import fmt_link, fmt_seconds
from .style import (CATEGORY_COLORS, CATEGORY_NAMES, COMPUTE_COLOR, OP_COLORS, _ax, _byte_axis,
                    _legend_below, _rank_axis, _theory_lines, as_run, rank_color)


def memory_timeline(data, ax=None, steps: int = 2, rank: int = 0, legend: bool = True) -> Figure:
    """Memory over the last ``steps`` steps: ``rank`` stacked by category, every rank's total."""
    run, ax = as_run(data), _ax(ax, (7, 3.5))
    shown = run.recent_memory_steps(steps)
    points = {r: run.memory_points(r, shown) for r in run.rank_ids()}
    if not points.get(rank):
        ax.set_title("Memory over time: no snapshots yet", fontsize=10)
        return ax.figure
    first = run.rank(rank).steps.get(shown[0])
    t0 = min(points[rank][0]["time"], first["start"] if first else float("inf"))
    x = [(ev["time"] - t0) * 1e3 for ev in points[rank]]
    layers = [[ev["by_category"].get(c, 0) for ev in points[rank]] for c in CATEGORIES]
    ax.stackplot(x, *layers, step="post", colors=[CATEGORY_COLORS[c] for c in CATEGORIES],
                 labels=[CATEGORY_NAMES[c] for c in CATEGORIES], alpha=0.9)
    for r, pts in points.items():
        ax.step([(ev["time"] - t0) * 1e3 for ev in pts], [ev["total_bytes"] for ev in pts],
                where="post", color=rank_color(r), lw=1.3 if r == rank else 0.9,
                label=f"rank {r} total" if r != rank else f"rank {r} total (stacked)")
    for s in shown:
        step_ev = run.rank(rank).steps.get(s)
        if step_ev:
            ax.axvline((step_ev["start"] - t0) * 1e3, color="grey", lw=0.8)
            ax.text((step_ev["start"] - t0) * 1e3, 1.0, f" step {s}", fontsize=8, va="top",
                    transform=ax.get_xaxis_transform())
    _theory_lines(ax, run, vertical=False)
    _byte_axis(ax.yaxis)
    ax.set_xlabel("time (ms)")
    ax.set_ylim(0, max(max(ev["total_bytes"] for ev in p) for p in points.values() if p) * 1.15)
    ax.set_title(f"Memory over time, steps {shown[0]}–{shown[-1]} (rank {rank} stacked, "
                 "lines: each rank's total)", fontsize=10)
    if legend:
        _legend_below(ax, ncol=3)
    return ax.figure


def _union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def compute_and_comm(run: RunState, r: int, step: int):
    """(step start, step end, compute [(start, end)], comm [(start, end, op, label)]).

    Compute is the step less the time the rank spent *waiting* for collectives: an asynchronous
    collective (a DDP bucket, a reduce-scatter) runs from its issue while the rank goes on
    computing, so the two lanes overlap exactly where communication was hidden.
    """
    found = run.intervals(r, step)
    if found is None:
        return None
    start, end, comm = found
    compute, t = [], start
    for s, e in _union([(max(s, start), min(e, end)) for s, e in run.blocked(r, step)]):
        if s > t:
            compute.append((t, s))
        t = max(t, e)
    if t < end:
        compute.append((t, end))
    return start, end, compute, comm


def step_timeline(data, ax=None) -> Figure:
    """The last completed step of every rank: compute (grey) and collectives (by op)."""
    run, ax = as_run(data), _ax(ax, (7, 3.5))
    step, ranks = run.last_step(), run.rank_ids()
    found = {r: compute_and_comm(run, r, step) for r in ranks} if step is not None else {}
    starts = [f[0] for f in found.values() if f]
    t0, seen = (min(starts) if starts else 0.0), set()
    for i, r in enumerate(ranks):
        if not found.get(r):
            continue
        start, end, compute, comm = found[r]
        ax.broken_barh([((s - t0) * 1e3, (e - s) * 1e3) for s, e in compute], (i - 0.35, 0.3),
                       color=COMPUTE_COLOR, label="compute" if i == 0 else None)
        for s, e, op, _label in comm:
            ax.broken_barh([((s - t0) * 1e3, (e - s) * 1e3)], (i - 0.02, 0.34),
                           color=OP_COLORS.get(op, "grey"), alpha=0.8, edgecolor="white",
                           lw=0.3, label=op.replace("_", "-") if op not in seen else None)
            seen.add(op)
        busy = sum(e - s for s, e in _union([(s, e) for s, e, _o, _l in comm]))
        ax.text((end - t0) * 1e3, i, f"  {fmt_seconds(end - start)}\n  comm {fmt_seconds(busy)}",
                va="center", fontsize=8)
    _rank_axis(ax, ranks)
    ax.set_xlabel("time since the step started (ms)")
    ax.margins(x=0.18)
    note = f"\ncollectives as the {fmt_link(run.link)} carried them" if run.link else ""
    ax.set_title(f"Step {step}: compute (upper lane) and collectives (lower lane) per rank"
                 + note, fontsize=10)
    _legend_below(ax, ncol=5)
    return ax.figure
