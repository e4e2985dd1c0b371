"""Lab 08's wrong answers: ``reshard`` written the way a learner gets it wrong (one knob each),
judged in one batch by the lab's check (``JUDGES``)."""

import torch

from fsdp_mini import labs

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
        out[key] = (torch.cat([piece, torch.zeros(size - piece.numel(), dtype=piece.dtype)])
                    if pad else piece)
    return out


def knobs(**turned):
    return lambda o, n, m, r: _cut(o, n, m, r, **turned)


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


def _ones(o, n, m, r):
    out = reshard(o, n, m, r)
    real = max(0, min(n - r * -(-n // m), -(-n // m)))
    return {k: torch.cat([v[:real], torch.ones(len(v) - real, dtype=v.dtype)])
            for k, v in out.items()}


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


def _adam_keys_only(o, n, m, r):
    """The keys written out by name: SGD's momentum_buffer is not among them."""
    out = _cut(o, n, m, r, keys=[k for k in ("param", "exp_avg", "exp_avg_sq") if k in o[0]])
    return out


def _a_view_when_it_fits(o, n, m, r):
    """When the new shard lies in one old shard, a slice of it (a view), not a new tensor."""
    size, ranks = -(-n // m), sorted(o)
    old = len(o[ranks[0]]["param"])
    lo = r * size
    if lo // old == (lo + size - 1) // old and lo + size <= n:
        return {k: o[ranks[lo // old]][k][lo % old:lo % old + size] for k in o[ranks[0]]}
    return reshard(o, n, m, r)


def _float32_padding(o, n, m, r):
    """The new shard made with torch.zeros(size): float32 whatever the old dtype."""
    out = {}
    for k, v in reshard(o, n, m, r).items():
        shard = torch.zeros(len(v))
        shard[:] = v
        out[k] = shard
    return out


WRONG = [
    Wrong(EX, "the optimizer state forgotten (only 'param')",
          lambda o, n, m, r: {"param": reshard(o, n, m, r)["param"]},
          ("the keys new rank 0 got", "return every key of the old shards")),
    Wrong(EX, "the moments left as zeros", _zeros, ("'exp_avg'", "all zeros")),
    Wrong(EX, "the moments left as the old rank's shard", _unchanged,
          ("views of an old shard", "a new tensor")),
    Wrong(EX, "equal shards of numel // N",
          lambda o, n, m, r: _cut(o, n, m, r, size=n // m, lo=r * (n // m)),
          ("numel // n",)),
    Wrong(EX, "old shards joined in the order they came", knobs(order=list),
          ("right only when the old shards come by rank", "sorted(old_shards)")),
    Wrong(EX, "the old padding kept", knobs(keep=True), ("holds nan", "old ranks' padding")),
    Wrong(EX, "the old padding counted as elements", _padded_total,
          ("the old padding counted as elements",)),
    Wrong(EX, "off by one: the shard starts one late",
          lambda o, n, m, r: _cut(o, n, m, r, lo=r * -(-n // m) + 1), ("off by one",)),
    Wrong(EX, "bytes for elements in the offset",
          lambda o, n, m, r: _cut(o, n, m, r, lo=r * -(-n // m) * 4), ("bytes, not elements",)),
    Wrong(EX, "bytes for elements in the size",
          lambda o, n, m, r: _cut(o, n, m, r, size=-(-n // m) * 4), ("bytes, not elements",)),
    Wrong(EX, "the padding not zeros", _ones, ("the padding is not zeros",)),
    Wrong(EX, "the last shard not padded (a short slice)", knobs(pad=False),
          ("not padded",)),
    Wrong(EX, "floor shards, the remainder to the last rank", _remainder_to_last,
          ("ceil(",)),
    Wrong(EX, "the new ranks counted from the end", _reversed_ranks,
          ("counted from the wrong end",)),
    Wrong(EX, "no resharding: old rank r's shard as it was", _old_shard_as_is,
          ("as it was saved", "another slice")),
    Wrong(EX, "the keys written by name (SGD's momentum_buffer dropped)", _adam_keys_only,
          ("(param, momentum_buffer)", "return every key of the old shards")),
    Wrong(EX, "a view of the old shard where the new one lies inside it", _a_view_when_it_fits,
          ("views of an old shard", "a new tensor")),
    Wrong(EX, "float32 shards whatever the old dtype", _float32_padding,
          ("bfloat16", "keep their dtype")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("08")
