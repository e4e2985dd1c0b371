"""Live dashboards for a training job: memory per rank, bytes per collective, compute vs comm.

    dash = Dashboard()
    fsdp_mini.launch(train_gpt, 4, "fsdp", monitor=dash)     # shows itself, updates live

    cmp = Comparison()                                        # one view, several strategies
    for strategy in ("ddp", "zero1", "zero2", "fsdp"):
        fsdp_mini.launch(train_gpt, 4, strategy, monitor=cmp)

Both are plain ipywidgets 8 (HTML bars, one re-rendered PNG): no ipympl, no custom front-end, so
they update inside the running cell in JupyterLab and VS Code alike. ``launch`` calls
``start(world_size)``, then ``update(events)`` with each batch of new events, then
``finish(ok)``. Events are all kept in totals; the screen is redrawn at most every
``min_interval`` seconds. ``finish`` also displays a static matplotlib figure of the same panels
(as a PNG; the Figure stays in ``.figure``), for nbconvert, GitHub and slides, which have no live
widgets.
"""

from __future__ import annotations

import base64
import html
import io
import time

import ipywidgets as W
from IPython.display import Image, display

from . import plots
from .plots import CATEGORY_COLORS, CATEGORY_NAMES, COMPUTE_COLOR, OP_COLORS, rank_color
from .memory import CATEGORIES
from .runstate import Runs, RunState, phase_order
from .telemetry import LaunchFeed, load_events
from .timeline_svg import memory_timeline_svg
from .units import fmt_bytes, fmt_rate, fmt_seconds, phase_name

__all__ = ["Comparison", "Dashboard"]

_FONT = "font-family:system-ui,sans-serif;font-size:12px;line-height:1.35"
_CELL = "padding:2px 8px;text-align:right;white-space:nowrap"


# -- HTML pieces --------------------------------------------------------------------------------

def track_html(segments, scale, markers=(), height=16) -> str:
    """A bar on a 0..``scale`` track: ``segments`` [(value, color, tooltip)] stacked from the left,
    ``markers`` [(value, css border, tooltip)] as vertical lines."""
    def pct(v):
        return 100.0 * max(0.0, min(v, scale)) / scale if scale > 0 else 0.0

    out, left = [], 0.0
    for value, color, tip in segments:
        out.append(f'<div title="{html.escape(tip)}" style="position:absolute;'
                   f'left:{pct(left):.2f}%;width:{pct(value):.2f}%;top:0;bottom:0;'
                   f'background:{color}"></div>')
        left += value
    for value, css, tip in markers:
        out.append(f'<div title="{html.escape(tip)}" style="position:absolute;'
                   f'left:{pct(value):.2f}%;top:-3px;bottom:-3px;border-left:{css}"></div>')
    return (f'<div style="position:relative;height:{height}px;background:#eee;border-radius:2px;'
            f'min-width:120px">{"".join(out)}</div>')


def swatches_html(items) -> str:
    """A legend: ``items`` [(label, css of the swatch)]."""
    spans = "".join(f'<span><span style="display:inline-block;width:12px;height:12px;'
                    f'vertical-align:middle;{css}"></span> {html.escape(label)}</span>'
                    for label, css in items)
    return f'<div style="{_FONT};display:flex;flex-wrap:wrap;gap:4px 14px">{spans}</div>'


def table_html(header, rows) -> str:
    head = "".join(f'<th style="{_CELL}">{h}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in row) + "</tr>"
                   for row in rows)
    return f'<table style="{_FONT};border-collapse:collapse"><tr>{head}</tr>{body}</table>'


def _rank_label(r: int) -> str:
    return f'<b style="color:{rank_color(r)}">rank {r}</b>'


def _op_name(op: str) -> str:
    return op.replace("_", "-")


_SHORT_PHASE = {"forward": "gather, fwd", "backward": "gather, bwd", "grad": "scatter grads"}
_PEAK = "2px solid #000"
_THEORY = "2px dashed #333"
_THEORY_UNIT = "2px dotted #333"


# -- the common live machinery --------------------------------------------------------------------

class _Live(W.VBox, LaunchFeed):
    """Accumulates events in :class:`~fsdp_mini.runstate.Runs` and redraws, throttled by time."""

    def __init__(self, min_interval: float = 0.15, clock=time.monotonic, **kwargs):
        super().__init__(**kwargs)
        self.min_interval, self._clock = min_interval, clock
        self.runs, self.redraws, self.figure, self._shown_figure = Runs(), 0, None, None
        self._handle = None
        self.status, self.world_size = "waiting for events", None
        self._last_draw, self._dirty, self._displayed = float("-inf"), False, False

    @classmethod
    def from_events(cls, events, **kwargs):
        """A view of recorded events: a list of dicts, or a folder / ``.jsonl`` file of them."""
        view = cls(**kwargs)
        view.runs.add(load_events(events) if isinstance(events, (str, bytes)) or
                      hasattr(events, "__fspath__") else events)
        view.status = "recorded"
        view.redraw(final=True)
        return view

    def _repr_mimebundle_(self, **kwargs):
        self._displayed = True
        return super()._repr_mimebundle_(**kwargs)

    def start(self, world_size: int) -> None:
        self.world_size, self.status = world_size, "running"
        if not self._displayed:
            # Note: displayed with an id, so finish() can add the static figure to this very
            # output: JupyterLab shows the widget, nbconvert and GitHub the figure.
            self._handle = display(self, display_id=True)
            self._displayed = True
        self.redraw()

    def update(self, events) -> None:
        if events:
            self.runs.add(events)
            self._dirty = True
        self.tick()

    def tick(self) -> None:
        """Redraw if something new came and the last redraw is ``min_interval`` old."""
        if self._dirty and self._clock() - self._last_draw >= self.min_interval:
            self.redraw()

    def launch_poll(self) -> None:
        super().launch_poll()
        self.tick()  # draws what came in the last throttled update, even if nothing new comes

    def finish(self, ok: bool) -> None:
        self.status = "finished" if ok else "failed"
        self.redraw(final=True)
        if len(self.runs):
            # Note: shown as a PNG, not display(figure): a pyplot-free Figure has a PNG form only
            # while matplotlib's inline backend is loaded, and nbconvert/GitHub need the PNG.
            self.figure = self.static_figure()
            png = _png(self.figure, dpi=80)
            if self._handle is not None:  # one output: the live widget, or else its figure
                self._handle.update({
                    "application/vnd.jupyter.widget-view+json": {
                        "version_major": 2, "version_minor": 0, "model_id": self.model_id},
                    "image/png": base64.b64encode(png).decode(),
                    "text/plain": f"{type(self).__name__} ({self.status})"}, raw=True)
                return
            image = Image(png, format="png")
            if self._shown_figure is None:  # the first launch: a new output
                self._shown_figure = display(image, display_id=True)
            else:  # a later launch (a Comparison's next strategy): replace that output
                self._shown_figure.update(image)

    def redraw(self, final: bool = False) -> None:
        self._last_draw, self._dirty = self._clock(), False
        self.redraws += 1
        self.render(final)

    def render(self, final: bool) -> None:
        raise NotImplementedError

    def static_figure(self):
        raise NotImplementedError


# -- one run ------------------------------------------------------------------------------------

class Dashboard(_Live):
    """One training job, live: memory per rank, traffic per collective and unit, step timeline."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.header = W.HTML()
        self.bars = W.VBox()
        self.memory_legend = W.HTML()
        self.timeline = W.HTML(layout=W.Layout(max_width="100%"))
        self.timeline_caption = W.HTML()
        self.traffic = W.HTML()
        self.units_table = W.HTML()
        self.bandwidth = W.HTML()
        self.steps = W.HTML()
        box = dict(flex="1 1 480px", margin="4px 8px", overflow="auto")
        row = dict(flex_flow="row wrap", align_items="flex-start")
        self.memory_title = W.HTML()
        memory = W.VBox([self.memory_title, self.bars,
                         self.memory_legend], layout=W.Layout(**box))
        self.children = [
            self.header,
            W.HBox([memory, W.VBox([self.timeline, self.timeline_caption],
                                   layout=W.Layout(**box))],
                   layout=W.Layout(**row)),
            W.HBox([W.VBox([self.traffic], layout=W.Layout(**box)),
                    W.VBox([self.steps], layout=W.Layout(**box))], layout=W.Layout(**row)),
            W.HBox([W.VBox([self.units_table], layout=W.Layout(**box)),
                    W.VBox([self.bandwidth], layout=W.Layout(**box))], layout=W.Layout(**row))]
        self._mem_scale = self._sent_scale = 0.0
        self._image_events = -1
        self.render(final=False)

    def start(self, world_size: int) -> None:
        self.runs = Runs()  # a new launch, a new job
        self._mem_scale = self._sent_scale = 0.0
        self._image_events = -1
        super().start(world_size)

    @property
    def run(self) -> RunState:
        return self.runs.latest or RunState("waiting", self.world_size)

    def ranks(self) -> list[int]:
        run = self.run
        return sorted(set(run.rank_ids()) | set(range(self.world_size or 0)))

    def render(self, final: bool) -> None:
        run = self.run
        self.header.value = self._header_html(run)
        self._render_memory(run, final)
        self._render_traffic(run)
        self.steps.value = self._steps_html(run)
        self.units_table.value = self._units_html(run)
        self.bandwidth.value = self._bandwidth_html(run)
        if run.events != self._image_events or final:
            self._image_events = run.events
            self.timeline.value = memory_timeline_svg(run)

    def static_figure(self):
        return plots.dashboard_figure(self.run)

    def _header_html(self, run: RunState) -> str:
        step, loss = run.last_step(), run.loss()
        facts = [f"<b>{html.escape(run.name)}</b>", f"{len(self.ranks())} ranks"]
        if run.params:
            facts.append(f"{run.params:,} parameters (Ψ)")
        if run.device:
            facts.append(f"{run.device} / {run.backend}")
        facts += [f"step {step if step is not None else '–'}",
                  f"loss {loss:.4f}" if loss is not None else "loss –",
                  f"median step {fmt_seconds(run.step_seconds())}", self.status]
        return f'<div style="{_FONT};font-size:14px">{" · ".join(facts)}</div>'

    def _render_memory(self, run: RunState, final: bool = False) -> None:
        ranks = self.ranks()
        # Note: live, the bars show each rank now; once the job is over, at its peak.
        self.memory_title.value = ("<b>Memory per rank</b> at its peak, stacked by category"
                                   if final else "<b>Memory per rank</b> now, stacked by category")
        if len(self.bars.children) != len(ranks):
            self.bars.children = [W.HTML() for _ in ranks]
        theory, with_unit = run.theory_persistent(), run.theory_with_unit()
        self._mem_scale = max([self._mem_scale, theory or 0, with_unit or 0] +
                              [run.peak(r) for r in ranks]) * 1.0
        scale = self._mem_scale * 1.08
        for bar, r in zip(self.bars.children, ranks):
            bar.value = self._memory_row(run, r, scale, final)
        formula = run.formulas.get("memory", "")
        items = [(CATEGORY_NAMES[c], f"background:{CATEGORY_COLORS[c]}") for c in CATEGORIES]
        items.append(("peak so far", f"border-left:{_PEAK};width:0"))
        if theory is not None:
            items.append((f"formula {formula}: model state {fmt_bytes(theory)}",
                          f"border-left:{_THEORY};width:0"))
        if with_unit is not None:
            items.append((f"formula + one unit gathered: {fmt_bytes(with_unit)}",
                          f"border-left:{_THEORY_UNIT};width:0"))
        self.memory_legend.value = swatches_html(items)
        self.timeline_caption.value = swatches_html(
            [("rank 0 stacked by category; total of", "width:0")] +
            [(f"rank {r}", f"border-top:2px solid {rank_color(r)};height:0") for r in ranks])

    def _memory_row(self, run: RunState, r: int, scale: float, final: bool = False) -> str:
        ev = run.rank(r).peak if final else run.rank(r).memory
        now = ev["total_bytes"] if ev else 0
        segments = [(ev["by_category"].get(c, 0), CATEGORY_COLORS[c],
                     f"{CATEGORY_NAMES[c]}: {fmt_bytes(ev['by_category'].get(c, 0))}")
                    for c in CATEGORIES] if ev else []
        markers = [(run.peak(r), _PEAK, f"peak {fmt_bytes(run.peak(r))}")]
        if run.theory_persistent() is not None:
            markers.append((run.theory_persistent(), _THEORY, "formula: model state"))
        if run.theory_with_unit() is not None:
            markers.append((run.theory_with_unit(), _THEORY_UNIT, "formula: + one unit"))
        label = (("at peak: " if final else "now: ") + html.escape(ev["label"])
                 if ev else "no snapshot yet")
        cuda = ev.get("cuda") if ev else None
        extra = (f" · CUDA alloc {fmt_bytes(cuda.get('allocated_bytes'))}, reserved "
                 f"{fmt_bytes(cuda.get('reserved_bytes'))}" if cuda else "")
        return (f'<div style="{_FONT};display:flex;align-items:center;gap:8px;margin:3px 0">'
                f'<span style="width:52px">{_rank_label(r)}</span>'
                f'<div style="flex:1">{track_html(segments, scale, markers)}</div>'
                f'<span style="width:250px">{fmt_bytes(now)} · peak {fmt_bytes(run.peak(r))}'
                f'<br><small style="color:#666">{label}{extra}</small></span></div>')

    def _render_traffic(self, run: RunState) -> None:
        step, theory, ranks = run.last_step(), run.theory_sent_per_step(), self.ranks()
        sent = {r: run.sent(r, step) if step is not None else {} for r in ranks}
        self._sent_scale = max([self._sent_scale, theory or 0] +
                               [sum(s.values()) for s in sent.values()])
        markers = [(theory, _THEORY, "formula")] if theory is not None else []
        rows = []
        for r in ranks:
            segments = [(b, OP_COLORS.get(op, "grey"), f"{_op_name(op)}: {fmt_bytes(b)}")
                        for op, b in sorted(sent[r].items())]
            bar = track_html(segments, self._sent_scale * 1.08, markers)
            rows.append([_rank_label(r), f'<div style="width:150px">{bar}</div>',
                         fmt_bytes(sum(sent[r].values())), fmt_bytes(theory),
                         fmt_bytes(run.sent_total(r))])
        formula = run.formulas.get("sent", "")
        ops = sorted({op for s in sent.values() for op in s})
        self.traffic.value = (
            f"<b>Bytes sent per rank</b> in step {step if step is not None else '–'} "
            "(ring model)" + table_html(["", "by collective", "this step", "formula",
                                         "whole run"], rows) +
            swatches_html([(_op_name(op), f"background:{OP_COLORS.get(op, 'grey')}") for op in ops]
                          + [(f"formula per step: {formula}", f"border-left:{_THEORY};width:0")]))

    def _units_html(self, run: RunState) -> str:
        step = run.last_step()
        by_unit = run.sent_by_unit(0, step) if step is not None else {}
        phases = sorted({p for d in by_unit.values() for p in d}, key=phase_order)
        rows = [[html.escape(u)] + [fmt_bytes(d[p]) if p in d else "" for p in phases] +
                [fmt_bytes(sum(d.values()))] for u, d in by_unit.items()]
        return (f"<b>Bytes rank 0 sent per unit</b> in step {step if step is not None else '–'}"
                + table_html(["unit"] + [_SHORT_PHASE.get(p, phase_name(p)) for p in phases]
                             + ["total"], rows))

    def _bandwidth_html(self, run: RunState) -> str:
        rows = [[_op_name(b["op"]), b["calls"], fmt_bytes(b["payload_bytes"]),
                 fmt_seconds(b["seconds"]), fmt_rate(b["algbw"]), fmt_rate(b["busbw"])]
                for b in run.bandwidth()]
        return ("<b>Bandwidth per collective</b>, all ranks, whole run" +
                table_html(["op", "calls", "payload", "time", "algbw", "busbw"], rows) +
                f'<div style="{_FONT};color:#666">nccl-tests convention: algbw = payload / time; '
                "busbw = algbw × (N−1)/N (all-gather, reduce-scatter), × 2(N−1)/N (all-reduce). "
                "GB/s = 10⁹ B/s. Time is issue → done as the host saw it (waiting included).</div>")

    def _steps_html(self, run: RunState) -> str:
        step = run.last_step()
        found = ({r: plots.compute_and_comm(run, r, step) for r in self.ranks()}
                 if step is not None else {})
        found = {r: f for r, f in found.items() if f}
        if not found:
            return "<b>Compute and communication</b>: no completed step yet"
        t0 = min(f[0] for f in found.values())
        span = max(f[1] for f in found.values()) - t0
        rows = []
        for r, (start, end, compute, comm) in found.items():
            lanes = (_lane([(s, e, COMPUTE_COLOR, "compute") for s, e in compute], t0, span) +
                     _lane([(s, e, OP_COLORS.get(op, "grey"), f"{label} {fmt_seconds(e - s)}")
                            for s, e, op, label in comm], t0, span))
            rows.append(f'<div style="{_FONT};display:flex;align-items:center;gap:8px">'
                        f'<span style="width:52px">{_rank_label(r)}</span>'
                        f'<div style="flex:1">{lanes}</div>'
                        f'<span style="width:70px">{fmt_seconds(end - start)}</span></div>')
        ops = sorted({c[2] for f in found.values() for c in f[3]})
        legend = swatches_html([("compute", f"background:{COMPUTE_COLOR}")] +
                               [(_op_name(op), f"background:{OP_COLORS.get(op, 'grey')}")
                                for op in ops])
        return (f"<b>Step {step}: compute (upper lane) and collectives (lower lane)</b>, "
                f"{fmt_seconds(span)} across ranks" + "".join(rows) + legend)


def _lane(intervals, t0, span) -> str:
    """Intervals [(start, end, color, tooltip)] placed on a track from t0 to t0 + span."""
    parts = [f'<div title="{html.escape(tip)}" style="position:absolute;'
             f'left:{100 * (s - t0) / span:.2f}%;width:{max(0.3, 100 * (e - s) / span):.2f}%;'
             f'top:0;bottom:0;background:{color};opacity:0.85"></div>'
             for s, e, color, tip in intervals]
    return (f'<div style="position:relative;height:9px;margin:2px 0;background:#f6f6f6">'
            f'{"".join(parts)}</div>')


def _png(fig, dpi) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


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
        self.header.value = (f'<div style="{_FONT};font-size:14px"><b>Strategies compared</b>'
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
            [("peak", f"border-left:{_PEAK};width:0"),
             ("formula", f"border-left:{_THEORY};width:0"),
             ("bytes sent, measured", f"background:{OP_COLORS['all_gather']}")])

    def _row(self, run: RunState, mem_scale: float, sent_scale: float) -> list:
        worst = max(run.rank_ids(), key=run.peak, default=0)
        peak_ev = run.rank(worst).peak
        segments = [(peak_ev["by_category"].get(c, 0), CATEGORY_COLORS[c], CATEGORY_NAMES[c])
                    for c in CATEGORIES] if peak_ev else []
        theory, sent, sent_theory = (run.theory_persistent(), run.sent_per_step(),
                                     run.theory_sent_per_step())
        memory = track_html(segments, mem_scale, [(run.peak(worst), _PEAK, "peak")] +
                            ([(theory, _THEORY, "formula")] if theory is not None else []))
        traffic = track_html([(sent or 0, OP_COLORS["all_gather"], "measured")], sent_scale,
                             [(sent_theory, _THEORY, "formula")] if sent_theory is not None else [])
        loss = run.loss()
        return [f"<b>{html.escape(run.name)}</b>",
                f'<div style="width:170px">{memory}</div>', fmt_bytes(run.peak(worst)),
                fmt_bytes(_largest(run, run.persistent)), fmt_bytes(theory),
                f'<div style="width:100px">{traffic}</div>', fmt_bytes(sent),
                fmt_bytes(sent_theory), fmt_seconds(run.step_seconds()),
                "–" if loss is None else f"{loss:.4f}"]


def _largest(run: RunState, value) -> float:
    return max([value(r) or 0 for r in run.rank_ids()] or [0])
