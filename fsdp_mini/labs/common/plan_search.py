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

from dataclasses import dataclass, field
from typing import Callable

from .compare import where_right
from .configurations import describe, what_is_invalid
from .differential import Check, Hint
from .plan_candidates import (Search, _key, _peak, budget, candidates,  # noqa: F401
                              remembered_plans)
from .plan_facts import _facts


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


HINTS = [
    Hint(lambda d: d.raised and "(by name)" in d.config["model"], "the lab calls it later "
         "with a preset's name ('70b'): plan(model=...) takes a name or a ModelShape, so pass "
         "model straight to it"),
    Hint(lambda d: d.raised is not None, "model is a ModelShape (or a preset's name), gpus a "
         "count, gpu_mem_gb in GB (10⁹ B), micro_batch a count"),
    Hint(lambda d: isinstance(d.whole[0], str), "return a dict with the keys strategy, "
         "precision, checkpointing (or None when nothing fits)"),
]
