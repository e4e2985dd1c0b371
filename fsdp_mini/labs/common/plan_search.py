"""The planner-search check: a function that asks ``fsdp_mini.plan`` about every candidate (ddp,
zero1, zero2, fsdp x fp32, bf16-mixed x checkpointing) and returns the cheapest that fits a
budget, or None. Lab 07's ``cheapest_fit`` (fits with the planner's reserve; the fastest step)
and the assessment's ``choose_config`` (within a headroom; the fewest bytes) are two
:class:`Search` es of one :class:`SearchCheck`::

    check = SearchCheck("your cheapest_fit", search=CHEAPEST)
    check(cheapest_fit, reference, result, configs=budgets(...) + the lab's own)
    # ✘ at model '7b', gpus 2, gpu mem gb 24, micro batch 4: cheapest_fit chose fsdp, fp32, ...

A verdict says both decisions with their planned peak and cost; its hint, what the numbers of
every budget where the answer differs have in common (what the choices that do not fit would
fit, which figure they minimise, which option they never take, along which axis they never
change).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Callable

import fsdp_mini

from .compare import where_right
from .configurations import PRECISIONS, STRATEGIES, describe, what_is_invalid
from .differential import Check, Hint
from .records import Config
from .facts import right_wherever_words

_MEMO: dict = {}


def _plan(**kwargs):
    """``fsdp_mini.plan`` remembered: the reference, the answers and the hints ask it the same."""
    key = tuple(sorted(kwargs.items()))
    if key not in _MEMO:
        _MEMO[key] = _REAL_PLAN(**kwargs)
    return _MEMO[key]


_REAL_PLAN = fsdp_mini.plan


@contextlib.contextmanager
def remembered_plans():
    """While answers run, ``fsdp_mini.plan`` answers a call it has seen from memory (a copy)."""
    def plan(*args, **kwargs):
        try:
            return copy.deepcopy(_plan(**kwargs)) if not args else _REAL_PLAN(*args, **kwargs)
        except TypeError:   # Note: an unhashable argument: planned afresh
            return _REAL_PLAN(*args, **kwargs)
    fsdp_mini.plan = plan
    try:
        yield
    finally:
        fsdp_mini.plan = _REAL_PLAN


def budget(model: str, shape, gpus: int, gpu_mem_gb: float, micro_batch: int,
           by_name: bool = False, **more) -> Config:
    """A budget as a check's configuration (``_given``: what the answer receives as model)."""
    return Config(model=model + " (by name)" * by_name, gpus=gpus, gpu_mem_gb=gpu_mem_gb,
                  micro_batch=micro_batch, **more, _given=model if by_name else shape)


@dataclass(frozen=True)
class Search:
    """One exercise: the answer's name and arguments, how a candidate fits, what it costs."""

    name: str
    args: tuple                                  # budget fields passed after the model
    cost: str                                    # the StrategyPlan figure minimised
    cost_words: Callable                         # (StrategyPlan) -> "a step of 0.43 s ..."
    room: Callable                               # (cfg) -> the bytes a planned peak may take
    peak_words: Callable                         # (cfg, StrategyPlan) -> "45.9 GB + 3.4 GB ..."
    fits: Callable = None                        # (cfg, StrategyPlan) -> bool (default: room)
    limits: tuple = ()                           # (words, (cfg, s) -> bool): other limits
    options: Callable = lambda precision: {}     # more plan() arguments, per precision
    plain: tuple = ()                            # (words, {plan argument: its default})
    reveal: bool = True                          # say the reference's choice

    def within(self, cfg, s, peak=None) -> bool:
        if peak is None and self.fits is not None:
            return self.fits(cfg, s)
        return (s.peak_bytes if peak is None else peak) <= self.room(cfg)


def candidates(search: Search, cfg: Config, **change) -> dict:
    """{(strategy, precision, checkpointing): StrategyPlan} of every candidate on ``cfg``
    (``change``: plan() arguments instead of the budget's; ``_options``: instead of the
    search's)."""
    options = change.pop("_options", None)
    c, out = {**cfg, **change}, {}
    for prec in PRECISIONS:
        for ck in (False, True):
            p = _plan(model=c["_given"], gpus=c["gpus"], gpu_mem_gb=c["gpu_mem_gb"],
                      precision=prec, micro_batch=c["micro_batch"], checkpointing=ck,
                      strategies=STRATEGIES, **(search.options(prec) if options is None
                                                else options))
            out.update({(s, prec, ck): sp for s, sp in p.strategies.items()})
    return out


def _peak(s) -> float:
    return s.peak_bytes


def _key(choice) -> tuple:
    return choice["strategy"], choice["precision"], choice["checkpointing"]


def _cost(search, key, s) -> tuple:
    return getattr(s, search.cost), key[2], STRATEGIES.index(key[0])


@dataclass
class SearchCheck(Check):
    """A :class:`Check` of a planner search: the first budget where the decision differs, both
    decisions and what they cost in words."""

    search: Search = None
    what: str = ""
    observe: Callable = None
    configs: list = field(default_factory=list)

    def __post_init__(self):
        self.observe, self.order = self._observe, ("choice",)
        self.hints = HINTS + [Hint(lambda d: d.observable == "choice",
                                   lambda d: _facts(self.search, d))]

    def _observe(self, fn, cfg, record) -> None:
        with remembered_plans():
            answer = fn(cfg["_given"], *(cfg[a] for a in self.search.args))
        record.see("choice", what_is_invalid(answer) or answer)

    def costed(self, cfg, choice) -> str:
        if choice is None:
            return "nothing"
        if isinstance(choice, str):
            return choice
        s = candidates(self.search, cfg)[_key(choice)]
        return (f"{describe(choice)}: planned peak {self.search.peak_words(cfg, s)}, "
                f"{self.search.cost_words(s)}")

    def sentence(self, d) -> str:
        if d.observable != "choice" or d.raised:
            return super().sentence(d)
        cfg, (mine, want), s = d.config, d.whole, self.search
        said = f"at {cfg.words()}: {s.name} chose {self.costed(cfg, mine)}"
        if s.reveal or want is None:
            said += f"; the reference {self.costed(cfg, want)}" if want else (
                f"; the reference: nothing fits (the smallest planned peak is "
                f"{s.peak_words(cfg, min(candidates(s, cfg).values(), key=_peak))})")
        elif mine is None or isinstance(mine, str):
            said += f"; one fits: {s.peak_words(cfg, candidates(s, cfg)[_key(want)])}"
        elif s.within(cfg, candidates(s, cfg)[_key(mine)]):
            w, m = (candidates(s, cfg)[_key(x)] for x in (want, mine))
            said += ("; another that fits costs as little: at equal cost no checkpointing "
                     "comes first, then the less sharded strategy" if getattr(w, s.cost) ==
                     getattr(m, s.cost) else f"; the cheapest that fits: {s.cost_words(w)}")
        return f"{said}; {where_right(d.agree, d.differ)}"


# -- what the budgets where the answer differs have in common ----------------------------------------

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
        search.within({**c, **change}, candidates(search, c, **change)[_key(m)])
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
    rows = _some(rows)
    if not rows:
        return []
    found = []
    for figure, words in FIGURES:
        if figure != search.cost and all(
                getattr(p[k], figure) == min(getattr(s, figure) for key, s in p.items()
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
    fit = [(_cost(search, k, s), k) for k, s in p.items() if search.within({**cfg, **change}, s)]
    return min(fit)[1] if fit else None


FIGURES = (("peak_bytes", "the smallest planned peak"),
           ("sent_bytes_per_step", "the fewest bytes sent per step"),
           ("step_seconds", "the fastest step"), ("persistent_bytes", "the least state kept"))


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


def _facts(search, d) -> str:
    found = _not_fitting(search, d) + _ranked(search, d) + _invariant(d) + _never(d)
    return "; ".join(found[:5]) or right_wherever_words(d)


HINTS = [
    Hint(lambda d: d.raised and "(by name)" in d.config["model"], "the lab calls it later "
         "with a preset's name ('70b'): plan(model=...) takes a name or a ModelShape, so pass "
         "model straight to it"),
    Hint(lambda d: d.raised is not None, "model is a ModelShape (or a preset's name), gpus a "
         "count, gpu_mem_gb in GB (10⁹ B), micro_batch a count"),
    Hint(lambda d: isinstance(d.whole[0], str), "return a dict with the keys strategy, "
         "precision, checkpointing (or None when nothing fits)"),
]
