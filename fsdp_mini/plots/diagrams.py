"""Diagrams for the workshop's slides, each drawn from the kit's own data, at a size that reads
from the back of a room (no text under ``SLIDE_PT`` points: 16.7 px at the 100 dpi they are saved
at, a figure shown at its own size on a 1280 x 720 slide).

    peak_memory(report)        per strategy, the measured peak of a step; where the report has
                               it, the breakdown by category *at that moment* (``at_peak``)
    flat_layout(panels)        which rank owns which slice of each parameter of a unit's flat
                               buffer, padding included (``FlatLayout`` and ``ShardPieces``)
    ring_steps(record)         a ring all-reduce's chunks step by step (what each rank holds)
    zero_partition(report)     the model state per strategy: which part of it each rank keeps,
                               from the measured bytes by category

``report`` is the main job's (``fsdp-mini compare --json``); ``at_peak`` and ``state_by_category``
are the per-rank fields the slides' run adds to it (a report recorded without them draws the
measured totals and says the breakdown is missing).
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..buffers.flat import FlatLayout, ShardPieces
from ..memory import CATEGORIES, PERSISTENT
from ..telemetry.units import fmt_bytes
from .reports import largest_rank
from .style import CATEGORY_COLORS, CATEGORY_NAMES, _ax, _byte_axis, rank_color

SLIDE_PT = 12          # the smallest text on a slide's figure, in points (16.7 px at 100 dpi)
SLIDE_DPI = 100        # what the slides save figures at: a figure's inches x 100 = its pixels
PARAM_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#8172B2", "#937860", "#DA8BC3", "#8C8C8C",
                "#CCB974", "#64B5CD", "#C44E52", "#2A9D8F")
PADDING_COLOR = "#E0E0E0"


def _legend_right(ax, **kwargs):
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=SLIDE_PT, frameon=False,
              **kwargs)


# -- the memory at the peak -------------------------------------------------------------------

def has_breakdown(report: dict, field: str) -> bool:
    """Whether every rank of every strategy of ``report`` has ``field`` (by category)."""
    return all(isinstance(r.get(field), dict) for e in report["strategies"].values()
               for r in e["ranks"])


def peak_memory(report: dict, ax=None) -> Figure:
    """Per strategy, its largest rank's measured peak (the label on the bar is that number);
    stacked, where the report has them, by what each category held *at that moment*: the bar's
    height is the peak itself, never a sum of each category's own peak."""
    ax = _ax(ax, (10.8, 4.0))
    names = list(report["strategies"])
    breakdown = has_breakdown(report, "at_peak")
    top, ticks = 0, []
    for i, name in enumerate(names):
        entry = report["strategies"][name]
        rank = largest_rank(entry, "peak_bytes")
        peak = rank["peak_bytes"]
        if breakdown:
            bottom = 0
            for cat in CATEGORIES:
                height = rank["at_peak"].get(cat, 0)
                ax.bar(i, height, bottom=bottom, color=CATEGORY_COLORS[cat], width=0.6,
                       label=CATEGORY_NAMES[cat] if i == 0 else None)
                bottom += height
        else:
            ax.bar(i, peak, color="#9A9A9A", width=0.6,
                   label="the peak (this report has no breakdown at it)" if i == 0 else None)
        state = largest_rank(entry, "persistent_bytes")["persistent_bytes"]
        formula = entry["theory"]["persistent_bytes"]
        ax.plot([i - 0.34, i + 0.34], [state] * 2, color="#222222", lw=2.5,
                label="state kept, measured" if i == 0 else None)
        ax.plot([i - 0.34, i + 0.34], [formula] * 2, color="#222222", lw=1.5, ls=":",
                label="state, ZeRO formula" if i == 0 else None)
        ax.text(i, peak, fmt_bytes(peak), ha="center", va="bottom", fontsize=SLIDE_PT)
        top = max(top, peak, formula)
        ticks.append(name if len(entry["ranks"]) == 1 else f"{name}\nrank {rank['rank']}")
    ax.set_xticks(range(len(names)), ticks, fontsize=SLIDE_PT)
    ax.tick_params(axis="y", labelsize=SLIDE_PT)
    _byte_axis(ax.yaxis)
    ax.set_ylim(0, top * 1.15)
    what = "by category at that moment" if breakdown else "no breakdown in this report"
    ax.set_title(f"The peak of a step, per rank ({what}); N = {report['world_size']}",
                 fontsize=SLIDE_PT + 1)
    _legend_right(ax)
    return ax.figure


# -- a unit's flat buffer, and who owns what --------------------------------------------------

def pieces_by_rank(layout: FlatLayout) -> list[list[tuple[str, int, int]]]:
    """For each rank: (parameter name, lo, hi) of every non-empty piece it owns, in elements of
    the flattened parameter: what ``ShardPieces.in_params`` says, read off the kit's classes."""
    out = []
    for rank in range(layout.world_size):
        shard = torch.zeros(layout.shard_numel)
        pieces = ShardPieces(layout, shard, rank).in_params()
        out.append([(slot.names[0] if slot.names else f"p{i}", lo, hi)
                    for i, (slot, (lo, hi)) in enumerate(zip(layout.slots, pieces)) if hi > lo])
    return out


def padding_of(layout: FlatLayout) -> int:
    return layout.padded_numel - layout.numel


def _short(name: str) -> str:
    return name.split("blocks.", 1)[-1] if name.startswith("blocks.") else name


def _rank_line(rank: int, pieces, layout: FlatLayout) -> str:
    start, end = layout.shard_range(rank)
    held = [f"{_short(n)}[{lo:,}:{hi:,}]" for n, lo, hi in pieces]
    pad = max(0, end - max(start, layout.numel))
    if pad:
        held.append(f"padding ×{pad:,}")
    return f"rank {rank} [{start:,}:{end:,}]: " + ("  ".join(held) if held else "nothing")


def _draw_layout(ax, title: str, layout: FlatLayout, elements: bool) -> None:
    n, padded = layout.world_size, layout.padded_numel
    for i, slot in enumerate(layout.slots):
        color = PARAM_COLORS[i % len(PARAM_COLORS)]
        name = _short(slot.names[0]) if slot.names else f"p{i}"
        if elements:
            for k in range(slot.numel):
                ax.add_patch(Rectangle((slot.offset + k, 1), 1, 0.8, facecolor=color,
                                       edgecolor="white", lw=2))
                ax.text(slot.offset + k + 0.5, 1.4, f"{name}{k}", ha="center", va="center",
                        fontsize=SLIDE_PT, color="white")
        else:
            ax.add_patch(Rectangle((slot.offset, 1), slot.numel, 0.8, facecolor=color,
                                   edgecolor="white", lw=1))
            if slot.numel / padded > 0.12:
                ax.text(slot.offset + slot.numel / 2, 1.4, f"{name} ({slot.numel:,})",
                        ha="center", va="center", fontsize=SLIDE_PT, color="white")
    pad = padding_of(layout)
    if pad:
        ax.add_patch(Rectangle((layout.numel, 1), pad, 0.8, facecolor=PADDING_COLOR,
                               edgecolor="white", hatch="//", lw=1))
        if elements:
            for k in range(pad):
                ax.text(layout.numel + k + 0.5, 1.4, "0", ha="center", va="center",
                        fontsize=SLIDE_PT)
    for rank in range(n):
        start, end = layout.shard_range(rank)
        ax.add_patch(Rectangle((start, 0.2), end - start, 0.6, facecolor=rank_color(rank),
                               edgecolor="white", lw=2, alpha=0.85))
        ax.text((start + end) / 2, 0.5, f"rank {rank}", ha="center", va="center",
                fontsize=SLIDE_PT, color="white")
    lines = [_rank_line(r, p, layout) for r, p in enumerate(pieces_by_rank(layout))]
    for r, line in enumerate(lines):
        ax.text(0, -0.35 - 0.55 * r, line, ha="left", va="center", fontsize=SLIDE_PT,
                color=rank_color(r))
    ax.set_xlim(0, padded)
    ax.set_ylim(-0.35 - 0.55 * n, 1.9)
    ax.axis("off")
    ax.set_title(title, fontsize=SLIDE_PT + 1, loc="left")


def flat_layout(panels: list[tuple[str, FlatLayout, bool]]) -> Figure:
    """One panel per ``(title, layout, elements)``: the buffer (its parameters end to end, then
    the padding, hatched), the rank that owns each shard, and per rank the pieces it holds (what
    ``ShardPieces.in_params`` gives). ``elements``: draw every element (a small example)."""
    heights = [2.2 + 0.55 * layout.world_size for _t, layout, _e in panels]
    fig = Figure(figsize=(11.2, min(4.3, 0.42 * sum(heights))), layout="constrained")
    axes = fig.subplots(len(panels), 1, height_ratios=heights, squeeze=False)[:, 0]
    for ax, (title, layout, elements) in zip(axes, panels):
        _draw_layout(ax, title, layout, elements)
    return fig


def layout_title(what: str, layout: FlatLayout) -> str:
    pad = padding_of(layout)
    n = layout.world_size
    padding = (f"{pad:,} padding" if pad else f"no padding ({layout.numel:,} is a multiple of {n})")
    return (f"{what}: {layout.numel:,} elements, {padding}, "
            f"{layout.padded_numel:,} = {n} × {layout.shard_numel:,}")


# -- the ring all-reduce, step by step --------------------------------------------------------

def ring_label(ranks: frozenset, world_size: int) -> str:
    """The ranks whose values a chunk holds summed: "013" for ranks 0, 1 and 3; "Σ": all."""
    return "Σ" if len(ranks) == world_size else "".join(map(str, sorted(ranks)))


def ring_steps(record: dict) -> Figure:
    """Every rank's chunks after each step of a ring all-reduce: a cell names the ranks whose
    values it holds summed (Σ: all of them); the chunk a rank has just received is framed.
    The first row is the reduce-scatter phase (from the start), the second the all-gather.
    ``record``: ``world_size``, ``states`` (per step, per rank, per chunk: the ranks summed in
    it), ``received`` (per step after the first, per rank: the chunk it received), ``sent``
    (bytes each rank sent), ``payload`` (bytes of the tensor), ``ring_bytes`` (the ledger's)."""
    n, states = record["world_size"], record["states"]
    rows = [[("start", 0)] + [(f"reduce-scatter {k}", k) for k in range(1, n)],
            [(f"all-gather {k}", n - 1 + k) for k in range(1, n)]]
    margin, gap, title = 1.7, 0.6, 1.4
    units_x, units_y = margin + n * (n + gap), 2 * (n + title)
    width = min(11.2, max(7.5, units_x * 0.75))
    fig = Figure(figsize=(width, units_y * 0.32 + 0.55), layout="constrained")
    ax = fig.add_subplot()
    for row, panels in enumerate(rows):
        top = row * (n + title)
        for k, (name, step) in enumerate(panels):
            col = k + row  # Note: the all-gather row starts under the first reduce-scatter step
            left = margin + col * (n + gap)
            ax.text(left + n / 2, top + title * 0.45, name, ha="center", va="center",
                    fontsize=SLIDE_PT)
            for r in range(n):
                y = top + title + r
                if k == 0:
                    ax.text(left - 0.15, y + 0.5, f"rank {r}", ha="right", va="center",
                            fontsize=SLIDE_PT, color=rank_color(r))
                for c in range(n):
                    ranks = states[step][r][c]
                    full = len(ranks) == n
                    share = len(ranks) / n
                    face = ("#2A9D8F" if full else
                            (1 - 0.45 * share, 1 - 0.25 * share, 1 - 0.05 * share))
                    got = step > 0 and record["received"][step - 1][r] == c
                    ax.add_patch(Rectangle((left + c, y), 1, 1, facecolor=face,
                                           edgecolor="black" if got else "white",
                                           lw=3 if got else 1.5))
                    ax.text(left + c + 0.5, y + 0.5, ring_label(ranks, n), ha="center",
                            va="center", fontsize=SLIDE_PT, color="white" if full else "black")
    ax.text(0, n + title * 1.25, "a cell: the ranks\nsummed in it\n(01: ranks 0 and 1)\n"
            "Σ: all of them\nframed: just received", ha="left", va="top", fontsize=SLIDE_PT,
            color="#444444")
    ax.set_xlim(0, units_x)
    ax.set_ylim(units_y, 0)
    ax.axis("off")
    sent, payload = record["sent"], record["payload"]
    fig.suptitle(f"A ring all-reduce on N = {n} ranks, a column per chunk:\neach rank sent "
                 f"{sent / payload:.2f}× the tensor (the ledger's ring model: "
                 f"{record['ring_bytes'] / payload:.2f}×)", fontsize=SLIDE_PT + 1)
    return fig


# -- ZeRO's partition of the model state ------------------------------------------------------

STAGES = (("ddp", "DDP"), ("zero1", "ZeRO-1"), ("zero2", "ZeRO-2"), ("fsdp", "FSDP"))


def replicated(values: list[int], whole: int) -> bool:
    """Whether every rank keeps (about) the whole category: a copy, not a slice."""
    return bool(values) and min(values) >= 0.9 * whole


def zero_partition(report: dict) -> Figure:
    """One row per strategy across the model state of one process (the ``single`` run:
    parameters, gradients, optimizer state, measured): a category every rank keeps whole is one
    bar, labelled with its bytes on *every* rank; a sharded one is cut into the slices each rank
    keeps, each as wide as that rank's measured bytes."""
    names = [(k, label) for k, label in STAGES if k in report["strategies"]]
    fig = Figure(figsize=(11.2, 0.9 + 0.85 * len(names)), layout="constrained")
    ax = fig.add_subplot()
    if not has_breakdown(report, "state_by_category") or "single" not in report["strategies"]:
        for i, (key, label) in enumerate(names):
            value = largest_rank(report["strategies"][key], "persistent_bytes")["persistent_bytes"]
            ax.barh(i, value, color="#9A9A9A", height=0.6)
            ax.text(value, i, f"  {fmt_bytes(value)} per rank", va="center", fontsize=SLIDE_PT)
        ax.set_yticks(range(len(names)), [label for _k, label in names], fontsize=SLIDE_PT)
        ax.set_ylim(len(names) - 0.5, -0.5)
        _byte_axis(ax.xaxis)
        ax.tick_params(axis="x", labelsize=SLIDE_PT)
        ax.set_title("Model state per rank (this report has no state by category)",
                     fontsize=SLIDE_PT + 1)
        return fig
    whole = report["strategies"]["single"]["ranks"][0]["state_by_category"]
    zones, x = {}, 0
    for cat in PERSISTENT:
        zones[cat] = (x, whole.get(cat, 0))
        x += whole.get(cat, 0)
    total = x
    for cat in PERSISTENT:
        start, width = zones[cat]
        ax.text(start + width / 2, -0.55, f"{CATEGORY_NAMES[cat]}: {fmt_bytes(width)}",
                ha="center", va="bottom", fontsize=SLIDE_PT)
    for i, (key, label) in enumerate(names):
        ranks = sorted(report["strategies"][key]["ranks"], key=lambda r: r["rank"])
        for cat in PERSISTENT:
            start, width = zones[cat]
            values = [r["state_by_category"].get(cat, 0) for r in ranks]
            if replicated(values, width):
                ax.barh(i, max(values), left=start, height=0.62, color=CATEGORY_COLORS[cat],
                        edgecolor="white")
                ax.text(start + width / 2, i, f"every rank: {fmt_bytes(max(values))}",
                        ha="center", va="center", fontsize=SLIDE_PT, color="white")
                continue
            left = start
            for r, value in zip(ranks, values):
                ax.barh(i, value, left=left, height=0.62, color=CATEGORY_COLORS[cat],
                        edgecolor="white", lw=2, alpha=0.55 + 0.45 * (r["rank"] % 2))
                if value / total > 0.03:
                    ax.text(left + value / 2, i, str(r["rank"]), ha="center", va="center",
                            fontsize=SLIDE_PT, color="black")
                left += value
        state = largest_rank(report["strategies"][key], "persistent_bytes")["persistent_bytes"]
        ax.text(total * 1.01, i, f"{fmt_bytes(state)} per rank", va="center",
                fontsize=SLIDE_PT)
    ax.set_yticks(range(len(names)), [label for _k, label in names], fontsize=SLIDE_PT)
    ax.set_ylim(len(names) - 0.5, -0.8)
    ax.set_xlim(0, total * 1.2)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"Who keeps what of the model state, measured (N = {report['world_size']}); "
                 f"in a slice, its rank", fontsize=SLIDE_PT + 1, loc="left")
    return fig
