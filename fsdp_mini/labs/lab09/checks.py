"""Lab 09: debugging distributed training. A small net and its data, one process's answer to
compare with, and checkers that run a training function on 2 ranks with short timeouts and say
in plain words what is still wrong::

    def train(rank, world_size, steps):            # the shape every function of the lab has
        torch.manual_seed(0)
        model = labs.debug_net()                   # 4 → 7 → 3, initialised from torch's RNG
        model, opt = fsdp_mini.parallelize(model, "fsdp", optimizer=labs.debug_sgd)
        for step in range(steps):
            x, y = labs.debug_batch(step, rank, world_size)   # this rank's rows of 12
            nn.functional.mse_loss(model(x), y).backward()
            opt.step(); opt.zero_grad()
        return fsdp_mini.full_state_dict(model)    # the whole weights, on every rank

    labs.check_parity(train)    # ✔ 2 ranks train like one process on the whole batch

A checker calls ``train(rank, 2, 0)`` (the weights before training) and ``train(rank, 2, 3)``
in one launch (exercise 2's on 3 ranks, where rank 0's shard of '0.weight' is not the whole of
it, and it reads the |w| rank 0 printed), then compares: ranks with one another, and rank 0 with
one process trained on the whole batch. When they differ it tries the usual mistakes, each
replayed in one process (the same rows on every rank, a loss divided by N, no clipping, max_norm
/ N...), and names the one that gives exactly the weights your ranks got; failing that, the rows
each rank's net was fed (recorded through ``labs.debug_net()``) say whether the ranks' rows were
the step's batch, once.
"""

from __future__ import annotations

import re

import torch

from ...launcher import LaunchError, LaunchTimeoutError, launch
from ..common.checking import rank_lines, relative_difference, unwritten, user_line
from ..common.report import CheckResult
from .runs import DEBUG_STEPS, debug_batch, debug_net, debug_sgd, one_process, run_on_ranks

__all__ = [
    "DEBUG_STEPS",
    "MAX_NORM",
    "check_clipping",
    "check_no_hang",
    "check_parity",
    "check_seeds_and_data",
    "debug_batch",
    "debug_net",
    "debug_sgd",
    "my_line",
    "one_process",
    "rank_lines",
    "relative_difference",
]

MAX_NORM = 0.6        # the clipping of exercise 3: step 1's gradient norm is 0.79, step 2's 0.56
CHECK_TIMEOUT = 10    # seconds a collective may wait in a checker (a hang costs about twice)
CHECK_DEADLINE = 60   # seconds a checker's whole launch may take
TOL = 1e-5            # norm-relative difference allowed from one-process training
def my_line(err: LaunchError) -> str:
    """The last line of your own code in a failed rank's traceback, as words to follow "at":
    ``"`loss.backward()` in train"``; "" when none is known."""
    return user_line(err.traceback)


def _places(err: LaunchError, lead: str) -> str:
    """``lead`` + "rank 0 at `line` in f; rank 1 at ...", from the logs (then removed); ""."""
    lines = rank_lines(err)
    return lead + "; ".join(f"rank {r} at {at}" for r, at in lines.items()) if lines else ""


def _first_sentence(text: str, limit: int = 300) -> str:
    """The first sentence of a long message, cut at a word (never mid-word) if still too long."""
    text = " ".join(str(text or "").split())
    first = text.split(". ")[0].rstrip(".")
    return first if len(first) <= limit else first[:limit].rsplit(" ", 1)[0] + " …"


def _launch(result: CheckResult, fn, world_size: int):
    """Run ``fn`` on the ranks with short timeouts; a failure becomes one ✘ line."""
    try:
        runs = launch(run_on_ranks, world_size, [fn], DEBUG_STEPS, backend="gloo",
                      timeout=CHECK_TIMEOUT, deadline=CHECK_DEADLINE)
        return [r[0] for r in runs]
    except LaunchTimeoutError as e:
        result.wrong(_first_sentence(str(e).splitlines()[0]) + _places(e, ". Where they waited: "),
                     hint="one rank waits in a collective another rank never issues. Look for a "
                          "collective under `if rank == 0` (full_state_dict and summon_full_params "
                          "are collectives under fsdp), or ranks running different numbers of "
                          "steps. parallelize(..., check_collectives=True) names both sides")
    except LaunchError as e:
        kind = str(e.exc_type).rsplit(".", 1)[-1]
        at = my_line(e)
        places = _places(e, ". Where the ranks were: ")  # Note: the rank that raised first is
        # not always the one with the bug: for a mismatch, every rank's line says more
        hint = {"CollectiveMismatchError": "a collective that only some ranks call: every rank "
                                           "must call it, in the same order (log from rank 0, "
                                           "but gather on every rank)",
                "GradientsChangedError": "clip with fsdp_mini.clip_grad_norm_(model, max_norm): "
                                         "it computes the norm over every rank's shard",
                "SIGABRT": "gloo aborts a rank when the ranks' collectives do not match (a "
                           "collective one rank skipped, or sent in another order: sizes that "
                           "differ): every rank must issue the same collectives in the same "
                           "order; compare the lines where the ranks were"}.get(kind, "")
        result.wrong(f"rank {e.rank} raised {kind}: {_first_sentence(e.message)}"
                     + (places or (f" (at {at})" if at else "")), hint=hint)
    return None


def _ranks_agree(result: CheckResult, states: list[dict], when: str, hint: str) -> bool:
    for r, other in enumerate(states[1:], start=1):
        for k, v in other.items():
            if k in states[0] and v.shape != states[0][k].shape:
                result.wrong(f"{when}, rank {r}'s {k!r} has shape {tuple(v.shape)}, rank 0's "
                             f"{tuple(states[0][k].shape)}: the ranks returned their shards, not "
                             f"the whole weights (under fsdp, model.state_dict() is this rank's "
                             f"shard)", hint="return fsdp_mini.full_state_dict(model): every "
                             "rank calls it, every rank gets the whole weights")
                return False
        diff = {k: (v - states[0][k]).abs().max().item() for k, v in other.items()}
        name = max(diff, key=diff.get)
        if diff[name] > 0:
            result.wrong(f"{when}, rank {r}'s {name!r} differs from rank 0's by up to "
                         f"{diff[name]:.3g}: the ranks hold different models", hint=hint)
            return False
    return True


MISTAKES = [  # (what the mistake replays, what to say), tried in order when parity fails
    ({"rows": "first"}, ("every rank trained on the same rows (rank 0's) at every step: the "
                        "other ranks' rows were never seen"),
     "rank r takes rows [r·n, (r+1)·n) of the step's batch: debug_batch(step, rank, world_size)"),
    ({"scale": "1/N"}, ("the gradients are N times too small: the loss was divided by the world "
                       "size, but the ranks' gradients are averaged already"),
     "backward() the plain mean loss of your rows; the averaging over ranks does the rest"),
    ({"scale": "N"}, ("the gradients are N times too large: the sum over ranks was not divided by "
                     "the world size"), "divide the all-reduced gradient by world_size"),
    ({"clip": None}, "the gradients were not clipped", (f"clip by the global norm: "
                                                       f"fsdp_mini.clip_grad_norm_(model, {MAX_NORM}), "
                                                       f"between backward() and optimizer.step()")),
    ({"scale": "1/N", "clip": None}, ("not clipped, and the gradients are N times too small (a "
                                     "loss divided by the world size)"),
     "the plain mean loss, and fsdp_mini.clip_grad_norm_(model, max_norm)"),
    ({"clip": "/N"}, ("clipped at max_norm / N: the norm fsdp_mini.clip_grad_norm_ computes is "
                     "global already (over every rank's shard), so dividing max_norm by the "
                     "world size clips N times too hard"),
     f"fsdp_mini.clip_grad_norm_(model, {MAX_NORM}): the same max_norm as one process"),
    ({"scale": "1/N", "clip": "/N"}, ("clipped at max_norm / N, and the loss divided by N: the "
                                     "norm is global already and the gradients are averaged "
                                     "already; neither needs a /N"),
     f"the plain mean loss, and fsdp_mini.clip_grad_norm_(model, {MAX_NORM})"),
]


def _judge_parity(result: CheckResult, got: dict, world_size: int, clip, rows=None) -> None:
    want = one_process(clip=clip)
    error = relative_difference(got, want)
    if error <= TOL:
        result.ok(f"{world_size} ranks train like one process on the whole batch ({DEBUG_STEPS} "
                  f"steps; largest relative difference {error:.1e})")
        result.facts["parity_error"] = error
        return
    for change, said, hint in MISTAKES:
        if "clip" in change and clip is None:
            continue
        scale = {"1/N": 1 / world_size, "N": world_size}.get(change.get("scale"), 1.0)
        clipped = change.get("clip", clip)
        clipped = clip / world_size if clipped == "/N" else clipped
        if world_size == 1 and "clip" in change and clipped == clip:
            continue  # Note: on one rank max_norm / N is max_norm: nothing to tell apart
        replay = one_process(world_size=world_size, rows=change.get("rows", "own"), scale=scale,
                             clip=clipped)
        if relative_difference(got, replay) <= TOL:
            said = said.replace("N times", f"{world_size} times (N = {world_size})")
            result.wrong(f"the weights differ from one-process training by {error:.2g} "
                         f"(relative): {said}", hint=hint)
            return
    if rows and (wrong := _wrong_rows(rows, world_size)):
        result.wrong(f"the weights differ from one-process training by {error:.2g} (relative): "
                     f"{wrong}", hint="split the step's 12 rows: rank r takes rows [r·n, (r+1)·n), "
                     "disjoint, together the whole batch once (debug_batch(step, rank, "
                     "world_size)); anything random about the rows takes one seed on every rank")
        return
    result.wrong(f"the weights differ from one-process training by {error:.2g} (relative)",
                 hint="train on this rank's rows, average the gradients once, step the same "
                      "optimizer on every rank")


def _wrong_rows(rows: list, world_size: int) -> str:
    """What is wrong with the rows the ranks' nets were fed (``rows[rank][step]``), or ""."""
    total = len(debug_batch(0)[0])
    for step in range(min(len(r) for r in rows)):
        took = [r[step] for r in rows]
        if any(i is None for t in took for i in t):
            return ""  # Note: rows of the learner's own making: nothing to compare
        seen = sorted(i for t in took for i in t)
        if seen == list(range(total)):
            continue
        said = "; ".join(f"rank {r} rows {t}" for r, t in enumerate(took))
        own = [list(range(r * (total // world_size), (r + 1) * (total // world_size)))
               for r in range(world_size)]
        random = not any(t in own for t in took) and any(
            t != list(range(t[0], t[0] + len(t))) for t in took if t)   # not a slice of rows
        if world_size > 1 and all(sorted(t) == sorted(took[0]) for t in took):
            return (f"every rank trained on the same rows at step {step} ({said})"
                    + (": the same random rows on every rank (the same seed draws the same rows)"
                       if random else "")
                    + "; the other rows of the step were never seen")
        missing = sorted(set(range(total)) - set(seen))
        twice = sorted({i for i in seen if seen.count(i) > 1})
        return (f"the ranks' rows at step {step} are not the whole batch once ({said})"
                + (f"; rows {twice} were used more than once (the ranks' rows overlap)" if twice else "")
                + (f"; rows {missing} were never seen" if missing else "")
                + (": each rank drew its own random rows, so they overlap and miss some"
                   if random and (twice or missing) else
                   ": a slice end off by one?" if not random else ""))
    return ""


def _check(what: str, fn, clip=None, world_size: int = 2, logs: bool = False) -> CheckResult:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= 12 \
            or 12 % world_size:
        raise ValueError(f"world_size must split the debug batch's 12 rows evenly (1, 2, 3, 4, "
                         f"6 or 12), got {world_size!r}")
    result = CheckResult(what)
    if unwritten(fn):
        return result.wrong("not written yet", hint="write the function's body, run the cell, "
                                                    "then this check").finish()
    runs = _launch(result, fn, world_size)
    if runs is None:
        return result.finish()
    _judge(result, runs, clip)
    if logs and result.passed:
        _judge_logs(result, runs)
    return result.finish()


def _judge(result: CheckResult, runs: list[dict], clip=None) -> CheckResult:
    """✔/✘ lines from each rank's weights before and after training (``run_on_ranks``', by rank)."""
    world_size = len(runs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        start = debug_net().state_dict()
    before = [r["before"] for r in runs]
    if set(before[0]) != set(start):
        return result.wrong(f"your function returned weights named {sorted(before[0])}, but the "
                            f"net's are {sorted(start)}", hint="return fsdp_mini.full_state_dict("
                            "model) of the model labs.debug_net() built")
    if not _ranks_agree(result, before, "before any step", hint="seed every rank the same "
                        "(torch.manual_seed(0)) before building the model, or let parallelize "
                        "broadcast rank 0's weights"):
        return result
    if relative_difference(before[0], start) > TOL:
        return result.wrong("every rank starts from the same weights, but not torch.manual_seed(0)'s",
                            hint="seed 0, then labs.debug_net()")
    result.ok("every rank starts from the same weights (seed 0)")
    if _ranks_agree(result, [r["after"] for r in runs], f"after {DEBUG_STEPS} steps",
                    hint="every rank must apply the same averaged gradient"):
        result.ok(f"the {world_size} ranks hold the same weights after {DEBUG_STEPS} steps")
        _judge_parity(result, runs[0]["after"], world_size, clip,
                      rows=[r.get("rows") for r in runs])
    return result


_LOGGED = re.compile(r"step\s*(\d+).*?\|w\|\s*=?\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def _judge_logs(result: CheckResult, runs: list[dict]) -> None:
    """Exercise 2's logging: rank 0 prints |w| (the norm of the whole '0.weight') every step,
    no other rank prints it."""
    others = [r for r, run in enumerate(runs) if r and _LOGGED.search(run["printed"])]
    logged = [(int(a), float(b)) for a, b in _LOGGED.findall(runs[0]["printed"])]
    if others:
        result.wrong(f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} "
                     f"printed |w| too: every rank gathers, but only rank 0 prints",
                     hint="keep `if rank == 0:` around the print (and only the print)")
        return
    if len(logged) < DEBUG_STEPS:
        result.wrong(f"rank 0 printed |w| {len(logged)} times in {DEBUG_STEPS} steps: the fix "
                     f"must keep the logging, not remove it",
                     hint="every rank calls fsdp_mini.full_state_dict(model); rank 0 prints")
        return
    for step, norm in logged[:DEBUG_STEPS]:
        whole = [float(one_process(steps=k)["0.weight"].norm()) for k in (step + 1, step)]
        if not any(abs(norm - w) <= 1e-3 * max(1.0, w) for w in whole):
            result.wrong(f"rank 0 printed |w| {norm:.4f} at step {step}, but the whole "
                         f"'0.weight' has norm {whole[0]:.4f} on {len(runs)} ranks: what rank 0 "
                         f"logged is its shard, not the whole weight (under fsdp, "
                         f"model.state_dict() and the parameters hold this rank's shard)",
                         hint="weights = fsdp_mini.full_state_dict(model) on every rank (a "
                              "collective), then print from rank 0")
            return
    result.ok(f"rank 0 alone logged |w| every step, the norm of the whole '0.weight' "
              f"({logged[-1][1]:.4f} at step {logged[-1][0]})")


def check_parity(fn, world_size: int = 2, clip=None) -> CheckResult:
    """Does ``fn(rank, world_size, steps)`` on ``world_size`` ranks give one process's weights?"""
    return _check(f"parity of {getattr(fn, '__name__', fn)} on {world_size} ranks", fn, clip,
                  world_size)


def check_seeds_and_data(fn) -> CheckResult:
    """Exercise 1: same start on every rank, each rank its own rows, parity."""
    return _check("exercise 1: seeds and data", fn)


HANG_RANKS = 3  # exercise 2 runs on 3 ranks: rank 0's shard of '0.weight' (20 of its 28
#                elements) is not the whole weight there, as it is on 2 ranks (all 28)


def check_no_hang(fn) -> CheckResult:
    """Exercise 2: finishes within the checker's timeouts, trains like one process, and rank 0
    alone logs the norm of the whole '0.weight' every step (on 3 ranks, where a shard of it is
    not the whole of it)."""
    return _check(f"exercise 2: the hang (on {HANG_RANKS} ranks)", fn, world_size=HANG_RANKS,
                  logs=True)


def check_clipping(fn) -> CheckResult:
    """Exercise 3: the loss and the clipping: parity with one process clipping at MAX_NORM."""
    return _check(f"exercise 3: loss and clipping (max_norm {MAX_NORM})", fn, clip=MAX_NORM)
