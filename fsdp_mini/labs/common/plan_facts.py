"""What the budgets where a planner-search answer differs have in common: what its choices that
do not fit would fit, which figure its choices minimise, the limit it behaves as if it kept,
which option it never takes and along which axis it never changes (the hints of
:mod:`.plan_search`)."""

from __future__ import annotations

from .configurations import PRECISIONS, STRATEGIES
from .facts import right_wherever_words
from .plan_candidates import _cost, _key, candidates, changed


def _differing(d):
    """(cfg, yours, the reference's) of every differing budget."""
    return [(c, *(r.get("choice") for r in d.table[c])) for c in d.differ]


def _some(rows, n: int = 6) -> list:
    """``n`` of ``rows``, spread from the first to the last (facts that need more plans)."""
    return rows[::-(-len(rows) // n)] if rows else []


def _mine(d) -> list:
    return [r[0].get("choice") for r in d.table.values() if isinstance(r[0].get("choice"), dict)]


def _not_fitting(search, d) -> list[str]:
    """What every choice of yours that does not fit would fit (the first 6 such budgets)."""
    rows = [(c, candidates(search, c)[_key(m)], m) for c, m, _ in _differing(d)
            if isinstance(m, dict) and not search.within(c, candidates(search, c)[_key(m)])]
    rows = _some(rows)
    if not rows:
        return []
    found = [w for w, test in search.limits + LIMITS
             if all(test(search, c, s) for c, s, _ in rows)]
    found += [f"planned {w}, it fits" for w, change in search.plain if all(
        search.within(changed(c, change), candidates(search, c, **change)[_key(m)])
        for c, _, m in rows)]
    if all(getattr(s, search.cost) <= min(getattr(x, search.cost) for x in
                                          candidates(search, c).values()) for c, s, _ in rows):
        found.append(f"it is the cheapest of all candidates, fitting or not ({search.cost})")
    return [f"in the {len(rows)} budgets where your choice does not fit: " + "; ".join(found)
            if found else f"your choice does not fit: its planned peak is "
            f"{search.peak_words(rows[0][0], rows[0][1])}"]


LIMITS = (("it fits without its activations", lambda search, c, s: s.by_category[
              "activations"] and search.within(c, s, s.peak_bytes - s.by_category["activations"])),
          ("it fits without Adam's state (optimizer_state)", lambda search, c, s: s.by_category[
              "optimizer_state"] and search.within(c, s, s.peak_bytes -
                                                   s.by_category["optimizer_state"])),
          ("its state kept between steps (persistent_bytes) fits, not its peak",
           lambda search, c, s: search.within(c, s, s.persistent_bytes)))


def _ranked(search, d) -> list[str]:
    """Which figure every choice of yours that fits and costs more minimises (6 budgets)."""
    rows = [(c, _key(m), candidates(search, c)) for c, m, w in _differing(d)
            if isinstance(m, dict) and search.within(c, candidates(search, c)[_key(m)])]
    rows = _some(rows, 12)
    if not rows:
        return []
    found = []
    for figure, words in FIGURES:
        if figure != search.cost and all(
                _figure(p[k], figure) == min(_figure(s, figure) for key, s in p.items()
                                             if search.within(c, s)) for c, k, p in rows):
            found.append(f"it has {words} of the candidates that fit")
    if all(k == next(key for key, s in p.items() if search.within(c, s)) for c, k, p in rows):
        found.append("it is the first candidate that fits in the order tried (precision, "
                     "checkpointing, strategy)")
    for words, change in search.plain:
        if all(k == _cheapest(search, c, **change) for c, k, _ in rows):
            found.append(f"it is the cheapest when planned {words}")
    ties = [c for c, k, p in rows if getattr(p[k], search.cost) == getattr(
        p[_cheapest(search, c)], search.cost)]
    if ties:
        found.append(f"in {len(ties)} of these budgets it costs exactly as much as the "
                     f"reference's: at equal {search.cost} no checkpointing comes first, then "
                     f"the less sharded strategy ({', '.join(STRATEGIES)})")
    return [f"in the {len(rows)} budgets where your choice fits but costs more: "
            + "; ".join(found)] if found else []


def _cheapest(search, cfg, **change):
    p = candidates(search, cfg, **change)
    fit = [(_cost(search, k, s), k) for k, s in p.items() if search.within(changed(cfg, change),
                                                                            s)]
    return min(fit)[1] if fit else None


FIGURES = (("peak_bytes", "the smallest planned peak"),
           ("sent_bytes_per_step", "the fewest bytes sent per step"),
           ("step_seconds", "the fastest step"), ("persistent_bytes", "the least state kept"),
           ("compute_seconds", "the least compute (its communication left out of the step)"),
           ("all_comm", "the fastest step if none of its communication were hidden (compute + "
            "every collective: the overlap left out; step_seconds counts only what is not "
            "hidden)"))


def _figure(s, figure: str) -> float:
    return s.compute_seconds + s.comm_seconds_per_step if figure == "all_comm" else getattr(
        s, figure)


def _never(d) -> list[str]:
    """Options your answers never take that the reference takes where they differ."""
    mine, out = _mine(d), []
    for option, values in (("precision", PRECISIONS), ("checkpointing", (True, False)),
                           ("strategy", STRATEGIES)):
        for v in values:
            wanted = sum(isinstance(w, dict) and w[option] == v for _, _, w in _differing(d))
            if mine and wanted and not any(m[option] == v for m in mine):
                name = {True: "with checkpointing", False: "without checkpointing"}.get(v, v)
                out.append(f"you never chose {name} in any budget; the reference does in "
                           f"{wanted} of those where you differ")
    return out


def _invariant(d) -> list[str]:
    """Axes your choices never change along, while the reference's do."""
    out = []
    for axis in ("micro_batch", "gpu_mem_gb", "headroom"):
        groups = {}
        for c, (mine, want) in d.table.items():
            if axis in c:
                rest = tuple(sorted((k, repr(v)) for k, v in c.items() if k != axis))
                groups.setdefault(rest, []).append((repr(mine.get("choice")),
                                                    repr(want.get("choice"))))
        if any(len({w for _, w in g}) > 1 for g in groups.values()) and all(
                len({m for m, _ in g}) == 1 for g in groups.values()):
            out.append(f"your choices never change with {axis.replace('_', ' ')}; the "
                       f"reference's do: does it reach plan() and the limit?")
    return out


def _refused(search, d) -> list[str]:
    """Where you chose nothing and a candidate fits: the limit your choices behave as if they
    kept, as a share of the budget's (from the peaks you took and those you refused)."""
    rows = [(c, candidates(search, c)[_key(w)]) for c, m, w in _differing(d)
            if m is None and isinstance(w, dict)]
    if not rows:
        return []
    taken = [candidates(search, c)[_key(m)].peak_bytes / search.room(c) for c, m, _ in
             _some([r for r in _differing(d) if isinstance(r[1], dict)], 12)]
    taken += [candidates(search, c)[_key(w)].peak_bytes / search.room(c) for c in d.agree
              for w in [d.table[c][0].get("choice")] if isinstance(w, dict)][:12]
    low, high = max(taken, default=0), min(s.peak_bytes / search.room(c) for c, s in rows)
    c, s = rows[0]
    said = (f"in {len(rows)} budgets you chose nothing where one fits (here {search.peak_words(c, s)}"
            "): the limit you compare the peak with is smaller than the budget's")
    if low < high < 1:
        said += (f"; your choices behave as if the limit were between {low:.2f} and "
                 f"{high:.2f} of it")
    return [said]


def _facts(search, d) -> str:
    found = _refused(search, d) + _not_fitting(search, d) + _ranked(search, d) + \
        _invariant(d) + _never(d)
    return "; ".join(found[:5]) or right_wherever_words(d)
