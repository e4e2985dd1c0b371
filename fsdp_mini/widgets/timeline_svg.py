"""The live memory timeline as inline SVG: the same picture as ``plots.memory_timeline``, made
in about a millisecond.

Note: the dashboard redraws several times a second while the ranks train on the same cores.
A matplotlib PNG costs 0.1–0.3 s of CPU each time, time the ranks would lose; an SVG string
costs almost nothing and updates inside an ``ipywidgets.HTML`` anywhere.
"""

from __future__ import annotations

from ..memory import CATEGORIES
from ..plots import CATEGORY_COLORS, rank_color
from ..telemetry.runstate import RunState
from ..telemetry.units import fmt_bytes

W, H = 640, 260                      # drawing size in pixels
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 22, 30


def memory_timeline_svg(run: RunState, steps: int = 2, rank: int = 0) -> str:
    """Rank ``rank`` stacked by category over the last ``steps`` steps; every rank's total."""
    shown = run.recent_memory_steps(steps)
    points = {r: run.memory_points(r, shown) for r in run.rank_ids()}
    if not points.get(rank):
        return _frame("Memory over time: waiting for the first snapshots", [])
    t0 = min(ev["time"] for pts in points.values() for ev in pts)
    t1 = max(ev["time"] for pts in points.values() for ev in pts)
    theory = [v for v in (run.theory_persistent(), run.theory_with_unit()) if v]
    top = max([ev["total_bytes"] for pts in points.values() for ev in pts] + theory) * 1.12
    x = _scale(t0, max(t1, t0 + 1e-6), LEFT, W - RIGHT)
    y = _scale(0, top or 1, H - BOTTOM, TOP)
    parts = _stacked_areas(points[rank], x, y)
    parts += [_steps_line(pts, x, y, rank_color(r), 1.6 if r == rank else 1.0)
              for r, pts in points.items()]
    for value, dash in zip(theory, ("6,3", "2,3")):
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(value):.1f}" '
                     f'y2="{y(value):.1f}" stroke="#333" stroke-dasharray="{dash}"/>')
    for s in shown:
        ev = run.rank(rank).steps.get(s)
        if ev and t0 <= ev["start"] <= t1:
            px = x(ev["start"])
            parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
                         f'stroke="#999"/><text x="{px + 3:.1f}" y="{TOP + 10}" '
                         f'font-size="10">step {s}</text>')
    parts += _axes(y, top, (t1 - t0) * 1e3)
    title = (f"Memory over time, steps {shown[0]}–{shown[-1]} (rank {rank} stacked, "
             f"lines: each rank's total)")
    return _frame(title, parts)


def _scale(lo: float, hi: float, out_lo: float, out_hi: float):
    span = (hi - lo) or 1.0
    return lambda v: out_lo + (v - lo) / span * (out_hi - out_lo)


def _stacked_areas(pts: list[dict], x, y) -> list[str]:
    """One polygon per category, stacked, held flat between snapshots (a step plot)."""
    xs = [x(ev["time"]) for ev in pts] + [x(pts[-1]["time"])]
    below = [0.0] * len(pts)
    shapes = []
    for c in CATEGORIES:
        above = [b + ev["by_category"].get(c, 0) for b, ev in zip(below, pts)]
        upper = [f"{xs[i]:.1f},{y(v):.1f} {xs[i + 1]:.1f},{y(v):.1f}" for i, v in enumerate(above)]
        lower = [f"{xs[i + 1]:.1f},{y(v):.1f} {xs[i]:.1f},{y(v):.1f}"
                 for i, v in reversed(list(enumerate(below)))]
        shapes.append(f'<polygon points="{" ".join(upper + lower)}" '
                      f'fill="{CATEGORY_COLORS[c]}" fill-opacity="0.9"/>')
        below = above
    return shapes


def _steps_line(pts: list[dict], x, y, color: str, width: float) -> str:
    coords = []
    for a, b in zip(pts, pts[1:] + pts[-1:]):
        coords.append(f"{x(a['time']):.1f},{y(a['total_bytes']):.1f} "
                      f"{x(b['time']):.1f},{y(a['total_bytes']):.1f}")
    return (f'<polyline points="{" ".join(coords)}" fill="none" stroke="{color}" '
            f'stroke-width="{width}"/>')


def _axes(y, top: float, span_ms: float) -> list[str]:
    parts = [f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{H - BOTTOM}" stroke="#444"/>',
             f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}" '
             f'stroke="#444"/>']
    for i in range(5):
        value = top / 1.12 * i / 4
        parts.append(f'<text x="{LEFT - 4}" y="{y(value) + 3:.1f}" font-size="10" '
                     f'text-anchor="end">{fmt_bytes(value)}</text>')
    parts.append(f'<text x="{W - RIGHT}" y="{H - 8}" font-size="10" text-anchor="end">'
                 f'{span_ms:.0f} ms</text><text x="{LEFT}" y="{H - 8}" font-size="10">0</text>')
    return parts


def _frame(title: str, parts: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'font-family="system-ui,sans-serif"><text x="{W / 2}" y="14" font-size="12" '
            f'text-anchor="middle">{title}</text>{"".join(parts)}</svg>')
