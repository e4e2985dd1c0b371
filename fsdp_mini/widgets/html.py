"""Small HTML pieces the live widgets are drawn with (bars, swatches, tables)."""

from __future__ import annotations

import html

from ..plots import rank_color

FONT = "font-family:system-ui,sans-serif;font-size:12px;line-height:1.35"
CELL = "padding:2px 8px;text-align:right;white-space:nowrap"


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
    return f'<div style="{FONT};display:flex;flex-wrap:wrap;gap:4px 14px">{spans}</div>'


def table_html(header, rows) -> str:
    head = "".join(f'<th style="{CELL}">{h}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{CELL}">{c}</td>' for c in row) + "</tr>"
                   for row in rows)
    return f'<table style="{FONT};border-collapse:collapse"><tr>{head}</tr>{body}</table>'


def rank_label(r: int) -> str:
    return f'<b style="color:{rank_color(r)}">rank {r}</b>'


def op_name(op: str) -> str:
    return op.replace("_", "-")


SHORT_PHASE = {"forward": "gather, fwd", "backward": "gather, bwd", "grad": "scatter grads"}
PEAK = "2px solid #000"
THEORY = "2px dashed #333"
THEORY_UNIT = "2px dotted #333"
