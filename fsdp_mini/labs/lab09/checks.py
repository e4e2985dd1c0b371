"""Lab 09's checks: your ``train(rank, world_size, steps)`` beside the reference on 1-4 ranks, 4
steps, ``labs.debug_sgd`` SGD + momentum and AdamW (exercise 3 also clipping every step, and none),
compared on what :mod:`fsdp_mini.debug.watch` sees: the rows fed, each step's collectives,
update and weights, each |w| rank 0 printed, what was returned; a hang names where ranks waited.
"""

from __future__ import annotations

import importlib
import math
import re
from collections import Counter
from functools import partial

import torch

from ...debug.small_data import debug_batch, debug_net, debug_sgd, one_process  # noqa: F401
from ...debug.seen import differs_only_where, ratio, scale, watch_into
from ..common.checking import rank_lines, relative_difference, unwritten  # noqa: F401
from ..common.hints import ranks_differ
from ..common.differential import Check, Hint, spread
from ..common.exercise import load_solution
from ..common.records import size
from ..common.report import CheckResult, verdict_of_check

__all__ = ["DEBUG_STEPS", "MAX_NORM", "check_clipping", "check_no_hang", "check_parity",
           "check_seeds_and_data", "debug_batch", "debug_net", "debug_sgd", "one_process",
           "rank_lines", "relative_difference"]

DEBUG_STEPS, MAX_NORM = 4, 0.6  # steps a check trains; exercise 3's max_norm clips some steps
EVERY, NONE = 0.05, 100.0       # the clipping check's other max_norms: every step clipped, none
SGD, CHECK_TIMEOUT = "SGD+momentum", 8   # CHECK_TIMEOUT: seconds a collective may wait
OPTIMIZERS = {SGD: debug_sgd, "AdamW": partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1)}
_LOGGED = re.compile(r"\|w\|\s*[=:]?\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def _observe(fn, cfg, record) -> None:
    labs = importlib.import_module("fsdp_mini.labs")   # Note: what the function reads as labs.*
    parity = bool(cfg.get("_parity"))   # Note: parity holds for any strategy, logging or not
    seen = watch_into(record, fn, cfg["world_size"], DEBUG_STEPS, lambda s: debug_batch(s)[0],
                      [(labs, "debug_sgd", OPTIMIZERS[cfg["optimizer"]]),
                       (labs, "MAX_NORM", cfg.get("max_norm", MAX_NORM))], ("ledger",) * parity)
    for k, norm in enumerate(_LOGGED.findall(seen.printed) if seen and not parity else (), 1):
        record.see("logged", float(norm), step=k)


def _configs(world_size=2, clipping=False, **more) -> list:
    sizes = sorted({1, 2, 3, 4, world_size})
    if not clipping:
        return spread(world_size=sizes, optimizer=[SGD, "AdamW"], **more)
    return sorted(spread(world_size=sizes, max_norm=[EVERY, MAX_NORM, NONE], optimizer=[SGD]) +
                  spread(world_size=sizes, max_norm=[MAX_NORM], optimizer=["AdamW"]), key=size)


def _scale(d, test) -> str:   # "N times", "1/N of", "0.5x": step 1's update where test holds
    return scale([(c["world_size"], ratio(m, w)) for c, m, w in d.pairs("update", step=1, rank=0)
                  if test(c)])


def _scale_hint(d) -> str:
    free = _scale(d, lambda c: c["optimizer"] == SGD and c.get("max_norm", NONE) == NONE)
    parts = [f"where nothing is clipped each update is {free} the reference's" + {
        "N times": ": the sum of the ranks' gradients was not divided by world_size",
        "1/N of": ": the loss was divided by N, but the ranks' gradients are averaged already"}.get(
        free, f": the sum over ranks divided by {free[2:-6]} whatever the world size (a number "
        "written for one world size?): divide by world_size" if free.startswith("N/") else
        f": {free[:-8]}/N is how many values each rank's loss covers (its rows x outputs), so the "
        "loss was summed over them, not averaged (the mean, mse_loss's default reduction)" if free.endswith(
            "/N times") else ": a constant scale of the loss or the gradient")] if free else []
    if _scale(d, lambda c: c.get("max_norm") == EVERY) == "1/N of":
        parts.append("where every step is clipped each update is 1/N of the reference's: clipped "
                     "N times too hard (max_norm / N?), but fsdp_mini.clip_grad_norm_'s norm is "
                     "over every rank's shard already")
    return "; ".join(parts) + " (SGD shows a wrong scale; AdamW divides it away)" * bool(parts)


def _only(d, test) -> bool:   # the updates differ from the reference's exactly where test holds
    return differs_only_where(d, "update", DEBUG_STEPS, test)


def _one_size(d) -> int | None:   # the one world size > 1 where the answer agrees, if any
    right = {c["world_size"] for c in d.agree} or {0}
    return min(right) if len(right) == 1 and min(right) > 1 and d.differ else None


def _moved(d) -> bool:   # rank 0's collectives of the whole run are the reference's
    every = [Counter(c for k, v in r.seen.items() if k[0] == "ledger" and ("rank", 0) in k[1]
                     for c in v) for r in d.table[d.config]]
    return every[0] == every[1]


def _clipped_otherwise(d) -> float | None:
    """Yours / the reference's step-1 update where every step is clipped, if yours was clipped
    (it differs from your own unclipped update) but by another amount; else None."""
    rows = {(c["world_size"], c["optimizer"], c.get("max_norm")): (m, w) for c, m, w in
            d.pairs("update", step=1, rank=0)}
    for (n, opt, norm), (m, w) in rows.items():
        free = rows.get((n, opt, NONE), (None, None))[0]
        if norm == EVERY and opt == SGD and free is not None and ratio(m, free) != 1.0:
            r = ratio(m, w)
            return r if r is not None and r != 1.0 else None
    return None


def _printers(d) -> str:   # the ranks other than 0 that printed |w| in your run
    return ", ".join(map(str, sorted({dict(k[1])["rank"] for k in d.table[d.config][0].seen if
                                      k[0] == "logged" and dict(k[1])["rank"] != 0})))


def _raised(*words):
    return lambda d: bool(d.raised) and any(w in f"{d.raised[0]} {d.raised[1]}" for w in words)


def _is(observable, test=lambda d: True):
    return lambda d: d.observable in observable.split() and test(d)


ROWS = "rank r takes rows [r·n, (r+1)·n), n = len(x) // world_size (a shuffle: one seed for all)"
HINTS = [
    Hint(_raised("a hang"), "a collective some ranks never reach (under `if rank == 0`? "
         "full_state_dict is one: every rank calls it, rank 0 prints) or another number of steps"),
    Hint(_raised("GradientsChanged"), "torch's clip_grad_norm_ sees this rank's shard only: "
         "fsdp_mini.clip_grad_norm_(model, max_norm) takes the norm over every rank's shard"),
    Hint(_raised("Mismatch", "SIGABRT", "size", "gloo"), "every rank must issue the same "
         "collectives in the same order: one a rank skips pairs with the wrong one"),
    Hint(_is("names returned"), lambda d: "return fsdp_mini.full_state_dict(model) after the "
         "last step" + ": model.state_dict() is a rank's 1-D shard" * ("shape" in d.how_much)),
    Hint(_is("start"), "the ranks must start from the same weights: one seed on every rank "
         "(torch.manual_seed(0)) before labs.debug_net(); a hand-written loop broadcasts nothing"),
    Hint(_is("rows update weights", _one_size), lambda d: f"right only at world size "
         f"{_one_size(d)}: a count fixed for {_one_size(d)} ranks must follow world_size: {ROWS}"),
    Hint(_is("rows", lambda d: "not of the step's batch" in str(d.mine)), "the ranks were "
         "fed rows that are not of step {step}'s batch: count the steps as the reference does "
         "(for step in range(steps): the first batch is labs.debug_batch(0))"),
    Hint(_is("rows", lambda d: "once" not in d.mine and "never" in d.mine), "every rank was "
         f"fed the same rows, the others none: {ROWS}"),
    Hint(_is("rows"), lambda d: f"the ranks' rows together are not the batch once: {ROWS}; "
         "disjoint, together all of them (a slice end off by one?)"),
    Hint(_is("update", lambda d: ranks_differ(d, "update")), "after optimizer.step() the ranks' "
         "weights differ: average the gradients before the step (not the weights after it)"),
    Hint(_is("update weights", _scale_hint), _scale_hint),
    Hint(_is("update weights", lambda d: _clipped_otherwise(d)), lambda d: "you clip, but "
         f"by another amount: where every step is clipped your update is "
         f"{_clipped_otherwise(d):.3g}x the reference's. Clip by the 2-norm of all the "
         "gradients of every rank together: fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM) "
         "(norm_type 2), once a step, between backward() and step()"),
    Hint(_is("update weights", lambda d: _only(d, lambda c: c.get("max_norm") in (
        EVERY, MAX_NORM))), "right where nothing is clipped, wrong where the reference clips: "
         "fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM) between backward() and step()"),
    Hint(_is("ledger", _moved), "the reference's collectives, in another step: one made before "
         "optimizer.step() that the reference makes after it (the gather to log?), or after"),
    Hint(_is("ledger"), "an all_gather is a forward, backward or full_state_dict (the gather to "
         "log?), an all_reduce of 4 B the clipping's norm: one missing is a step not taken"),
    Hint(_is("logged", lambda d: d.mine is None and _printers(d)), lambda d: f"rank(s) "
         f"{_printers(d)} printed |w| and rank 0 did not: only rank 0 prints (under `if rank == "
         "0`), after every rank has gathered"),
    Hint(_is("logged", lambda d: d.mine is None), "rank 0 prints |w| every step: keep the log"),
    Hint(_is("logged", lambda d: d.want is None), "every rank gathers (full_state_dict is a "
         "collective), only rank 0 prints"),
    Hint(_is("logged", lambda d: (d.ratio or 1) < 1), "rank 0 printed the norm of its shard "
         "(on 3 ranks not all of '0.weight'): fsdp_mini.full_state_dict(model) on every rank"),
]
WORDS = {"start": "rank {rank}'s weights when step 1 began", "rows": "the rows the nets were "
         "fed in step {step}, all ranks together", "ledger": "rank {rank}'s collectives in step "
         "{step}", "update": "what step {step} changed in rank {rank}'s weights", "weights":
         "rank {rank}'s weights after step {step}", "logged": "the |w| rank {rank} printed in "
         "line {step}", "names": "what rank {rank} returned", "returned": "what rank {rank} "
         "returned"}
ORDER = ("start", "rows", "ledger", "update", "weights", "logged", "names", "returned")
TOLERANCE = {"start": 1e-6, "update": 1e-4, "weights": 1e-5, "logged": 1e-3, "returned": 1e-5}
CHECKS = {name: Check(what, _observe, [], ORDER, TOLERANCE, WORDS, HINTS, agreed + "; the same "
                      "rows, updates and weights as the reference, step by step", on_ranks=True,
                      timeout=CHECK_TIMEOUT) for name, what, agreed in (
    ("parity", "parity", "every rank trains like the reference"),
    ("09_seeds_and_data", "exercise 1: seeds and data", "one start, each rank its own rows"),
    ("09_hang", "exercise 2: the hang", "no hang; rank 0 alone prints |w| every step"),
    ("09_clipping", "exercise 3: loss and clipping", "clipped by the global norm"))}
FUNCTIONS = {"09_seeds_and_data": "train_1", "09_hang": "train_2", "09_clipping": "train_3"}


def _run(name, fn, configs, result=None, reference=None) -> CheckResult:
    result = result or CheckResult(CHECKS[name].what)
    if unwritten(fn):
        return result.wrong("not written yet", hint="write the function's body, run the cell, "
                            "then this check").finish()
    reference = reference or load_solution(name, FUNCTIONS[name])
    return CHECKS[name](fn, reference, result, configs).finish()


@verdict_of_check
def check_parity(fn, world_size: int = 2, clip=None) -> CheckResult:
    """``fn`` beside fsdp clipped at ``clip``, 1-4 ranks and ``world_size``, any strategy; facts:
    parity_error, how far its weights at ``world_size`` are from :func:`one_process`'s."""
    if isinstance(world_size, bool) or world_size not in (1, 2, 3, 4, 6, 12):
        raise ValueError(f"world_size must split the debug batch's 12 rows evenly (1, 2, 3, 4, "
                         f"6 or 12), got {world_size!r}")
    result = CheckResult(f"parity of {getattr(fn, '__name__', fn)} on {world_size} ranks")
    clipped = {} if clip is None else {"max_norm": [clip]}
    _run("parity", fn, _configs(world_size, _parity=[True], **clipped), result, load_solution(
        *(("09_clipping", "train_3") if clip is not None else ("09_hang", "train_2"))))
    mine = next((m for c, (m, _) in result.facts.get("records", {}).items()
                 if c["world_size"] == world_size and c["optimizer"] == SGD), None)
    got = mine.get("returned", step=DEBUG_STEPS) if mine else None
    result.facts["parity_error"] = relative_difference(got, one_process(clip=clip)) if \
        isinstance(got, dict) else math.inf
    return result


@verdict_of_check
def check_seeds_and_data(fn) -> CheckResult:   # exercise 1: one start, each rank its own rows
    return _run("09_seeds_and_data", fn, _configs())


@verdict_of_check
def check_no_hang(fn) -> CheckResult:   # exercise 2: no hang, rank 0 alone logs the whole |w|
    return _run("09_hang", fn, _configs())


@verdict_of_check
def check_clipping(fn) -> CheckResult:   # exercise 3: the loss not / N, clipped by the global norm
    return _run("09_clipping", fn, _configs(clipping=True))


# What tests/wrong_answers/ judges many answers with: each exercise's check, one batch
JUDGES = {name: partial(lambda answers, name: CHECKS[name].judge_many(
    answers, load_solution(name, FUNCTIONS[name]), _configs(clipping=name == "09_clipping")),
    name=name) for name in FUNCTIONS}
