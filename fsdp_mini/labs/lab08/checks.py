"""Lab 08: checkpoints. The checker of the resharding exercise, beside the reference; the rank
functions that save, kill, resume and load into torch are in :mod:`fsdp_mini.labs.lab08.runs`.

    def reshard(old_shards, numel, new_world_size, new_rank): ...   # you write it
    labs.check_reshard(reshard)     # every new rank, old and new world sizes 1 to 5, ...

The old shards are the kit's own flat layout (:class:`fsdp_mini.buffers.flat.FlatLayout`, the one
its fsdp shards with): a unit's elements 1, 2, ... numel (the moments /100 and /10000, SGD's
momentum /1000), the old padding NaN (its values mean nothing), given in the order files come.
Every new rank's shards are compared with the reference's: their keys, lengths, dtypes, values,
and whether one is a view of an old shard (storage shared with what was loaded).
"""

from __future__ import annotations

import math

import torch

from ...buffers.flat import FlatLayout, ParamSlot
from ..common.differential import Check, Hint
from ..common.exercise import load_solution, not_written_yet
from ..common.records import Config, spread
from ..common.report import CheckResult, verdict_of_check
from ..common.facts import right_only_with
from .runs import *  # noqa: F401,F403
from .runs import __all__ as _RUNS

__all__ = ["check_reshard", *_RUNS]

SCALES = {"param": 1.0, "exp_avg": 1e-2, "exp_avg_sq": 1e-4, "momentum_buffer": 1e-3}
STATE = {"adam": ("param", "exp_avg", "exp_avg_sq"), "sgd": ("param", "momentum_buffer")}
ORDERS = {"by rank": sorted, "rank 0 last": lambda rs: sorted(rs)[1:] + sorted(rs)[:1],
          "reversed": lambda rs: sorted(rs, reverse=True)}
LAB_UNIT = 12608      # the tiny GPT's block: the lab's own unit


def old_shards(cfg) -> dict[int, dict[str, torch.Tensor]]:
    """Every old rank's shards of the configuration's unit, in its order, padding NaN."""
    numel, n = cfg["numel"], cfg["old_world_size"]
    layout = FlatLayout([ParamSlot(None, ["unit"], [], shape=torch.Size([numel]),
                                   requires_grad=True)], n)
    pad = torch.full((layout.padded_numel - numel,), math.nan, dtype=torch.float64)
    whole = {k: torch.cat([torch.arange(1, numel + 1, dtype=torch.float64) * SCALES[k], pad])
             for k in STATE[cfg["state"]]}
    return {r: {k: v[slice(*layout.shard_range(r))].to(getattr(torch, cfg["dtype"]))
                for k, v in whole.items()} for r in ORDERS[cfg["order"]](range(n))}


def _observe(fn, cfg, record) -> None:
    for rank in range(cfg["new_world_size"]):
        old = old_shards(cfg)
        got = fn(old, cfg["numel"], cfg["new_world_size"], rank)
        if not isinstance(got, dict):
            record.see("keys", f"a {type(got).__name__}", new_rank=rank)
            continue
        record.see("keys", sorted(map(str, got)), new_rank=rank)
        for key in STATE[cfg["state"]]:
            record.see("shard", got.get(key), new_rank=rank, key=key)
        # Note: the saved shards are what was loaded: a reshard reads them, never writes them
        changed = sorted(f"old rank {r}'s {k}" for r, s in old.items() for k, t in s.items()
                         if not torch.equal(t.nan_to_num(7.5), old_shards(cfg)[r][k].nan_to_num(
                             7.5)))
        record.see("inputs changed", changed or "none", new_rank=rank)
        stored = {t.untyped_storage().data_ptr() for s in old.values() for t in s.values()}
        record.see("views", sorted(k for k, v in got.items() if torch.is_tensor(v) and
                                   v.untyped_storage().data_ptr() in stored), new_rank=rank)


def _size(d) -> int:
    return -(-d.config["numel"] // d.config["new_world_size"])


def _lengths(d) -> str:
    """Which of the lesson's lengths yours is."""
    c, mine, size = d.config, len(d.mine), _size(d)
    n, m, r = c["numel"], c["new_world_size"], d.where["new_rank"]
    old = -(-n // c["old_world_size"]) * c["old_world_size"]
    named = {f"numel // N = {n} // {m}": n // m, f"4 x {size}: bytes, not elements": 4 * size,
             "the real elements of this rank's slice, not padded": max(0, min(n - r * size, size)),
             f"ceil({old} / {m}): the old padding counted as elements (use numel, not the sum "
             f"of the old shards' lengths)": -(-old // m),
             f"ceil({n} / {c['old_world_size']}): the old world size's shard, cut for the new "
             f"world size N = {m}": -(-n // c["old_world_size"])}
    said = [w for w, v in named.items() if v == mine]
    return (f"yours has {mine} elements, the reference ceil({n} / {m}) = {size}" +
            (f": {'; '.join(said)}" if said else "") + ". Every new shard holds ceil(numel / N) "
            "elements, the last padded with zeros")


def _informative(d):
    """(cfg, new rank, key, yours, the reference's): the first shard of the same length that
    differs, in a unit of 7 elements or more (where a slice says where it comes from), not
    blank, at another world size (else any)."""
    for blank_too in (False, True):
        for c in [d.config] + d.differ:
            mine, want = d.table[c]
            rich = c["numel"] >= 7 and (blank_too or c["old_world_size"] != c["new_world_size"])
            for r in range(c["new_world_size"] if rich else 0):
                for key in STATE[c["state"]]:
                    m, w = (x.get("shard", new_rank=r, key=key) for x in (mine, want))
                    if torch.is_tensor(m) and m.shape == w.shape and not torch.equal(
                            m.double().nan_to_num(-1), w.double()) and (
                            blank_too or m.double().nan_to_num(1).abs().sum()):
                        return c, r, key, m, w
    return d.config, d.where["new_rank"], d.where["key"], d.mine, d.want


def _values(d) -> str:
    c, r, key, mine, _ = _informative(d)
    size, n, m = -(-c["numel"] // c["new_world_size"]), c["numel"], c["new_world_size"]
    lo, at = r * size, f"(numel {n}, new rank {r} of {m}, {key!r}) "
    want = list(range(lo, min(lo + size, n)))
    got = ["NaN" if math.isnan(v) else round(v / SCALES[key] - 1) if abs(
        v / SCALES[key] - 1 - round(v / SCALES[key] - 1)) < 0.05 else None
        for v in mine.double().tolist()]
    real = [g for g in got[:len(want)] if isinstance(g, int) and 0 <= g < n]
    old = next((q for q, o in old_shards(c).items() if len(o[key]) == len(mine) and torch.equal(
        o[key].double().nan_to_num(-1), mine.double().nan_to_num(-1))), None)
    if old is not None:
        return (f"{at}your shard is old rank {old}'s, as it was saved: at another world size "
                f"each new rank holds another slice, ceil(numel / N) elements from r x "
                f"ceil(numel / N)")
    if "NaN" in got:
        return (f"{at}your shard holds NaN: the old ranks' padding (its values mean nothing). "
                f"Join the old shards by rank, keep the first numel elements, then cut; the new "
                f"padding is zeros")
    if real == want:
        return f"{at}the elements are right but the padding is not zeros"
    if not mine.double().abs().sum():
        return f"{at}your shard is all zeros: the resumed optimizer would restart from nothing"
    if real and real == list(range(real[0], real[0] + len(real))):
        s = real[0]
        why = ("off by one" if abs(s - lo) == 1 else "4 x the start: bytes, not elements"
               if s == 4 * lo and lo else f"that is new rank {m - 1 - r}'s slice: the new ranks "
               f"are counted from the wrong end" if s == (m - 1 - r) * size else "")
        return (f"{at}your shard starts at element {s}, new rank {r}'s at {lo} = {r} x "
                f"ceil({n} / {m})" + (f": {why}" if why else ""))
    return (f"{at}your shard holds the unit's elements {real[:8]}, not the slice [{lo}, "
            f"{lo + len(want)}): join the old shards in rank order (sorted(old_shards)), then "
            f"cut ceil(numel / N) for each new rank")


def _tensor_pair(d) -> bool:
    return torch.is_tensor(d.mine) and torch.is_tensor(d.want)


HINTS = [
    Hint(lambda d: d.raised is not None, "old_shards maps each old rank to its shards {key: 1-D "
         "tensor}, in the order the files came; return {key: new shard} for every key"),
    Hint(lambda d: d.observable == "keys" or (d.observable == "shard" and d.mine is None),
         lambda d: f"return every key of the old shards ({', '.join(STATE[d.config['state']])}):"
         f" the parameter and each optimizer state, resharded the same way; a resumed optimizer "
         f"without them starts its moments from zero"),
    Hint(lambda d: d.observable == "shard" and not torch.is_tensor(d.mine), "each shard is a "
         "1-D tensor"),
    Hint(lambda d: _tensor_pair(d) and d.mine.shape == d.want.shape and d.mine.dtype !=
         d.want.dtype, lambda d: f"the old shards are {str(d.want.dtype)[6:]}: keep their dtype "
         f"(torch.zeros(size) is float32 unless given dtype=)"),
    Hint(lambda d: _tensor_pair(d) and d.mine.dim() != 1, "return flat (1-D) shards"),
    Hint(lambda d: _tensor_pair(d) and len(d.mine) != len(d.want), _lengths),
    Hint(lambda d: right_only_with(d, "order", lambda v: v == "by rank"), "right only when the "
         "old shards come by rank: they come in the order files are listed; sort them "
         "(sorted(old_shards)) before joining"),
    Hint(lambda d: _tensor_pair(d), _values),
    Hint(lambda d: d.observable == "views", "your shard is a view of an old shard (a slice of "
         "what was loaded, or the tensor itself): the optimizer updates its shard in place, and "
         "would write into the old one; return a new tensor (torch.cat, torch.zeros then copy, "
         ".clone())"),
    Hint(lambda d: d.observable == "inputs changed", "your reshard wrote into the old shards it "
         "was given ({mine}): they are what was loaded, and every new rank reads them again. "
         "Read them only: work on a copy (torch.cat makes one) and return new tensors"),
]

CHECK = Check("your reshard", _observe, configs=[], order=("keys", "shard", "views",
                                                          "inputs changed"),
              hints=HINTS, words={
                  "keys": "the keys new rank {new_rank} got", "shard": "new rank {new_rank}'s "
                  "{key!r}", "views": "new rank {new_rank}'s shards that are views of an old "
                  "shard", "inputs changed": "the old shards after new rank {new_rank}'s "
                  "reshard changed"},
              agreed="every new rank's shards are the reference's: ceil(numel / N) elements, "
                     "in rank order, zeros as padding, every optimizer state, new tensors of the "
                     "old dtype")


def configs() -> list[Config]:
    """Old and new world sizes 1 to 5 for 1, 7, 12 and 40 elements (a new rank holding only
    padding, sizes N does not divide); shards in three orders, three dtypes, Adam's and SGD's
    states; the lab's own unit last."""
    return (spread(numel=[1, 7, 12, 40], old_world_size=[1, 2, 3, 4, 5],
                   new_world_size=[1, 2, 3, 4, 5], order=["rank 0 last"], dtype=["float32"],
                   state=["adam"])
            + spread(numel=[10], old_world_size=[3], new_world_size=[2, 4], order=list(ORDERS),
                     dtype=["float32", "bfloat16", "float64"], state=["adam", "sgd"])
            + spread(numel=[LAB_UNIT], old_world_size=[2, 3], new_world_size=[3, 2],
                     order=["reversed"], dtype=["float32"], state=["adam"]))


def _reference():
    return load_solution("08_reshard", "reshard")


# What tests/wrong_answers/ judges many answers with: the lab's check, one batch
JUDGES = {"08_reshard": lambda answers: CHECK.judge_many(answers, _reference(), configs())}


@verdict_of_check
def check_reshard(fn) -> CheckResult:
    """Run ``fn`` as every new rank of each configuration of :func:`configs`, beside the
    reference; the first new rank whose shards differ, and what yours holds instead."""
    result = CheckResult(CHECK.what)
    if not_written_yet(fn):
        return result.wrong("reshard is not written yet", hint="fill in its body").finish()
    CHECK(fn, _reference(), result, configs=configs())
    return result.finish()
