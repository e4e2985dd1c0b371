"""The same job under several strategies, side by side (memory, bytes, step time)."""

from __future__ import annotations

import html

import ipywidgets as W

from .. import plots
from ..memory import CATEGORIES
from ..plots import CATEGORY_COLORS, CATEGORY_NAMES, OP_COLORS
from ..telemetry.runstate import RunState
from ..telemetry.units import fmt_bytes, fmt_seconds
from .html import FONT, PEAK, THEORY, swatches_html, table_html, track_html
from .live import _Live

# -- several runs -------------------------------------------------------------------------------

class Comparison(_Live):
    """The same job under several strategies (events told apart by ``"run"``), side by side:
    memory (peak, state kept between steps, formula), bytes per step, median step time."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.header, self.table, self.legend = W.HTML(), W.HTML(), W.HTML()
        self.children = [self.header, self.table, self.legend]
        self.layout.overflow = "auto"
        self.render(final=False)

    def static_figure(self):
        return plots.comparison(self.runs)

    def render(self, final: bool) -> None:
        runs = plots.ordered_runs(self.runs)
        current = self.runs.latest.name if self.runs.latest else "–"
        sizes = ", ".join(str(n) for n in sorted({run.world_size for run in runs
                                                   if run.world_size}))
        self.header.value = (f'<div style="{FONT};font-size:14px"><b>Strategies compared</b>'
                             f" · {len(runs)} runs on N = {sizes or '–'} ranks · last: "
                             f"{html.escape(current)} · {self.status}</div>")
        mem_scale = max([1.0] + [_largest(run, run.peak) for run in runs] +
                        [run.theory_persistent() or 0 for run in runs]) * 1.05
        sent_scale = max([1.0] + [max(run.sent_per_step() or 0, run.theory_sent_per_step() or 0)
                                  for run in runs]) * 1.05
        rows = [self._row(run, mem_scale, sent_scale) for run in runs]
        self.table.value = table_html(
            ["run", "memory at peak (largest rank)", "peak", "model state", "formula",
             "bytes sent per step", "measured", "formula", "median step", "loss"], rows)
        self.legend.value = swatches_html(
            [(CATEGORY_NAMES[c], f"background:{CATEGORY_COLORS[c]}") for c in CATEGORIES] +
            [("peak", f"border-left:{PEAK};width:0"),
             ("formula", f"border-left:{THEORY};width:0"),
             ("bytes sent, measured", f"background:{OP_COLORS['all_gather']}")])

    def _row(self, run: RunState, mem_scale: float, sent_scale: float) -> list:
        worst = max(run.rank_ids(), key=run.peak, default=0)
        peak_ev = run.rank(worst).peak
        segments = [(peak_ev["by_category"].get(c, 0), CATEGORY_COLORS[c], CATEGORY_NAMES[c])
                    for c in CATEGORIES] if peak_ev else []
        theory, sent, sent_theory = (run.theory_persistent(), run.sent_per_step(),
                                     run.theory_sent_per_step())
        memory = track_html(segments, mem_scale, [(run.peak(worst), PEAK, "peak")] +
                            ([(theory, THEORY, "formula")] if theory is not None else []))
        traffic = track_html([(sent or 0, OP_COLORS["all_gather"], "measured")], sent_scale,
                             [(sent_theory, THEORY, "formula")] if sent_theory is not None else [])
        loss = run.loss()
        return [f"<b>{html.escape(run.name)}</b>",
                f'<div style="width:170px">{memory}</div>', fmt_bytes(run.peak(worst)),
                fmt_bytes(_largest(run, run.persistent)), fmt_bytes(theory),
                f'<div style="width:100px">{traffic}</div>', fmt_bytes(sent),
                fmt_bytes(sent_theory), fmt_seconds(run.step_seconds()),
                "–" if loss is None else f"{loss:.4f}"]


def _largest(run: RunState, value) -> float:
    return max([value(r) or 0 for r in run.rank_ids()] or [0])
