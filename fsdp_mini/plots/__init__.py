"""Static figures of a run's telemetry, for slides, the README, and the end of a live run.

Every function takes the events (a list of dicts), a :class:`~fsdp_mini.telemetry.runstate.Runs` or a
:class:`~fsdp_mini.telemetry.runstate.RunState`, and optionally an ``ax`` to draw into; it returns the Figure.
The numbers come from ``RunState``, the same object the live widgets read. ``collectives.py``
draws collectives themselves: what each rank held before and after one, and an all-reduce sweep.

Figures are made with ``matplotlib.figure.Figure``, not pyplot: they work under Agg and in any
thread, and a notebook shows them once (when displayed), never a second time at the cell's end.
May import: the algorithm, ``models``, the launcher and telemetry; never widgets, the lab kit or
the jobs.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from ..memory import CATEGORIES
from ..telemetry.runstate import Runs, RunState, phase_order
from ..telemetry.units import fmt_bytes, fmt_link, fmt_rate, fmt_seconds, phase_name
from ..theory import STRATEGIES
from .collectives import plot_bandwidth, show_collective  # noqa: F401
from .reports import report_memory, report_traffic  # noqa: F401

# Note: some names are imported only to be public here (the widgets and tests use them).
from .style import (  # noqa: F401
    CATEGORY_COLORS,
    CATEGORY_NAMES,
    COMPUTE_COLOR,
    OP_COLORS,
    PHASE_COLORS,
    RANK_COLORS,
    BinaryLocator,
    _ax,
    _byte_axis,
    _legend_below,
    _rank_axis,
    _theory_lines,
    as_run,
    as_runs,
    rank_color,
)
from .timelines import _union, compute_and_comm, memory_timeline, step_timeline  # noqa: F401


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
    category), a line at the GPU's memory and one at what is left after the reserve (what
    "fits" compares with). ``plan``: a :class:`fsdp_mini.planner.plan.Plan`."""
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
    usable = plan.gpu_mem_bytes - plan.reserve_bytes
    ax.axhline(usable / scale, color="#b03030", ls=":", lw=1.2,
               label=f"less the reserve ({usable / 1e9:.3g} GB)")
    for i, n in enumerate(names):
        ax.text(i, bottoms[i], "fits" if plan.strategies[n].fits else "does not fit",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"predicted peak per GPU ({'GB' if scale == 1e9 else 'MB'})")
    ax.set_title(f"Ψ = {plan.params / 1e9:.3g}B on {plan.gpus} GPUs, {plan.precision}",
                 fontsize=10)
    _legend_below(ax)
    return ax.figure
