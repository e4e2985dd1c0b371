"""The look shared by every figure: colours by memory category, collective and rank; byte axes
with binary ticks; and how a figure finds the run to draw."""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator

from ..telemetry.runstate import Runs, RunState
from ..telemetry.units import fmt_bytes

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
