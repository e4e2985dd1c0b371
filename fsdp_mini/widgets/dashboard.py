"""The dashboard of one training job: memory per rank, bytes per collective, compute vs comm
(see :mod:`fsdp_mini.widgets` for how the widgets are fed and drawn)."""

from __future__ import annotations

import html

import ipywidgets as W

from .. import plots
from ..memory import CATEGORIES
from ..plots import CATEGORY_COLORS, CATEGORY_NAMES, COMPUTE_COLOR, OP_COLORS, rank_color
from ..telemetry.runstate import Runs, RunState, phase_order
from ..telemetry.units import fmt_bytes, fmt_link, fmt_rate, fmt_seconds, phase_name
from .html import (FONT, PEAK, SHORT_PHASE, THEORY, THEORY_UNIT, op_name, rank_label, swatches_html,
                   table_html, track_html)
from .live import _Live
from .timeline_svg import memory_timeline_svg

# -- one run ------------------------------------------------------------------------------------

class Dashboard(_Live):
    """One training job, live: memory per rank, traffic per collective and unit, step timeline."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.header = W.HTML()
        self.bars = W.VBox()
        self.memory_legend = W.HTML()
        self.device_memory = W.HTML()  # on GPUs: the allocator and nvidia-smi beside the tensors
        self.timeline = W.HTML(layout=W.Layout(max_width="100%"))
        self.timeline_caption = W.HTML()
        self.traffic = W.HTML()
        self.units_table = W.HTML()
        self.bandwidth = W.HTML()
        self.steps = W.HTML()
        box = dict(flex="1 1 480px", margin="4px 8px", overflow="auto")
        row = dict(flex_flow="row wrap", align_items="flex-start")
        self.memory_title = W.HTML()
        memory = W.VBox([self.memory_title, self.bars, self.memory_legend, self.device_memory],
                        layout=W.Layout(**box))
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
        if run.link:
            facts.append(fmt_link(run.link))
        facts += [f"step {step if step is not None else '–'}",
                  f"loss {loss:.4f}" if loss is not None else "loss –",
                  f"median step {fmt_seconds(run.step_seconds())}", self.status]
        return f'<div style="{FONT};font-size:14px">{" · ".join(facts)}</div>'

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
        items.append(("peak so far", f"border-left:{PEAK};width:0"))
        if theory is not None:
            items.append((f"formula {formula}: model state {fmt_bytes(theory)}",
                          f"border-left:{THEORY};width:0"))
        if with_unit is not None:
            items.append((f"formula + one unit gathered: {fmt_bytes(with_unit)}",
                          f"border-left:{THEORY_UNIT};width:0"))
        self.memory_legend.value = swatches_html(items)
        self.device_memory.value = self._device_memory_html(run, ranks, final)
        self.timeline_caption.value = swatches_html(
            [("rank 0 stacked by category; total of", "width:0")] +
            [(f"rank {r}", f"border-top:2px solid {rank_color(r)};height:0") for r in ranks])

    def _memory_row(self, run: RunState, r: int, scale: float, final: bool = False) -> str:
        ev = run.rank(r).peak if final else run.rank(r).memory
        now = ev["total_bytes"] if ev else 0
        segments = [(ev["by_category"].get(c, 0), CATEGORY_COLORS[c],
                     f"{CATEGORY_NAMES[c]}: {fmt_bytes(ev['by_category'].get(c, 0))}")
                    for c in CATEGORIES] if ev else []
        markers = [(run.peak(r), PEAK, f"peak {fmt_bytes(run.peak(r))}")]
        if run.theory_persistent() is not None:
            markers.append((run.theory_persistent(), THEORY, "formula: model state"))
        if run.theory_with_unit() is not None:
            markers.append((run.theory_with_unit(), THEORY_UNIT, "formula: + one unit"))
        label = (("at peak: " if final else "now: ") + html.escape(ev["label"])
                 if ev else "no snapshot yet")
        cuda = ev.get("cuda") if ev else None
        extra = (f"<br>allocator {fmt_bytes(cuda.get('allocated_bytes'))} allocated, "
                 f"{fmt_bytes(cuda.get('reserved_bytes'))} reserved"
                 + (f" · nvidia-smi {fmt_bytes(cuda['device_used_bytes'])} used"
                    if "device_used_bytes" in cuda else "") if cuda else "")
        return (f'<div style="{FONT};display:flex;align-items:center;gap:8px;margin:3px 0">'
                f'<span style="width:52px">{rank_label(r)}</span>'
                f'<div style="flex:1">{track_html(segments, scale, markers)}</div>'
                f'<span style="width:250px">{fmt_bytes(now)} · peak {fmt_bytes(run.peak(r))}'
                f'<br><small style="color:#666">{label}{extra}</small></span></div>')

    def _device_memory_html(self, run: RunState, ranks, final: bool) -> str:
        """On CUDA ranks: what the GPU holds beyond the tensors counted, one sentence per gap
        (for the rank whose GPU is fullest). Empty on CPU ranks."""
        seen = [(r, ev) for r in ranks
                if (ev := run.rank(r).peak if final else run.rank(r).memory) and ev.get("cuda")]
        if not seen:
            return ""
        r, ev = max(seen, key=lambda x: x[1]["cuda"].get("device_used_bytes", 0))
        cuda, tensors = ev["cuda"], ev["total_bytes"]
        allocated, reserved = cuda["allocated_bytes"], cuda["reserved_bytes"]
        gaps = [(f"tensors counted here {fmt_bytes(tensors)} → allocated {fmt_bytes(allocated)}",
                 allocated - tensors, "live blocks the categories do not see: temporaries "
                 "between two samples, and the allocator's rounding of every block to 512 B")]
        gaps.append((f"→ reserved {fmt_bytes(reserved)}", reserved - allocated,
                     "freed blocks the caching allocator keeps for reuse (fragmentation); "
                     "<code>torch.cuda.empty_cache()</code> returns them to the device"))
        if "device_used_bytes" in cuda:
            where = "NVML" if cuda.get("device_source") == "nvml" else "cudaMemGetInfo"
            gaps.append((f"→ used on the device {fmt_bytes(cuda['device_used_bytes'])} "
                         f"(what nvidia-smi shows, via {where})",
                         cuda["device_used_bytes"] - reserved,
                         "the CUDA context, NCCL's communication buffers, library workspaces "
                         "(cuBLAS), and any other process on this GPU"))
        items = "".join(f"<li>{step} ({'+' if gap >= 0 else '−'}{fmt_bytes(abs(gap))}): {why}</li>"
                        for step, gap, why in gaps)
        return (f'<div style="{FONT};font-size:12px;margin-top:6px"><b>On the GPU</b>, '
                f'{rank_label(r)} {"at its peak" if final else "now"}:<ul style="margin:2px '
                f'0 0 16px;padding:0">{items}</ul></div>')

    def _render_traffic(self, run: RunState) -> None:
        step, theory, ranks = run.last_step(), run.theory_sent_per_step(), self.ranks()
        sent = {r: run.sent(r, step) if step is not None else {} for r in ranks}
        self._sent_scale = max([self._sent_scale, theory or 0] +
                               [sum(s.values()) for s in sent.values()])
        markers = [(theory, THEORY, "formula")] if theory is not None else []
        rows = []
        for r in ranks:
            segments = [(b, OP_COLORS.get(op, "grey"), f"{op_name(op)}: {fmt_bytes(b)}")
                        for op, b in sorted(sent[r].items())]
            bar = track_html(segments, self._sent_scale * 1.08, markers)
            rows.append([rank_label(r), f'<div style="width:150px">{bar}</div>',
                         fmt_bytes(sum(sent[r].values())), fmt_bytes(theory),
                         fmt_bytes(run.sent_total(r))])
        formula = run.formulas.get("sent", "")
        ops = sorted({op for s in sent.values() for op in s})
        self.traffic.value = (
            f"<b>Bytes sent per rank</b> in step {step if step is not None else '–'} "
            "(ring model)" + table_html(["", "by collective", "this step", "formula",
                                         "whole run"], rows) +
            swatches_html([(op_name(op), f"background:{OP_COLORS.get(op, 'grey')}") for op in ops]
                          + [(f"formula per step: {formula}", f"border-left:{THEORY};width:0")]))

    def _units_html(self, run: RunState) -> str:
        step = run.last_step()
        by_unit = run.sent_by_unit(0, step) if step is not None else {}
        phases = sorted({p for d in by_unit.values() for p in d}, key=phase_order)
        rows = [[html.escape(u)] + [fmt_bytes(d[p]) if p in d else "" for p in phases] +
                [fmt_bytes(sum(d.values()))] for u, d in by_unit.items()]
        return (f"<b>Bytes rank 0 sent per unit</b> in step {step if step is not None else '–'}"
                + table_html(["unit"] + [SHORT_PHASE.get(p, phase_name(p)) for p in phases]
                             + ["total"], rows))

    def _bandwidth_html(self, run: RunState) -> str:
        sim = bool(run.link)  # Note: with a simulated link, its time is the one that counts
        rows = [[op_name(b["op"]), b["calls"], fmt_bytes(b["payload_bytes"]),
                 fmt_seconds(b["seconds"])] + ([fmt_seconds(b["sim_seconds"])] if sim else []) +
                [fmt_rate(b["algbw"]), fmt_rate(b["busbw"])] for b in run.bandwidth()]
        head = ["op", "calls", "payload", "time"] + (["on link"] if sim else []) + ["algbw",
                                                                                   "busbw"]
        note = (f"<br>{fmt_link(run.link)}: algbw and busbw from the time on the link (its "
                "α-β ring cost)." if sim else "")
        return ("<b>Bandwidth per collective</b>, all ranks, whole run" + table_html(head, rows) +
                f'<div style="{FONT};color:#666">nccl-tests convention: algbw = payload / time; '
                "busbw = algbw × (N−1)/N (all-gather, reduce-scatter), × 2(N−1)/N (all-reduce). "
                "GB/s = 10⁹ B/s. Time is issue → done as the host saw it (waiting included)."
                f"{note}</div>")

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
            rows.append(f'<div style="{FONT};display:flex;align-items:center;gap:8px">'
                        f'<span style="width:52px">{rank_label(r)}</span>'
                        f'<div style="flex:1">{lanes}</div>'
                        f'<span style="width:70px">{fmt_seconds(end - start)}</span></div>')
        ops = sorted({c[2] for f in found.values() for c in f[3]})
        legend = swatches_html([("compute", f"background:{COMPUTE_COLOR}")] +
                               [(op_name(op), f"background:{OP_COLORS.get(op, 'grey')}")
                                for op in ops])
        note = (f'<div style="{FONT};color:#666">collectives as the {fmt_link(run.link)} '
                "carried them</div>" if run.link else "")
        return (f"<b>Step {step}: compute (upper lane) and collectives (lower lane)</b>, "
                f"{fmt_seconds(span)} across ranks" + "".join(rows) + legend + note)


def _lane(intervals, t0, span) -> str:
    """Intervals [(start, end, color, tooltip)] placed on a track from t0 to t0 + span."""
    parts = [f'<div title="{html.escape(tip)}" style="position:absolute;'
             f'left:{100 * (s - t0) / span:.2f}%;width:{max(0.3, 100 * (e - s) / span):.2f}%;'
             f'top:0;bottom:0;background:{color};opacity:0.85"></div>'
             for s, e, color, tip in intervals]
    return (f'<div style="position:relative;height:9px;margin:2px 0;background:#f6f6f6">'
            f'{"".join(parts)}</div>')
