"""Lab 00's checker: ``mean_of_ranks`` beside the reference, its values, types and all-reduces."""

from __future__ import annotations

import math
from types import SimpleNamespace

from ..common.differential import Check, Hint, spread
from ..common.exercise import load_solution, not_written_yet
from ..common.report import CheckResult, verdict_of_check

__all__ = ["check_mean_of_ranks"]

OTHER_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
                     "reduce", "gather", "reduce_scatter_tensor", "all_to_all_single")


def _observe(fn, cfg, record) -> None:
    import torch.distributed as dist
    original, calls, space = dist.all_reduce, [], getattr(fn, "__globals__", {})

    def watched(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append(call := [str(op).rsplit(".", 1)[-1].upper(), not async_op])
        work = original(tensor, op=op, group=group, async_op=async_op)
        return SimpleNamespace(wait=lambda *a: (call.__setitem__(1, True), work.wait(*a))[1]
                               ) if async_op else work  # Note: the handle notes its wait
    names = [k for k, v in space.items() if v is original]  # Note: `from ... import all_reduce`
    others, seen_others = {n: getattr(dist, n) for n in OTHER_COLLECTIVES}, []
    dist.all_reduce, _ = watched, space.update(dict.fromkeys(names, watched))
    for n, f in others.items():
        setattr(dist, n, lambda *a, _n=n, _f=f, **k: (seen_others.append(_n), _f(*a, **k))[1])
    try:
        value = fn(record.rank, cfg["world_size"])
    finally:
        dist.all_reduce, _ = original, space.update(dict.fromkeys(names, original))
        for n, f in others.items():
            setattr(dist, n, f)
    if seen_others:  # Note: the mean is one all-reduce; any other collective is not the lesson's
        record.see("other collectives", ", ".join(dict.fromkeys(seen_others)))
    record.see("all_reduce", ", ".join(op + ("" if waited else " (async_op=True, never waited)")
                                       for op, waited in calls) or "no call")
    record.see("returned", value.item() if getattr(value, "numel", lambda: 0)() == 1 else value)
    record.see("type", "float" if isinstance(value, float) else type(value).__name__)


def _fit(d) -> dict:  # yours beside the reference's: one divisor of the sum, one offset...
    rows = [(c["world_size"], mine.get("returned", rank=r), want.get("returned", rank=r))
            for c, (mine, want) in d.table.items() for r in range(c["world_size"])]
    rows = [(n, m, w) for n, m, w in rows if isinstance(m, (int, float)) and w is not None]
    n, mine = d.config["world_size"], d.table[d.config][0]

    def one(v):
        return v[0] or None if v and all(math.isclose(x, v[0]) for x in v) else None
    return {"divisor": one([w * n / m for n, m, w in rows if m]), "offset": one(
        [m - w for _, m, w in rows]), "floor": bool(rows) and all(m == math.floor(w) for _, m, w
                                                                    in rows),
        "right": all(m == w for _, m, w in rows), "own": all(mine.get(
            "returned", rank=r) in (r, r / n) for r in range(n))}


def _others(d) -> str:
    return d.table[d.config][0].get("other collectives", rank=d.where.get("rank", 0)) or ""


def _ranks_right(d) -> tuple[list, list]:
    """(ranks right in every configuration, ranks wrong in some): code that runs on some ranks.
    Note: a rank counts as right everywhere only if it was seen in two world sizes or more (the
    last rank of the largest world size alone proves nothing)."""
    right, wrong, seen = set(), set(), {}
    for c, (mine, want) in d.table.items():
        for r in range(c["world_size"]):
            m, w = mine.get("returned", rank=r), want.get("returned", rank=r)
            ok = isinstance(m, (int, float)) and w is not None and math.isclose(m, w)
            (right if ok else wrong).add(r)
            seen[r] = seen.get(r, 0) + 1
    return sorted(r for r in right - wrong if seen[r] > 1), sorted(wrong)


def _ranks_differ(d) -> str:
    """Where the reference's ranks agree and yours do not: each rank's value, in words."""
    mine, want = d.table[d.config]
    n = d.config["world_size"]
    got = [mine.get("returned", rank=r) for r in range(n)]
    if n < 2 or len({want.get("returned", rank=r) for r in range(n)}) != 1 or len(
            {repr(g) for g in got}) < 2:
        return ""
    return ", ".join(f"rank {r}: {g:g}" if isinstance(g, (int, float)) else f"rank {r}: {g!r}"
                     for r, g in enumerate(got))


HINTS = [
    Hint(lambda d: any(m.error and m.error[0] == "a hang" for m, _ in d.table.values()), "the "
         "ranks hung at a larger world size: every rank must make the same dist.all_reduce calls"),
    Hint(lambda d: d.raised, lambda d: "the line above says where" + (
         ": the mean of N ranks divides their sum by N, world_size itself, never 0" if
         d.raised[0] == "ZeroDivisionError" else "; fix it and run this cell again")),
    Hint(lambda d: d.mine == "no call" and _others(d), lambda d: f"rank {d.where['rank']} "
         f"called dist.{_others(d)} instead of dist.all_reduce: the other ranks' numbers arrive "
         "whole, and the sum is yours to make. The mean needs one all-reduce of the sum"),
    Hint(lambda d: d.mine == "no call", lambda d: f"rank {d.where['rank']} called no dist."
         "all_reduce" + (": it computed the mean from world_size alone, without the other ranks'"
         " tensors" if _fit(d)["right"] else "") + ". Put the rank in a tensor, all-reduce it"),
    Hint(lambda d: "never waited" in d.mine, "dist.all_reduce(..., async_op=True): its handle "
         "was never waited for, so the sum may not be there yet. Call handle.wait() first"),
    Hint(lambda d: d.observable == "all_reduce", "you all-reduced with {mine}; the mean needs "
         "one all-reduce of the sum (ReduceOp.SUM, the default), divided by world_size"),
    Hint(lambda d: d.mine == "NoneType", "rank {rank} returned None: every rank returns the mean"),
    Hint(lambda d: d.observable == "type", "return the mean as a Python float, not a {mine}: "
         "t.item() turns a one-element tensor into a float"),
    Hint(lambda d: _fit(d)["own"], "every rank returned its own number: dist.all_reduce works "
         "in place on the tensor you pass, after the call. The copy you passed (t.clone(), a new "
         "tensor) was reduced, or you read the tensor before the all-reduce had finished (with "
         "async_op=True: before handle.wait() returned)"),
    Hint(lambda d: _fit(d)["divisor"] == 1, "every rank returned the sum: divide by world_size"),
    Hint(lambda d: _fit(d)["divisor"], lambda d: "you divided the sum by {divisor:g} whatever "
         "the world size (written as a number?): divide by world_size".format(**_fit(d))),
    Hint(lambda d: _fit(d)["offset"], lambda d: "yours is the mean {offset:+g}: each rank put "
         "rank + {offset:g} in the tensor, not its rank".format(**_fit(d)).replace("+ -", "- ")),
    Hint(lambda d: all(_ranks_right(d)) and d.observable == "returned", lambda d: "rank(s) "
         f"{', '.join(map(str, _ranks_right(d)[0]))} return the mean everywhere, rank(s) "
         f"{', '.join(map(str, _ranks_right(d)[1]))} do not: every rank computes the same mean "
         f"(is the division, or the return, under an `if rank == ...`?)"),
    Hint(lambda d: _ranks_differ(d), lambda d: f"your ranks returned different numbers "
         f"({_ranks_differ(d)}) where the mean is one number on every rank: what each rank "
         "divides by, or adds, depends on its rank; every rank divides the same sum by world_size"),
    Hint(lambda d: _fit(d)["floor"], "the mean rounded down: floor division (//); divide with /"),
]
CHECK = Check("your mean_of_ranks", _observe, [], ("all_reduce", "type", "returned"), words={
    "all_reduce": "rank {rank}'s dist.all_reduce calls", "returned": "what rank {rank} returned",
    "type": "the type of what rank {rank} returned"}, hints=HINTS, on_ranks=True, tolerance={
    "returned": 1e-9}, agreed="every rank returned the mean of the ranks, a float, from one "
    "all-reduce of the sum")
# The lab's own world size last; tests/wrong_answers/ judges at the CI size, 2
JUDGES = {"00_mean_of_ranks": lambda fns, world_size=2: CHECK.judge_many(fns, load_solution(
    "00_mean_of_ranks", "mean_of_ranks"), spread(world_size=sorted({1, 2, 3, 4, world_size})))}


@verdict_of_check
def check_mean_of_ranks(fn, world_size=2, backend=None, timeout=20) -> CheckResult:
    """``fn(rank, world_size)`` beside the reference on 1 to 4 ranks and ``world_size`` (CPU
    ranks with gloo whatever ``backend``): every rank returns the mean of the ranks, a float."""
    if not_written_yet(fn):
        return CheckResult(CHECK.what).wrong("mean_of_ranks is not written yet: write it above, "
                                             "then run this cell again", hint="labs.show_"
                                             "solution('00_mean_of_ranks') shows one").finish()
    CHECK.timeout = timeout
    return JUDGES["00_mean_of_ranks"]([fn], world_size)[0].finish()
