"""The assessment, task 3: the team's training function, its net and data, and its check:
``train_job(rank, world_size, steps)`` beside the reference on 1-4 ranks, 4 steps, 1 micro-batch
and the job's 3, clipped at ``JOB_MAX_NORM`` and not at all, SGD + momentum and AdamW, compared
on what :mod:`fsdp_mini.debug.watch` sees: the rows fed (all ranks together, whatever the
shuffle), each step's collectives, update and weights, what the function returned.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from functools import partial

import torch
from torch import nn

from ...debug.small_data import one_process
from ...debug.seen import differs_only_where, ratio, watch_into
from ..common.facts import right_only_with
from ..common.checking import relative_difference
from ..common.differential import Check, Hint, near, spread
from ..common.exercise import load_solution, not_written_yet
from ..common.records import size
from ..common.report import CheckResult, verdict_of_check

__all__ = ["JOB_MAX_NORM", "JOB_MICRO_BATCHES", "JOB_ROWS", "JOB_STEPS", "check_job_training",
           "job_batch", "job_net", "job_one_process", "job_sgd"]

JOB_ROWS, JOB_MICRO_BATCHES, JOB_STEPS = 24, 3, 4   # 24 rows: 1-4 ranks, 3 micro-batches each
JOB_MAX_NORM, NONE = 0.5, 100.0   # the job's clipping (some steps), and one that clips none
SGD, CHECK_TIMEOUT = "SGD+momentum", 8   # CHECK_TIMEOUT: seconds a collective may wait
job_sgd = partial(torch.optim.SGD, lr=0.1, momentum=0.9)
OPTIMIZERS = {SGD: job_sgd, "AdamW": partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1)}


def job_net() -> nn.Module:
    """6 → 10 → 10 → 2 (202 parameters), initialised from torch's global RNG."""
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(),
                         nn.Linear(10, 2))


def job_batch(step: int):
    """The step's whole batch: JOB_ROWS rows of 6 inputs, 2 targets (its own generator)."""
    g = torch.Generator().manual_seed(2000 + step)
    return torch.randn(JOB_ROWS, 6, generator=g), torch.randn(JOB_ROWS, 2, generator=g)


def job_one_process(steps: int = JOB_STEPS) -> dict:
    """The answer: one process, seed 0, the whole batch each step, clipped at JOB_MAX_NORM."""
    return one_process(steps, clip=JOB_MAX_NORM, net=job_net, batch=job_batch, optimizer=job_sgd)


def _observe(fn, cfg, record) -> None:
    labs = importlib.import_module("fsdp_mini.labs")   # Note: what the function reads as labs.*
    watch_into(record, fn, cfg["world_size"], JOB_STEPS, lambda step: job_batch(step)[0], [
        (labs, "job_sgd", OPTIMIZERS[cfg["optimizer"]]), (labs, "JOB_MAX_NORM", cfg["max_norm"]),
        (labs, "JOB_MICRO_BATCHES", cfg["micro_batches"])])


def _configs(world_size: int = 2) -> list:
    """3 micro-batches only where they split a rank's rows evenly (on 3 ranks: 3, 3 and 2)."""
    even = [n for n in sorted({1, 2, 4, world_size}) if JOB_ROWS // n % JOB_MICRO_BATCHES == 0]
    return sorted(spread(world_size=[1, 2, 3, 4], micro_batches=[1], max_norm=[NONE],
                         optimizer=[SGD]) + spread(world_size=even, micro_batches=[3],
                  max_norm=[NONE, JOB_MAX_NORM], optimizer=[SGD]) + spread(
        world_size=even, micro_batches=[3], max_norm=[JOB_MAX_NORM], optimizer=["AdamW"]),
        key=size)


def _ratio(d, test) -> float | None:   # yours / the reference's step-1 update, one number
    found = [r for c, m, w in d.pairs("update", step=1, rank=0) if test(c)
             for r in [ratio(m, w)] if r != 1.0]
    return found[0] if found and all(r and near(r, found[0]) for r in found) else None


def _only(d, test) -> bool:   # the updates differ from the reference's exactly where test holds
    return differs_only_where(d, "update", JOB_STEPS, test)


def _on(observables, test=lambda d: True):
    return lambda d: d.observable in observables.split() and test(d)


def _free(c, **at) -> bool:   # SGD, nothing clipped (and ``at``'s values): a scale shows
    return c["max_norm"] == NONE and c["optimizer"] == SGD and all(c[k] == v for k, v in at.items())


def _here(d):
    """``d`` with only the configurations of its own world size: there one mistake shows alone
    where another (seen only on more ranks, such as each rank's own shuffle) is mixed in."""
    n = d.config.get("world_size")
    return dataclasses.replace(d, table={c: v for c, v in d.table.items()
                                         if c.get("world_size") == n})


def _here_too(hint: Hint) -> Hint:
    """``hint``, asked of the divergence's own world size (:func:`_here`)."""
    return Hint(lambda d: hint.when(_here(d)), lambda d: hint.text(_here(d)))


def _passes(d) -> float:
    """Yours / the reference's all-gathers in the step: how many times its passes it made."""
    mine, want = (sum(1 for r in (w or ()) if r[0] == "all_gather") for w in d.whole)
    return mine / want if want and mine % want == 0 else 0


def _hung(d):
    """(world size, where each rank waited) of the first configuration where yours hung."""
    return next(((c["world_size"], mine.error[1]) for c, (mine, _) in d.table.items()
                 if mine.error is not None and mine.error[0] == "a hang"), None)


HANG = ("a collective some ranks never reach (under `if rank == 0`? full_state_dict is one "
        "under fsdp: every rank calls it)")
ADDED, ZERO_GRAD, CLIPS = (
    Hint(_on("update weights", lambda d: _only(d, lambda c: c["micro_batches"] > 1) and near(
        _ratio(d, _free) or 0, JOB_MICRO_BATCHES)), "with 3 micro-batches each update is 3x the "
         "reference's: their losses were added; divide each by labs.JOB_MICRO_BATCHES"),
    Hint(_on("update weights", lambda d: _only(d, lambda c: c["micro_batches"] > 1)), "right with "
         "1 micro-batch, wrong with 3: every micro-batch's gradient must reach the step "
         "(zero_grad() once a step), each loss divided by the number of micro-batches"),
    Hint(_on("update weights", lambda d: _only(d, lambda c: c["max_norm"] != NONE)), "wrong only "
         "where the reference clips: fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM) after "
         "the backward passes, before optimizer.step()"))
HINTS = [
    Hint(lambda d: d.raised and d.raised[0] == "a hang", HANG),
    Hint(lambda d: d.raised and "GradientsChanged" in d.raised[0], "torch's clip_grad_norm_ sees "
         "this rank's shard: fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM), the global norm"),
    Hint(_on("names returned"), "return fsdp_mini.full_state_dict(model): the whole weights"),
    Hint(_on("rows", lambda d: "not of the step's batch" in str(d.mine)), "the ranks were fed "
         "rows that are not of step {step}'s batch: count the steps as the reference does (for "
         "step in range(steps): the first batch is labs.job_batch(0))"),
    Hint(_on("rows", lambda d: right_only_with(d, "world_size", lambda v: v == 2)), "right only "
         "at world size 2: a count of rows written for 2 ranks must follow world_size, or the "
         "ranks overlap and leave rows out: rank r takes its slice order[r·n:(r+1)·n], n = "
         "len(x) // world_size"),
    Hint(_on("ledger", lambda d: _passes(d) > 1 and not _hung(d)), lambda d: f"your step made {_passes(d):g}x "
         "the reference's collectives: as many more forward and backward passes. Cut the "
         "rank's rows into labs.JOB_MICRO_BATCHES micro-batches (torch.tensor_split), not into "
         "pieces of a fixed size"),
    Hint(_on("rows start"), "the ranks' rows overlap and leave rows out: one shuffle on every "
         "rank (one seed, torch.manual_seed(0)), rank r its slice order[r·n:(r+1)·n]"),
    ADDED,
    Hint(_on("update weights", lambda d: _ratio(d, lambda c: _free(c, micro_batches=1)) and
             _only(d, lambda c: True)), lambda d: "each update is {:.3g}x the reference's with 1 "
         "micro-batch, {:.3g}x with 3: divide each micro-batch's loss by labs.JOB_MICRO_BATCHES, "
         "by nothing else".format(*(_ratio(d, lambda c, k=k: _free(c, micro_batches=k)) or 1
                                    for k in (1, 3)))),
    ZERO_GRAD,
    Hint(_on("update weights", lambda d: _only(d, lambda c: c["world_size"] > 1) and all(
        near(_ratio(d, lambda c, n=n: _free(c, world_size=n)) or 0, 1 / n) for n in (2, 4))),
         "1/N of the reference's update where nothing is clipped: the loss divided by the world "
         "size, but fsdp averages the ranks' gradients already"),
    CLIPS,
    # Note: a second mistake seen only on more ranks (the rows) hides the pattern of the first
    *map(_here_too, (ADDED, ZERO_GRAD, CLIPS)),
    # Note: a collective under `if rank == 0` shows first on 1 rank, as one the reference lacks
    Hint(lambda d: not d.raised and _hung(d), lambda d: "at world size {} the ranks hung: {}: "
         .format(*_hung(d)) + HANG),
    Hint(_on("ledger"), "other collectives than the reference's: fsdp's all-gathers and "
         "reduce-scatters, one all_reduce of the norm per clip, on every rank alike"),
]
WORDS = {"start": "rank {rank}'s weights when step 1 began", "rows": "the rows the nets were "
         "fed in step {step}, all ranks together", "update": "what step {step} changed in rank "
         "{rank}'s weights", "names": "what rank {rank} returned", "returned": "what rank {rank} "
         "returned", "ledger": "rank {rank}'s collectives in step {step}", "weights": "rank "
         "{rank}'s weights after step {step}"}
JOB = Check("task 3: the training function", _observe, [], ("start", "rows", "ledger", "update",
            "weights", "names", "returned"), {"start": 1e-6, "update": 1e-4, "weights": 1e-5,
            "returned": 1e-5}, WORDS, HINTS, "trains like the reference: the same rows, "
            "updates and weights, step by step", on_ranks=True, timeout=CHECK_TIMEOUT)


@verdict_of_check
def check_job_training(fn, world_size: int = 2) -> CheckResult:
    """``fn`` beside the reference, ``world_size`` (2 or 4) last; facts: verdict, parity_error."""
    if world_size not in (2, 4):
        raise ValueError(f"world_size must be 2 or 4 (24 rows in 3 micro-batches), got "
                         f"{world_size!r}")
    result = CheckResult(f"task 3: {getattr(fn, '__name__', fn)} on {world_size} ranks")
    if not_written_yet(fn):
        result.facts["verdict"] = "the training function is not written"
        return result.wrong("not written yet", hint="fix the function in the cell above").finish()
    JOB(fn, load_solution("11_fix_training", "train_job"), result, _configs(world_size))
    mine = next((m for c, (m, _) in result.facts["records"].items() if c["world_size"] ==
                 world_size and c["max_norm"] == JOB_MAX_NORM and c["optimizer"] == SGD), None)
    got = mine.get("returned", step=JOB_STEPS) if mine else None
    result.facts["parity_error"] = relative_difference(got, job_one_process()) if got else math.inf
    result.facts["verdict"] = next((m for ok, m, _ in result.lines if not ok), None) or (
        f"{world_size} ranks train like one process (relative difference "
        f"{result.facts['parity_error']:.1e})")
    return result.finish()


# What tests/wrong_answers/ judges many answers with: the task's check, one batch
JUDGES = {"11_fix_training": lambda answers: JOB.judge_many(
    answers, load_solution("11_fix_training", "train_job"), _configs())}
