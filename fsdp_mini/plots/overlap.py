"""Rank 0's collectives of one step per variant, each from its issue to its end: when a rank
waited for them and when they travelled while it computed (lab 06's timeline of prefetch).

    timeline(per_rank, ["blocks", "blocks, prefetch"])   # per_rank[0][name]["records"]
"""

from __future__ import annotations

__all__ = ["timeline"]


def _pale(color: str) -> str:
    """The colour mixed 70 % with white: opaque, so overlapping bars never blend into a new hue."""
    rgb = [int(color[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(v + 0.7 * (255 - v)):02x}" for v in rgb)


def timeline(per_rank: list[dict], names, ax=None):
    """Rank 0's last step of each variant: one lane per variant, one row per kind of collective,
    a bar per collective from its issue to its end (pale: the rank computed meanwhile; dark: the
    rank waited for it). Note: bars are opaque, so where two collectives of a row are in flight
    together (queued on the link), the later pale bar covers the earlier one's pale end."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    colors = {"all_gather": "#4C72B0", "reduce_scatter": "#DD8452", "all_reduce": "#55A868"}
    drawn = [op for op in colors if any(r["op"] == op for n in names for r in per_rank[0][n]["records"])]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * len(names) * len(drawn)), layout="constrained")
    row = 0.8 / max(len(drawn), 1)          # each op its own row inside a variant's lane
    for waiting in (False, True):  # Note: every pale bar first, so no wait is covered
        for lane, name in enumerate(names):
            recs = [r for r in per_rank[0][name]["records"] if r["op"] in colors]
            t0 = min(r["start"] for r in recs)
            for r in recs:
                y = lane - 0.4 + row * (drawn.index(r["op"]) + 0.5)
                start, end = (r["start"] - t0) * 1e3, (r["start"] - t0 + r["seconds"]) * 1e3
                if waiting:
                    start += r["waited"] * 1e3
                c = colors[r["op"]] if waiting else _pale(colors[r["op"]])
                ax.barh(y, end - start, left=start, height=row * 0.85, color=c)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlabel("ms since the step's first collective (rank 0)")
    ax.set_title("rank 0's collectives, each from its issue to its end")
    handles = [Patch(color=c, label=f"{op}: {what}") for op in drawn
               for c, what in ((colors[op], "rank waiting"), (_pale(colors[op]), "rank computing"))]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax
