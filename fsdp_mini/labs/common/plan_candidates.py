"""The candidates of a planner search: every (strategy, precision, checkpointing) planned on a
budget, remembered while a check runs, and the :class:`Search` that says what fits and what it
costs (lab 07's cheapest fit, the assessment's choice). Used by :mod:`.plan_search` (the check)
and :mod:`.plan_facts` (what the budgets where an answer differs have in common)."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Callable

import fsdp_mini

from .configurations import PRECISIONS, STRATEGIES
from .records import Config

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
    c, out = changed(cfg, change), {}
    for prec in PRECISIONS:
        for ck in (False, True):
            more = search.options(prec) if options is None else options(prec) if callable(
                options) else options
            p = _plan(model=c["_given"], gpus=c["gpus"], gpu_mem_gb=c["gpu_mem_gb"],
                      precision=prec, micro_batch=c["micro_batch"], checkpointing=ck,
                      strategies=STRATEGIES, **more)
            out.update({(s, prec, ck): sp for s, sp in p.strategies.items()})
    return out


def changed(cfg, change: dict) -> dict:
    """``cfg`` with ``change``'s values; a callable value is computed from ``cfg`` (a budget
    read in other units: {"gpu_mem_gb": lambda c: c["gpu_mem_gb"] * 1e9 / 2**30})."""
    return {**cfg, **{k: v(cfg) if callable(v) else v for k, v in change.items()
                      if k != "_options"}}


def _peak(s) -> float:
    return s.peak_bytes


def _key(choice) -> tuple:
    return choice["strategy"], choice["precision"], choice["checkpointing"]


def _cost(search, key, s) -> tuple:
    return getattr(s, search.cost), key[2], STRATEGIES.index(key[0])
