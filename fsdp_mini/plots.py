"""Static figures of a run's telemetry, for slides, the README, and the end of a live run.

Every function takes the events (a list of dicts), a :class:`~fsdp_mini.telemetry.runstate.Runs` or a
:class:`~fsdp_mini.telemetry.runstate.RunState`, and optionally an ``ax`` to draw into; it returns the Figure.
The numbers come from ``RunState``, the same object the live widgets read.

Figures are made with ``matplotlib.figure.Figure``, not pyplot: they work under Agg and in any
thread, and a notebook shows them once (when displayed), never a second time at the cell's end.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator

from .memory import CATEGORIES
from .theory import STRATEGIES
from .telemetry.runstate import Runs, RunState, phase_order
from .telemetry.units import fmt_bytes, fmt_link, fmt_rate, fmt_seconds, phase_name

CATEGORY_COLORS = {"params": "#4C72B0", "gathered_params": "#9DC3E6", "grads": "#55A868",
                   "optimizer_state": "#8172B2", "comm_buffers": "#C44E52",
                   "activations": "#E1C16E"}
CATEGORY_NAMES = {"params": "params (kept)", "gathered_params": "gathered params",
                  "grads": "grads", "optimizer_state": "optimizer state",
                  "comm_buffers": "comm buffers", "activations": "activations, temporaries"}
OP_COLORS = {"all_gather": "#2A9D8F", "reduce_scatter": "#E76F51", "all_reduce": "#F4A261",
             "broadcast": "#9C89B8", "barrier": "#999999"}
PHASE_COLORS = {"forward": "#2A9D8F", "backward": "#8FD5CA", "grad": "#E76F51"}
# Note: rank colours are chosen apart from the category and collective colours above, so a
# rank's line never reads as a kind of memory.
RANK_COLORS = ("#222222", "#D62AD0", "#0096C7", "#B5651D", "#6A994E", "#7B2CBF", "#FF006E",
               "#8D99AE")
COMPUTE_COLOR = "#C8C8C8"


class BinaryLocator(Locator):
    """Byte ticks at round binary values (0, 5 MiB, 10 MiB, ...), not at round decimal ones."""

    def __call__(self):
        vmin, vmax = sorted(self.axis.get_view_interval())
        scale = 1024 ** max(0, math.floor(math.log(max(vmax, 1), 1024)))
        ticks = MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(vmin / scale,
                                                                           vmax / scale)
        return [t * scale for t in ticks]


def _byte_axis(axis):
    axis.set_major_locator(BinaryLocator())
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: fmt_bytes(x)))


def rank_color(r: int) -> str:
    return RANK_COLORS[r % len(RANK_COLORS)]


def as_runs(data) -> Runs:
    if isinstance(data, Runs):
        return data
    runs = Runs()
    if isinstance(data, RunState):
        runs.runs[data.name] = runs.latest = data
    else:
        runs.add(data)
    return runs


def as_run(data) -> RunState:
    """The run to draw: ``data`` itself, or the latest run among the events."""
    run = data if isinstance(data, RunState) else as_runs(data).latest
    if run is None:
        raise ValueError("no events to draw")
    return run


def _ax(ax, figsize):
    if ax is None:
        ax = Figure(figsize=figsize, layout="constrained").add_subplot()
    return ax


def _rank_axis(ax, ranks):
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    for tick, r in zip(ax.get_yticklabels(), ranks):
        tick.set_color(rank_color(r))
    ax.set_ylim(len(ranks) - 0.5, -0.5)  # rank 0 on top


def _legend_below(ax, ncol=3):
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=ncol, fontsize=8,
              frameon=False)


def _theory_lines(ax, run, vertical=True):
    line = ax.axvline if vertical else ax.axhline
    if run.theory_persistent() is not None:
        line(run.theory_persistent(), color="black", ls="--", lw=1.2,
             label=f"formula: model state {fmt_bytes(run.theory_persistent())}")
    if run.theory_with_unit() is not None:
        line(run.theory_with_unit(), color="black", ls=":", lw=1.2,
             label=f"formula: + one unit gathered {fmt_bytes(run.theory_with_unit())}")


def memory_bars(data, ax=None) -> Figure:
    """Each rank's memory at its peak, stacked by category, beside the ZeRO formula."""
    run, ax = as_run(data), _ax(ax, (7, 3.5))
    ranks = run.rank_ids()
    for i, r in enumerate(ranks):
        peak, left = run.rank(r).peak, 0
        for cat in CATEGORIES:
            width = peak["by_category"].get(cat, 0) if peak else 0
            ax.barh(i, width, left=left, color=CATEGORY_COLORS[cat], height=0.6,
                    label=CATEGORY_NAMES[cat] if i == 0 else None)
            left += width
        if peak:
            ax.text(left, i, f"  peak {fmt_bytes(left)} at {peak.get('label', '')}", va="center",
                    fontsize=8)
        state = run.persistent(r)
        if state is not None:
            ax.plot([state], [i], marker="D", color="black", ms=5, ls="none",
                    label="measured model state" if i == 0 else None)
    _theory_lines(ax, run)
    _rank_axis(ax, ranks)
    _byte_axis(ax.xaxis)
    ax.set_xlim(0, max([run.peak(r) for r in ranks] + [run.theory_with_unit() or 0]) * 1.45)
    ax.set_title(f"Memory per rank at its peak: {run.name}, N = {run.world_size}", fontsize=10)
    _legend_below(ax)
    return ax.figure


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


def traffic(data, ax=None) -> Figure:
    """Bytes each rank sent in the last completed step, by collective, beside the formula."""
    run, ax = as_run(data), _ax(ax, (7, 3.5))
    ranks, step = run.rank_ids(), run.last_step()
    seen = set()
    for i, r in enumerate(ranks):
        left = 0.0
        for op, sent in sorted(run.sent(r, step).items() if step is not None else []):
            ax.barh(i, sent, left=left, color=OP_COLORS.get(op, "grey"), height=0.6,
                    label=op.replace("_", "-") if op not in seen else None)
            seen.add(op)
            left += sent
        ax.text(left, i, f"  {fmt_bytes(left)} (whole run {fmt_bytes(run.sent_total(r))})",
                va="center", fontsize=8)
    theory = run.theory_sent_per_step()
    if theory is not None:
        ax.axvline(theory, color="black", ls="--", lw=1.2,
                   label=f"formula: {fmt_bytes(theory)} per step")
    _rank_axis(ax, ranks)
    _byte_axis(ax.xaxis)
    top = max([run.sent_total(r, step) for r in ranks] + [theory or 0]) if step else 1
    ax.set_xlim(0, top * 1.6)
    ax.set_title(f"Bytes each rank sent in step {step} (ring model)", fontsize=10)
    _legend_below(ax)
    return ax.figure


def traffic_by_unit(data, ax=None, rank: int = 0) -> Figure:
    """Bytes ``rank`` sent per unit (or bucket) in the last completed step, by phase."""
    run, ax = as_run(data), _ax(ax, (7, 3.5))
    step = run.last_step()
    by_unit = run.sent_by_unit(rank, step) if step is not None else {}
    units, seen = list(by_unit), set()
    for i, unit in enumerate(units):
        bottom = 0.0
        for phase, sent in by_unit[unit].items():
            color = PHASE_COLORS.get(phase, OP_COLORS.get(phase, "grey"))
            ax.bar(i, sent, bottom=bottom, color=color, width=0.7,
                   label=phase_name(phase) if phase not in seen else None)
            seen.add(phase)
            bottom += sent
    ax.set_xticks(range(len(units)), units, rotation=30 if len(units) > 6 else 0, fontsize=8)
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    order = sorted(seen, key=phase_order)
    _byte_axis(ax.yaxis)
    ax.set_title(f"Bytes rank {rank} sent per unit in step {step}", fontsize=10)
    if seen:
        ax.legend([handles[phase_name(p)] for p in order], [phase_name(p) for p in order],
                  loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8,
                  frameon=False)
    return ax.figure


def bandwidth(data, ax=None) -> Figure:
    """algbw and busbw per collective (nccl-tests convention, GB/s = 1e9 B/s)."""
    run, ax = as_run(data), _ax(ax, (7, 3.5))
    rows = run.bandwidth()
    top = max([row["algbw"] for row in rows if row["algbw"] == row["algbw"]] + [0])
    scale, unit = (1e9, "GB/s (10⁹ B/s)") if top >= 1e9 else (1e6, "MB/s (10⁶ B/s)")
    for i, row in enumerate(rows):
        for dx, key, alpha in ((-0.2, "algbw", 0.55), (0.2, "busbw", 1.0)):
            ax.bar(i + dx, row[key] / scale, width=0.4, color=OP_COLORS.get(row["op"], "grey"),
                   alpha=alpha, edgecolor="black", lw=0.5)
            ax.text(i + dx, row[key] / scale, f"{key}\n{fmt_rate(row[key])}", ha="center",
                    va="bottom", fontsize=7)
    key = "sim_seconds" if run.link else "seconds"
    ax.set_xticks(range(len(rows)), [f"{r['op'].replace('_', '-')}\n{r['calls']} calls, "
                                     f"{fmt_seconds(r[key])}" for r in rows], fontsize=8)
    ax.set_ylabel(unit)
    ax.margins(y=0.3)
    when = (f"time on the {fmt_link(run.link)}" if run.link
            else "time = issue → done seen by the host")
    ax.set_title("Bandwidth per collective: algbw = payload/time, busbw = algbw × (N−1)/N\n"
                 f"(× 2(N−1)/N for all-reduce); {when}", fontsize=9)
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


def dashboard_figure(data) -> Figure:
    """All the panels of one run in one figure (what the live dashboard shows at the end)."""
    run = as_run(data)
    fig = Figure(figsize=(15, 14), layout="constrained")
    axes = fig.subplots(3, 2)
    memory_bars(run, axes[0, 0])
    memory_timeline(run, axes[0, 1])
    traffic(run, axes[1, 0])
    traffic_by_unit(run, axes[1, 1])
    step_timeline(run, axes[2, 0])
    bandwidth(run, axes[2, 1])
    fig.suptitle(f"{run.name}: {run.world_size} ranks, {run.params or 0:,} parameters, "
                 f"{run.device}/{run.backend}; step {run.last_step()}, loss {_loss(run)}",
                 fontsize=12)
    return fig


def _loss(run: RunState) -> str:
    loss = run.loss()
    return "–" if loss is None else f"{loss:.4f}"


def ordered_runs(runs: Runs) -> list[RunState]:
    key = {name: i for i, name in enumerate(STRATEGIES)}
    return sorted(runs, key=lambda run: key.get(run.strategy, len(key)))


def comparison(data) -> Figure:
    """Several runs side by side: memory, bytes per step (measured vs formula), step time."""
    runs = ordered_runs(as_runs(data))
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    ax_mem, ax_sent, ax_time = fig.subplots(1, 3)
    x = range(len(runs))
    names = [run.name for run in runs]
    bars = (("peak", lambda run: max(run.peak(r) for r in run.rank_ids()), "#C44E52"),
            ("state, measured", lambda run: max(run.persistent(r) or 0 for r in run.rank_ids()),
             "#4C72B0"),
            ("state, formula", lambda run: run.theory_persistent() or 0, "#BBBBBB"))
    for j, (label, value, color) in enumerate(bars):
        ax_mem.bar([i + (j - 1) * 0.27 for i in x], [value(run) for run in runs], width=0.27,
                   color=color, label=label)
    ax_mem.set_title("Memory per rank (largest rank)", fontsize=10)
    for j, (label, value, color) in enumerate(
            (("measured", lambda run: run.sent_per_step() or 0, "#2A9D8F"),
             ("formula", lambda run: run.theory_sent_per_step() or 0, "#BBBBBB"))):
        ax_sent.bar([i + (j - 0.5) * 0.4 for i in x], [value(run) for run in runs], width=0.4,
                    color=color, label=label)
    ax_sent.set_title("Bytes sent per rank per step", fontsize=10)
    times = [(run.step_seconds() or 0) * 1e3 for run in runs]
    ax_time.bar(x, times, color="#7F8C9A", width=0.6)
    for i, t in zip(x, times):
        ax_time.text(i, t, fmt_seconds(t / 1e3), ha="center", va="bottom", fontsize=8)
    ax_time.set_ylabel("ms")
    ax_time.set_title("Median step time (slowest rank)", fontsize=10)
    for ax in (ax_mem, ax_sent, ax_time):
        ax.set_xticks(list(x), names)
    for ax in (ax_mem, ax_sent):
        _byte_axis(ax.yaxis)
        ax.legend(fontsize=8)
    world = sorted({run.world_size for run in runs if run.world_size})
    fig.suptitle(f"The same job under {len(runs)} strateg{'y' if len(runs) == 1 else 'ies'}, N = "
                 f"{', '.join(map(str, world))}", fontsize=12)
    return fig


def plan_bars(plan, ax=None) -> Figure:
    """The planner's figure: one stacked bar per strategy (predicted peak bytes per GPU, by
    category) and a line at the GPU's memory. ``plan``: a :class:`fsdp_mini.planner.Plan`."""
    ax = _ax(ax, (7, 3.6))
    names = list(plan.strategies)
    bottoms = [0.0] * len(names)
    scale = 1e9 if max([plan.gpu_mem_bytes] + [s.peak_bytes for s in plan.strategies.values()]
                       ) >= 1e9 else 1e6
    for cat in CATEGORIES:
        heights = [plan.strategies[n].by_category[cat] / scale for n in names]
        ax.bar(names, heights, bottom=bottoms, color=CATEGORY_COLORS[cat],
               label=CATEGORY_NAMES[cat])
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.axhline(plan.gpu_mem_bytes / scale, color="#222222", ls="--", lw=1.2,
               label=f"GPU memory ({plan.gpu_mem_bytes / 1e9:g} GB)")
    for i, n in enumerate(names):
        ax.text(i, bottoms[i], "fits" if plan.strategies[n].fits else "does not fit",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"predicted peak per GPU ({'GB' if scale == 1e9 else 'MB'})")
    ax.set_title(f"Ψ = {plan.params / 1e9:.3g}B on {plan.gpus} GPUs, {plan.precision}",
                 fontsize=10)
    _legend_below(ax)
    return ax.figure
