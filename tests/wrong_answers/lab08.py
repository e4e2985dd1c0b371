"""Lab 08's wrong answers: ``reshard`` written the way a learner gets it wrong (one knob each)."""

import torch

from fsdp_mini import labs
from fsdp_mini.labs.lab08 import checks as lab08

from . import Wrong

EX = "08_reshard"
reshard = labs.load_solution(EX, "reshard")


def _cut(old, numel, new_world_size, new_rank, *, order=sorted, keep=None, size=None, lo=None,
         keys=None, pad=True):
    """A reshard with knobs: each typical mistake is one knob turned."""
    size = size if size is not None else -(-numel // new_world_size)
    lo = lo if lo is not None else new_rank * size
    out = {}
    for key in keys or next(iter(old.values())):
        whole = torch.cat([old[r][key] for r in order(old)])
        whole = whole[:numel] if keep is None else whole
        piece = whole[lo:lo + size]
        out[key] = torch.cat([piece, torch.zeros(size - piece.numel())]) if pad else piece
    return out


def check(**knobs):
    return lambda: labs.check_reshard(lambda o, n, m, r: _cut(o, n, m, r, **knobs))


def check_fn(fn):
    return lambda: labs.check_reshard(fn)


def _zeros(o, n, m, r):
    p = reshard(o, n, m, r)["param"]
    return {"param": p, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}


def _unchanged(o, n, m, r):
    mine = o.get(r, o[0])
    return {"param": reshard(o, n, m, r)["param"], "exp_avg": mine["exp_avg"],
            "exp_avg_sq": mine["exp_avg_sq"]}


def _padded_total(o, n, m, r):
    total = sum(s["param"].numel() for s in o.values())
    return _cut(o, total, m, r, keep=True)


def _padded_total_uneven():
    saved = lab08.CASES
    lab08.CASES = [(9, 4, 2)]  # ceil(12 / 2) = 6, not ceil(9 / 2): the size shows it
    try:
        return labs.check_reshard(_padded_total)
    finally:
        lab08.CASES = saved


def _ones(o, n, m, r):
    out = reshard(o, n, m, r)
    real = max(0, min(n - r * -(-n // m), -(-n // m)))
    return {k: torch.cat([v[:real], torch.ones(len(v) - real)]) for k, v in out.items()}


def _remainder_to_last(o, n, m, r):
    """Floor-sized shards, the last rank taking the rest (a split, not the kit's layout)."""
    size = n // m
    lo, hi = r * size, (n if r == m - 1 else (r + 1) * size)
    return {k: torch.cat([o[q][k] for q in sorted(o)])[:n][lo:hi].clone() for k in o[0]}


def _reversed_ranks(o, n, m, r):
    return reshard(o, n, m, m - 1 - r)


def _old_shard_as_is(o, n, m, r):
    """No resharding: new rank r loads old rank r's files (the new ranks beyond, rank 0's)."""
    return {k: v.clone() for k, v in o.get(r, o[0]).items()}


WRONG = [
    Wrong(EX, "the optimizer state forgotten (only 'param')",
          check_fn(lambda o, n, m, r: {"param": reshard(o, n, m, r)["param"]}),
          ("optimizer state forgotten", "exp_avg")),
    Wrong(EX, "the moments left as zeros", check_fn(_zeros),
          ("adam's moments (exp_avg, exp_avg_sq) are not", "all zeros")),
    Wrong(EX, "the moments left as the old rank's shard", check_fn(_unchanged),
          ("adam's moments (exp_avg, exp_avg_sq) are not", "old rank 0's shard, unchanged")),
    Wrong(EX, "equal shards of numel // N", lambda: labs.check_reshard(
              lambda o, n, m, r: _cut(o, n, m, r, size=n // m, lo=r * (n // m))),
          ("do not split evenly", "numel // n")),
    Wrong(EX, "old shards joined in the order they came", check(order=list),
          ("in the order they came", "not by rank")),
    Wrong(EX, "the old padding kept", check(keep=True), ("old ranks' padding",)),
    Wrong(EX, "the old padding counted as elements (same size)", check_fn(_padded_total),
          ("old padding",)),
    Wrong(EX, "the old padding counted as elements (another size)", _padded_total_uneven,
          ("counted the old padding (12 = 9 + 3) as elements",)),
    Wrong(EX, "off by one: the shard starts one late",
          lambda: labs.check_reshard(lambda o, n, m, r: _cut(o, n, m, r, lo=r * -(-n // m) + 1)),
          ("off by one",)),
    Wrong(EX, "bytes for elements in the offset",
          lambda: labs.check_reshard(lambda o, n, m, r: _cut(o, n, m, r, lo=r * -(-n // m) * 4)),
          ("bytes and elements mixed",)),
    Wrong(EX, "bytes for elements in the size",
          lambda: labs.check_reshard(lambda o, n, m, r: _cut(o, n, m, r, size=-(-n // m) * 4)),
          ("bytes and elements mixed",)),
    Wrong(EX, "the padding not zeros", check_fn(_ones), ("padding is not zeros",)),
    Wrong(EX, "the last shard not padded (a short slice)", check(pad=False),
          ("last", "padded")),
    Wrong(EX, "floor shards, the remainder to the last rank", check_fn(_remainder_to_last),
          ("ceil",)),
    Wrong(EX, "the new ranks counted from the end", check_fn(_reversed_ranks),
          ("rank 0", "rank 2's")),
    Wrong(EX, "no resharding: old rank r's shard as it was", check_fn(_old_shard_as_is),
          ("not resharded",)),
]
