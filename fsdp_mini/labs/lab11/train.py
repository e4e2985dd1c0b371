"""The assessment, task 3: the team's training function, fixed so that it trains like one
process. Its net and data, the one-process answer, and a checker that runs the function on a
few ranks with short timeouts and names what is still wrong::

    def train_job(rank, world_size, steps):       # the shape of the function
        ...                                       # shuffle, 3 micro-batches, clip, step
        return fsdp_mini.full_state_dict(model)

    labs.check_job_training(train_job)            # ✔ trains like one process on the whole batch

The answer: one process, seed 0, ``job_net()``, ``job_sgd``; each step the whole batch of 24
rows, the mean squared error, its gradient clipped by the global norm at ``JOB_MAX_NORM``. When
the ranks' weights differ from it, the checker replays usual mistakes in one process, N ranks
simulated exactly (each rank's shuffle, rows and micro-batches), and names the set of mistakes
whose replay gives your ranks' weights.
"""

from __future__ import annotations

import itertools
from functools import partial

import torch
from torch import nn

from ...launcher import LaunchError, LaunchTimeoutError, launch
from ..common.checking import rank_lines, relative_difference
from ..common.exercise import not_written_yet
from ..common.report import CheckResult, verdict_of_check

__all__ = ["JOB_MAX_NORM", "JOB_MICRO_BATCHES", "JOB_ROWS", "JOB_STEPS", "check_job_training",
           "job_batch", "job_net", "job_one_process", "job_replay", "job_sgd"]

JOB_ROWS = 24          # rows a step: 2 ranks x 3 micro-batches of 4, or 4 ranks x 3 of 2
JOB_MICRO_BATCHES = 3
JOB_STEPS = 4
JOB_MAX_NORM = 0.5     # some steps' gradients are clipped, others not: clipping matters
TOL = 1e-5             # norm-relative difference allowed from one-process training
CHECK_TIMEOUT = 10     # seconds a collective may wait in the check (a hang costs about twice)
CHECK_DEADLINE = 60    # seconds the check's whole launch may take
job_sgd = partial(torch.optim.SGD, lr=0.1, momentum=0.9)


def job_net() -> nn.Module:
    """6 → 10 → 10 → 2, initialised from torch's global RNG (so the seed decides its weights).

    >>> sum(p.numel() for p in job_net().parameters())
    202
    """
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(),
                         nn.Linear(10, 2))


def job_batch(step: int):
    """The step's whole batch: ``JOB_ROWS`` rows of 6 inputs and 2 targets, the same on every
    rank and every run (its own generator, not torch's global one)."""
    g = torch.Generator().manual_seed(2000 + step)
    return torch.randn(JOB_ROWS, 6, generator=g), torch.randn(JOB_ROWS, 2, generator=g)


def job_one_process(steps: int = JOB_STEPS) -> dict:
    """The answer: one process, the whole batch of each step, clipped at ``JOB_MAX_NORM``."""
    return job_replay(1, steps)


# mistake: (its knob in job_replay, what to say, the hint)
MISTAKES = {
    "seed per rank": (
        {"seeds": "rank"},
        ("each rank shuffled the batch with its own seed: the ranks' rows overlap and some rows "
         "are never seen (parallelize broadcast rank 0's weights, so only the shuffle differed)"),
        ("seed every rank the same (torch.manual_seed(0)): the order must be the same on every "
         "rank; the rank only picks its slice of it")),
    "same rows": (
        {"rows": "first"}, "every rank trained on the same rows (the first slice of the order)",
        "rank r takes order[r·n:(r+1)·n], n = rows // world_size"),
    "micro-batches added": (
        {"micro": "sum"},
        (f"the {JOB_MICRO_BATCHES} micro-batches' losses were added, not averaged: the gradient "
         f"is {JOB_MICRO_BATCHES} times too large"),
        f"divide each micro-batch's loss by the number of micro-batches ({JOB_MICRO_BATCHES})"),
    "zero_grad in the micro-batch loop": (
        {"keep": "last"},
        ("only the last micro-batch's gradient reached the step: zero_grad() inside the "
         "micro-batch loop threw the others away"),
        "zero_grad() once per step, after optimizer.step(), not between micro-batches"),
    "loss / N": (
        {"loss_scale": "1/N"},
        "the loss was divided by the world size: the ranks' gradients are averaged already",
        "backward() the mean loss of your rows (over the micro-batches); fsdp averages the ranks"),
    "no clipping": (
        {"clip": None}, "the gradients were not clipped",
        "fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM) after the backward passes"),
}


def job_replay(world_size: int, steps: int = JOB_STEPS, seeds: str = "same", rows: str = "own",
               micro: str = "mean", keep: str = "all", loss_scale: str | float = 1.0,
               clip: float | None = JOB_MAX_NORM) -> dict:
    """``world_size`` ranks simulated in this process, exactly as the broken function (and its
    fixes) would train: every rank's shuffle (``seeds`` "same", or "rank": seeded by the rank),
    its ``rows`` ("own" slice or "first" slice), its micro-batches (``micro`` "mean" or "sum";
    ``keep`` "all" or only the "last" one's gradient), the loss times ``loss_scale`` ("1/N" or a
    number), the gradients averaged over the ranks, clipped at ``clip``. Example:
    ``job_replay(2, seeds="rank")`` is what two ranks seeded by their rank train to."""
    scale = 1 / world_size if loss_scale == "1/N" else float(loss_scale)
    orders = _orders(world_size, steps, seeds)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)      # Note: rank 0's weights, which parallelize broadcasts
        model = job_net()
    optimizer = job_sgd(model.parameters())
    params, n = list(model.parameters()), JOB_ROWS // world_size
    for step in range(steps):
        x, y = job_batch(step)
        total = [torch.zeros_like(p) for p in params]
        for r in range(world_size):
            order = orders[r][step]
            mine = order[:n] if rows == "first" else order[r * n:(r + 1) * n]
            micro_batches = list(zip(x[mine].chunk(JOB_MICRO_BATCHES),
                                     y[mine].chunk(JOB_MICRO_BATCHES)))
            for xm, ym in micro_batches[-1:] if keep == "last" else micro_batches:
                loss = nn.functional.mse_loss(model(xm), ym) * scale
                if micro == "mean":
                    loss = loss / JOB_MICRO_BATCHES
                for t, g in zip(total, torch.autograd.grad(loss, params)):
                    t += g
        for p, t in zip(params, total):
            p.grad = t / world_size
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _orders(world_size: int, steps: int, seeds: str) -> list[list[torch.Tensor]]:
    """Each rank's shuffle of each step, drawn as the rank draws it: its seed (0, or its rank
    with ``seeds="rank"``), the net's initialisation, then one permutation a step."""
    orders = []
    with torch.random.fork_rng(devices=[]):
        for r in range(world_size):
            torch.manual_seed(r if seeds == "rank" else 0)
            job_net()
            orders.append([torch.randperm(JOB_ROWS) for _ in range(steps)])
    return orders


def _run(rank, world_size, fn, steps):
    torch.set_num_threads(1)
    return {k: v.detach().cpu().clone() for k, v in _weights(fn(rank, world_size, steps)).items()}


def _weights(state) -> dict:
    if not isinstance(state, dict):
        raise TypeError(f"your function must return the weights (fsdp_mini.full_state_dict("
                        f"model)), a dict of tensors; it returned {type(state).__name__}")
    return state


def _launch(result: CheckResult, fn, world_size: int):
    """The function on the ranks, with short timeouts; a failure becomes one ✘ line."""
    try:
        return launch(_run, world_size, fn, JOB_STEPS, backend="gloo", timeout=CHECK_TIMEOUT,
                      deadline=CHECK_DEADLINE)
    except LaunchTimeoutError as e:
        where = "; ".join(f"rank {r} at {at}" for r, at in rank_lines(e).items())
        result.wrong(f"the ranks did not finish: {str(e).splitlines()[0][:200]}"
                     + (f". Where they waited: {where}" if where else ""),
                     hint="a collective that not every rank calls (under `if rank == 0`?)")
    except LaunchError as e:
        kind = str(e.exc_type).rsplit(".", 1)[-1]
        where = "; ".join(f"rank {r} at {at}" for r, at in rank_lines(e).items())
        first = " ".join(str(e.message or "").split()).split(". ")[0][:300]
        hint = ("torch.nn.utils.clip_grad_norm_ sees only this rank's gradient shards: clip with "
                "fsdp_mini.clip_grad_norm_(model, max_norm), the norm over every rank's shard"
                if kind == "GradientsChangedError" else "the line named above raised")
        result.wrong(f"rank {e.rank} raised {kind}: {first}"
                     + (f". Where the ranks were: {where}" if where else ""), hint=hint)
        if kind == "GradientsChangedError":
            result.facts["verdict"] = "torch's clip_grad_norm_ on sharded gradients"
    return None


def _name_mistakes(result: CheckResult, got: dict, world_size: int, error: float) -> None:
    """Name the smallest set of known mistakes whose replay gives exactly ``got``."""
    names = list(MISTAKES)
    for size in range(1, len(names) + 1):
        for combo in itertools.combinations(names, size):
            knobs = {k: v for name in combo for k, v in MISTAKES[name][0].items()}
            if relative_difference(got, job_replay(world_size, **knobs)) <= TOL:
                said = "; and ".join(MISTAKES[name][1] for name in combo)
                hints = "; ".join(MISTAKES[name][2] for name in combo)
                result.wrong(f"the weights differ from one-process training by {error:.2g} "
                             f"(relative): {said}", hint=hints)
                result.facts["verdict"] = said
                return
    result.wrong(f"the weights differ from one-process training by {error:.2g} (relative)",
                 hint="shuffle the same way on every rank, take this rank's slice, average the "
                      "micro-batches, clip by the global norm")
    result.facts["verdict"] = "the ranks do not train like one process"


@verdict_of_check
def check_job_training(fn, world_size: int = 2) -> CheckResult:
    """Does ``fn(rank, world_size, steps)`` on ``world_size`` ranks (2 or 4) train like one
    process? ✔/✘: it finishes, the ranks agree, and parity; a mistake is named."""
    if world_size not in (2, 4):
        raise ValueError(f"world_size must be 2 or 4 (24 rows in 3 micro-batches per rank), "
                         f"got {world_size!r}")
    result = CheckResult(f"task 3: {getattr(fn, '__name__', fn)} on {world_size} ranks")
    if not_written_yet(fn):
        result.facts["verdict"] = "the training function is not written"
        return result.wrong("not written yet", hint="fix the function in the cell above").finish()
    runs = _launch(result, fn, world_size)
    if runs is None:
        result.facts.setdefault("verdict", "the training function does not run on the ranks")
        return result.finish()
    return _judge(result, runs).finish()


def _judge(result: CheckResult, runs: list[dict]) -> CheckResult:
    """✔/✘ lines from each rank's weights after ``JOB_STEPS`` steps (by rank)."""
    world_size, want = len(runs), job_one_process()
    if set(runs[0]) != set(want):
        result.facts["verdict"] = "the function returned other weights than the net's"
        return result.wrong(f"your function returned weights named {sorted(runs[0])}, but the "
                            f"net's are {sorted(want)}", hint="return fsdp_mini.full_state_dict("
                            "model) of the net labs.job_net() built")
    apart = max(relative_difference(r, runs[0]) for r in runs[1:])
    if not result.check(apart == 0, f"the {world_size} ranks hold the same weights after "
                        f"{JOB_STEPS} steps", f"the ranks hold different weights after "
                        f"{JOB_STEPS} steps (up to {apart:.2g} apart)",
                        hint="every rank must apply the same averaged gradient"):
        result.facts["verdict"] = "the ranks end with different weights"
        return result
    error = relative_difference(runs[0], want)
    if error <= TOL:
        result.ok(f"{world_size} ranks train like one process on the whole batch ({JOB_STEPS} "
                  f"steps; largest relative difference {error:.1e})")
        result.facts.update(parity_error=error, verdict=f"{world_size} ranks train like one "
                            f"process (relative difference {error:.1e})")
    else:
        _name_mistakes(result, runs[0], world_size, error)
    return result
