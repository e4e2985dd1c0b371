"""Figures of a ``fsdp-mini compare --json`` report: what each strategy keeps and sends per rank.

The report is the main job's JSON (README, "The main job"): per strategy, the ZeRO formulas
(``theory``) and, per rank, the peak memory by category, the state kept between steps and the
bytes sent per step. A report recorded on a GPU box draws the same way as one made on a laptop.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from ..memory import CATEGORIES
from ..telemetry.units import fmt_bytes
from .style import CATEGORY_COLORS, CATEGORY_NAMES, _ax, _byte_axis, _legend_below


def largest_rank(entry: dict, key: str) -> dict:
    """The rank of ``entry`` (a strategy of the report) with the most ``key``."""
    return max(entry["ranks"], key=lambda r: r[key])


def report_memory(report: dict, ax=None) -> Figure:
    """Per strategy, the peak of its largest rank stacked by category, and the state it keeps
    between steps beside the ZeRO formula (the bars fall from DDP to FSDP)."""
    ax = _ax(ax, (7.5, 3.8))
    names = list(report["strategies"])
    for i, name in enumerate(names):
        entry = report["strategies"][name]
        rank, left = largest_rank(entry, "peak_bytes"), 0
        for cat in CATEGORIES:
            width = rank["peak_by_category"].get(cat, 0)
            ax.bar(i, width, bottom=left, color=CATEGORY_COLORS[cat], width=0.6,
                   label=CATEGORY_NAMES[cat] if i == 0 else None)
            left += width
        state = largest_rank(entry, "persistent_bytes")["persistent_bytes"]
        ax.plot([i - 0.3, i + 0.3], [state] * 2, color="#222222", lw=2,
                label="state kept, measured" if i == 0 else None)
        ax.plot([i - 0.3, i + 0.3], [entry["theory"]["persistent_bytes"]] * 2, color="#222222",
                lw=1, ls=":", label="state, ZeRO formula" if i == 0 else None)
        ax.text(i, left, fmt_bytes(left), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    _byte_axis(ax.yaxis)
    ax.set_title(f"Memory per rank at its peak, by category (N = {report['world_size']}, "
                 f"Ψ = {report['params'] / 1e6:.2f} M)", fontsize=10)
    _legend_below(ax)
    return ax.figure


def report_traffic(report: dict, ax=None) -> Figure:
    """Per strategy, the bytes one rank sent per step, measured and by the formula."""
    ax = _ax(ax, (7.5, 3.4))
    names = [n for n in report["strategies"] if n != "single"]
    sent = [largest_rank(report["strategies"][n], "sent_bytes_per_step")["sent_bytes_per_step"]
            for n in names]
    formula = [report["strategies"][n]["theory"]["sent_bytes_per_step"] for n in names]
    ax.bar([i - 0.2 for i in range(len(names))], sent, width=0.4, color="#2A9D8F",
           label="measured (the ledger)")
    ax.bar([i + 0.2 for i in range(len(names))], formula, width=0.4, color="#BBBBBB",
           label="formula")
    for i, value in enumerate(sent):
        ax.text(i - 0.2, value, fmt_bytes(value), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    _byte_axis(ax.yaxis)
    ax.set_title(f"Bytes one rank sends per training step (N = {report['world_size']})",
                 fontsize=10)
    ax.legend(fontsize=8)
    return ax.figure
