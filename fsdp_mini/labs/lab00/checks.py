"""Lab 00's checker: the mean of the ranks, with one all-reduce.

    labs.check_mean_of_ranks(mean_of_ranks, cfg.world_size, cfg.backend)

The learner's function runs on the lab's ranks (and on one more world size, in CPU processes with
gloo, so that a world size written as a number shows). Each rank's ``dist.all_reduce`` calls are watched: which tensor was
reduced, with which op, whether an ``async_op=True`` handle was waited for, so a wrong answer is
named (the sum not divided, a copy reduced instead of the tensor returned, no all-reduce at all).
"""

from __future__ import annotations

import re

from ...launcher import LaunchError, LaunchTimeoutError, launch
from ..common.checking import forget_logs
from ..common.exercise import not_written_yet
from ..common.report import CheckResult

__all__ = ["check_mean_of_ranks"]


def _means_on_rank(rank, world_size, fns):
    """Each fn on this rank, with dist.all_reduce watched; what it returned and what it reduced."""
    import torch
    import torch.distributed as dist
    original, out = dist.all_reduce, []
    for fn in fns:
        calls = []

        def watched(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False, calls=calls):
            call = {"tensor": tensor, "before": tensor.detach().clone(), "op": str(op),
                    "async": async_op, "waited": not async_op}
            calls.append(call)
            work = original(tensor, op=op, group=group, async_op=async_op)
            if async_op and work is not None:
                work = _Handle(work, call)
            return work

        dist.all_reduce = watched
        try:
            returned, error = fn(rank, world_size), ""
        except Exception as e:  # noqa: BLE001  (the learner's code: named by the checker)
            returned, error = None, f"{type(e).__name__}: {e}"
        finally:
            dist.all_reduce = original
        for call in calls:  # what each reduced tensor held when the function returned
            call["after"] = call.pop("tensor").detach().clone().flatten().tolist()
            call["before"] = call["before"].flatten().tolist()
        if isinstance(returned, torch.Tensor):
            returned = returned.detach().cpu()
        out.append({"returned": returned, "error": error, "calls": calls})
        dist.barrier()
    return out


class _Handle:
    """The handle an ``async_op=True`` all-reduce returns, noting whether it was waited for."""

    def __init__(self, work, call):
        self._work, self._call = work, call

    def wait(self, *args, **kwargs):
        self._call["waited"] = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


def check_mean_of_ranks(fn, world_size: int = 2, backend: str | None = None,
                        timeout: float = 20) -> CheckResult:
    """Run ``fn(rank, world_size)`` on ``world_size`` ranks and on one more size; every rank must
    return the mean of the ranks, a Python float, got from the ranks with ``dist.all_reduce``."""
    return _check_means([fn], world_size, backend, timeout)[0].finish()


def _other_size(world_size: int) -> int:
    return 3 if world_size != 3 else 2


def _check_means(fns, world_size=2, backend=None, timeout=20) -> list[CheckResult]:
    """Several functions judged from one launch per world size, each judged alone."""
    results = [CheckResult("your mean_of_ranks") for _ in fns]
    todo = [k for k, fn in enumerate(fns) if not not_written_yet(fn)]
    for k in sorted(set(range(len(fns))) - set(todo)):
        results[k].wrong("mean_of_ranks is not written yet: write it in the cell above and run "
                         "this cell again", hint="labs.show_solution('00_mean_of_ranks') shows one way")
    if not todo:
        return results
    sizes = [world_size, _other_size(world_size)]
    runs = {}
    for n in sizes:
        try:
            # Note: the extra world size on CPU processes: NCCL would need a GPU per rank
            per_rank = launch(_means_on_rank, n, [fns[k] for k in todo],
                              backend=backend if n == world_size else "gloo", timeout=timeout)
        except LaunchError as err:
            forget_logs(err)
            for k in todo:
                _explain_launch(results[k], err, n)
            return results
        runs[n] = {k: [rank_out[j] for rank_out in per_rank] for j, k in enumerate(todo)}
    for k in todo:
        right = [n for n in sizes if _judge(results[k], runs[n][k], n, quiet=True)]
        wrong = [n for n in sorted(sizes, reverse=True) if n not in right]
        if not wrong:
            results[k].ok(f"every rank returned the mean of the ranks, a float, on "
                          f"{' and '.join(map(str, sizes))} ranks, from dist.all_reduce")
            continue
        bad, got = wrong[0], [c["returned"] for c in runs[wrong[0]][k]]
        if right and all(isinstance(v, float) and v == sum(range(bad)) / right[0] for v in got):
            results[k].wrong(f"right on {right[0]} ranks, wrong on {bad}: you divided by "
                             f"{right[0]}, the world size written as a number",
                             hint="divide by world_size, the argument, so it works on any "
                                  "number of ranks")
        else:
            _judge(results[k], runs[bad][k], bad, quiet=False)
    return results


def _explain_launch(result, err, n) -> None:
    first = str(err).splitlines()[0][:300]
    if isinstance(err, LaunchTimeoutError) or "still in a collective" in str(err):
        result.wrong(f"the ranks did not finish on {n} ranks: {first}",
                     hint="every rank must call dist.all_reduce, the same calls in the same "
                          "order: is it under an `if` on the rank?")
    else:
        message = re.sub(r"\s+", " ", str(err.message)).strip()[:300]
        result.wrong(f"your code raised on rank {err.rank}: {message}",
                     hint="the line above says which; fix it and run it again")


def _judge(result, per_rank, n, quiet) -> bool:
    """True when every rank is right; else (unless ``quiet``) one ✘ line naming the mistake."""
    mean, total = sum(range(n)) / n, float(sum(range(n)))
    say = (lambda *a, **k: None) if quiet else result.wrong
    errors = [(r, c["error"]) for r, c in enumerate(per_rank) if c["error"]]
    if errors:
        r, error = errors[0]
        avg = "AVG" in error or "avg" in error.lower()
        say(f"your code raised on rank {r} ({n} ranks): {error[:300]}",
            hint="gloo has no ReduceOp.AVG: all-reduce the sum (the default op), then divide "
                 "by world_size" if avg else "the line above says which; fix it and run again")
        return False
    returned = [c["returned"] for c in per_rank]
    calls = [c["calls"] for c in per_rank]
    tensors = [type(v).__name__ for v in returned if not isinstance(v, float)]
    if tensors:
        say(f"return the mean as a Python float, not a {tensors[0]}: t.item() turns a "
            f"one-element tensor into a float")
        return False
    if not all(calls):
        r = next(r for r, c in enumerate(calls) if not c)
        if all(v == mean for v in returned):
            say(f"rank {r} called no dist.all_reduce: it computed the mean from world_size "
                f"alone, without the other ranks' tensors",
                hint="each rank puts its own rank in a tensor; dist.all_reduce sums them")
        else:
            say(f"rank {r} called no dist.all_reduce (it returned {returned[r]:g}); every rank "
                f"must all-reduce its tensor", hint="dist.all_reduce(t) sums t over the ranks")
        return False
    ops = {c["op"].rsplit(".", 1)[-1].upper() for cs in calls for c in cs}
    if ops - {"SUM", "AVG"}:  # Note: AVG leaves the mean itself: right, where the backend has it
        op = sorted(ops - {"SUM", "AVG"})[0]
        say(f"you all-reduced with {op}; the mean needs the sum (ReduceOp.SUM, the default), "
            f"divided by world_size")
        return False
    late = [r for r, cs in enumerate(calls) if any(c["async"] and not c["waited"] for c in cs)]
    if late and any(v != mean for v in returned):
        say(f"rank {late[0]} called dist.all_reduce(..., async_op=True) and never waited: it "
            f"read the tensor before the sum had arrived",
            hint="async_op=True returns a handle: call handle.wait() before reading the tensor "
                 "(or leave async_op out)")
        return False
    if all(v == mean for v in returned):
        if late:
            say(f"rank {late[0]} called dist.all_reduce(..., async_op=True) and never waited; "
                f"it read the right mean here only by luck of timing",
                hint="call handle.wait() before reading the tensor")
            return False
        return True
    # Note: the reduced tensor holds the sum afterwards; was it the one the learner read?
    reduced = all(any(c["after"] and c["after"][0] == total + k * n
                      for c in cs for k in (0, 1)) for cs in calls)
    own = [float(r) for r in range(n)]
    if reduced and (returned == own or returned == [r / n for r in own]):
        say("every rank returned its own number, not the sum: dist.all_reduce works in place "
            "on the tensor you pass, and the sum is there only after the call. Either the copy "
            "you passed (t.clone(), or a new tensor) was reduced, not the tensor you returned, "
            "or you read the number before the all-reduce",
            hint="dist.all_reduce(t) on t itself, then read t.item()")
    elif all(v == total for v in returned):
        say("every rank returned the sum: divide it by world_size")
    elif all(v == mean + 1 for v in returned) or all(v == total + n for v in returned):
        say("you put rank + 1 in the tensor (as first_collective does): the mean of the ranks "
            "0 ... N-1 needs the rank itself")
    elif all(v == total // n for v in returned):
        say("you used floor division (//): the mean of the ranks need not be a whole number; "
            "divide with /")
    elif all(v == total / (n - 1) for v in returned):
        say("you divided by world_size - 1: the mean of N ranks divides the sum by N "
            "(world_size)")
    elif returned == own:
        say("every rank returned its own rank: did all_reduce run on your tensor?")
    else:
        say(f"on {n} ranks the ranks returned {returned}; the mean of the ranks is {mean:g} "
            f"on every rank")
    return False
