"""Lab 08: checkpoints. The checker of the resharding exercise; the rank functions that save,
kill, resume and load into torch are in :mod:`fsdp_mini.labs.lab08.runs`.

    def reshard(old_shards, numel, new_world_size, new_rank): ...   # you write it
    labs.check_reshard(reshard)       # ✔/✘ lines: sizes, padding, rank order, ranges, moments

The reference is the kit's own flat layout (:class:`fsdp_mini.buffers.flat.FlatLayout`, the one its
fsdp shards with): every new rank's shard, for unit sizes that do and do not split evenly, going up
and down in world size. The old padding is filled with NaN: its values mean nothing.
"""

from __future__ import annotations

import math

import torch

from ...buffers.flat import FlatLayout, ParamSlot
from ..common.checking import unwritten
from ..common.report import CheckResult
from .runs import (STATES, dcp_run, die_while_saving, flat_shards, lab_model, lab_optimizer, relative_error,
                   resume_run, save_run, train_steps)

__all__ = ["check_reshard", "dcp_run", "die_while_saving", "files_table", "flat_shards", "lab_model",
           "lab_optimizer", "relative_error", "resume_run", "save_run", "train_steps"]

# (numel, old N, new N): uneven splits, up and down, a shrink to one rank, one even split
CASES = [(10, 4, 3), (9, 4, 2), (7, 2, 3), (13, 3, 4), (5, 2, 1), (12, 3, 4)]
KEYS = ("param", *STATES)


def _layout(numel: int, world_size: int) -> FlatLayout:
    slot = ParamSlot(None, ["unit"], [], shape=torch.Size([numel]), requires_grad=True)
    return FlatLayout([slot], world_size)


def _wholes(numel: int) -> dict[str, torch.Tensor]:
    base = torch.arange(1, numel + 1, dtype=torch.float32)
    return {"param": base, "exp_avg": base / 100, "exp_avg_sq": base / 10_000}


def old_shards(numel: int, old_world_size: int) -> dict[int, dict[str, torch.Tensor]]:
    """Every old rank's shards of a unit whose elements are 1, 2, ... numel (moments /100,
    /10000), padding NaN; in the order files come from a folder listing, not by rank."""
    layout = _layout(numel, old_world_size)
    out = {}
    for r in list(range(1, old_world_size)) + [0]:
        lo, hi = layout.shard_range(r)
        out[r] = {k: torch.cat([v, torch.full((layout.padded_numel - numel,), math.nan)])[lo:hi]
                  for k, v in _wholes(numel).items()}
    return out


def expected_shard(numel: int, new_world_size: int, new_rank: int) -> dict[str, torch.Tensor]:
    """What the kit's layout gives ``new_rank``: its slice of the unit padded with zeros."""
    layout = _layout(numel, new_world_size)
    lo, hi = layout.shard_range(new_rank)
    return {k: layout.flatten([v])[lo:hi] for k, v in _wholes(numel).items()}


def check_reshard(fn) -> CheckResult:
    """Run ``fn`` as every new rank of each case in ``CASES``; name the first mistake seen."""
    result = CheckResult("your reshard")
    if unwritten(fn):
        return result.wrong("reshard is not written yet", hint="fill in its body").finish()
    if (same := _not_resharded(fn)):
        return result.wrong(*same).finish()
    for numel, old_n, new_n in CASES:
        for rank in range(new_n):
            want = expected_shard(numel, new_n, rank)
            try:
                got = fn(old_shards(numel, old_n), numel, new_n, rank)
            except Exception as e:  # noqa: BLE001  (any error of the learner's code is a ✘)
                return result.wrong(f"reshard raised {type(e).__name__}: {e} (numel {numel}, "
                                    f"{old_n} old ranks, new rank {rank} of {new_n})").finish()
            problem = _diagnose(got, want, numel, old_n, new_n, rank)
            if problem:
                return result.wrong(*problem).finish()
    result.ok(f"every new rank's shard is right for {len(CASES)} unit sizes and world-size "
              f"changes ({', '.join(f'{n} elements {a}→{b} ranks' for n, a, b in CASES)})")
    result.ok("shards of ceil(numel / N) elements, padding zeros, old ranks taken in rank order")
    result.ok("Adam's two moments (exp_avg, exp_avg_sq) resharded exactly like the parameter")
    return result.finish()


def _not_resharded(fn):
    """(message, hint) when every new rank gets the old rank's shards as they were, else None.
    Note: one case alone can look like another slip (equal shards of 10 // 3 = 3 on rank 0 are
    old rank 0's 3 elements): only all the cases together say "not resharded"."""
    seen = 0
    for numel, old_n, new_n in CASES:
        for rank in range(min(old_n, new_n) if old_n != new_n else 0):
            old = old_shards(numel, old_n)
            try:
                got = fn(old_shards(numel, old_n), numel, new_n, rank)
                if not all(torch.is_tensor(got[k]) and _same(got[k].reshape(-1), old[rank][k])
                           for k in KEYS):
                    return None
            except Exception:  # noqa: BLE001  (the main loop reports the learner's errors)
                return None
            seen += 1
    return None if not seen else (
        (f"not resharded: every new rank r got old rank r's shards as they were saved (e.g. "
         f"numel {CASES[0][0]}, {CASES[0][1]} → {CASES[0][2]} ranks, new rank 0 got old rank 0's "
         f"{-(-CASES[0][0] // CASES[0][1])} elements); on another world size each rank holds "
         f"another slice"),
        ("join the old shards by rank, drop the padding past numel, then cut "
         "ceil(numel / new_world_size) elements for the new rank"))


def _diagnose(got, want, numel, old_n, new_n, rank):
    """(message, hint) for the first thing wrong in ``got``, or None."""
    where = f"numel {numel}, {old_n} → {new_n} ranks, new rank {rank}"
    if not isinstance(got, dict):
        return ((f"reshard returned a {type(got).__name__}; return a dict with 'param', "
                f"'exp_avg' and 'exp_avg_sq'"), "one entry per key of the old shards")
    missing = [k for k in KEYS if k not in got]
    if "param" in missing:
        return (f"no 'param' in what you return ({where})", "one entry per key of the old shards")
    if missing:
        return ((f"{MOMENTS_NOT_RESHARDED} (optimizer state forgotten: no {missing} in what "
                 f"you return; {where}); the resumed Adam would start its moments from zero and "
                 f"take a different step"),
                "reshard every entry of the old shards, not only 'param'")
    moments = _moments_forgotten(got, want, numel, old_n, rank)
    if moments:
        return f"{MOMENTS_NOT_RESHARDED} ({moments}; {where})", MOMENTS_HINT
    size = len(want["param"])
    for key in KEYS:
        g = got[key]
        if not torch.is_tensor(g) or g.dim() != 1:
            return (f"{key!r} is not a 1-D tensor ({where})", "return flat shards")
        if g.numel() != size:
            real = max(0, min(numel - rank * size, size))
            if g.numel() == real < size:
                return ((f"{key!r} has {g.numel()} elements, expected {size} ({where}): the last "
                         f"shard is not padded: rank {rank}'s slice holds {real} real elements, "
                         f"and every shard is ceil({numel}/{new_n}) = {size} long"),
                        "pad the short slice with zeros up to ceil(numel / N)")
            return _wrong_size(key, g.numel(), size, numel, old_n, new_n, where)
    for key in KEYS:
        g, w = got[key].float(), want[key]
        if torch.equal(g, w):
            continue
        for shard, message, hint in _mistakes(key, numel, old_n, new_n, rank):
            if _same(g, shard):
                return f"{key!r}: {message} ({where})", hint
        real = max(0, min(numel - rank * size, size))
        if torch.isnan(g).any():
            return ((f"{key!r} holds NaN: the old ranks' padding ({where}); padding values "
                    f"mean nothing (here NaN), and the new padding must be zeros"),
                    "drop everything past numel before cutting the new shards")
        if torch.equal(g[:real], w[:real]):
            return (f"{key!r}: the elements are right but the padding is not zeros ({where})",
                    "the last rank's shard ends with zeros up to ceil(numel / N)")
        bad = int((g != w).nonzero()[0])
        return ((f"{key!r}: element {bad} of the shard is {g[bad].item():g}, expected "
                f"{w[bad].item():g} ({where})"), "rank r holds elements [r * size, (r + 1) * size)")
    return None


MOMENTS_NOT_RESHARDED = ("the parameters are resharded but Adam's moments (exp_avg, exp_avg_sq) "
                         "are not: reshard the optimizer state with the same offsets")
MOMENTS_HINT = "the same cut for every key of the old shards: for key in old_shards[r]"


def _moments_forgotten(got, want, numel, old_n, rank) -> str | None:
    """What the moments look like when 'param' is right and they are not, else None.
    Note: a learner who cuts every key the same way gets 'param' and the moments wrong together;
    'param' right alone means the moments took another road (zeros, the old shard, nothing)."""
    param = got["param"]
    if not (torch.is_tensor(param) and param.shape == want["param"].shape
            and torch.equal(param.float(), want["param"])):
        return None
    for key in STATES:
        g = got[key]
        if torch.is_tensor(g) and g.shape == want[key].shape and torch.equal(g.float(), want[key]):
            continue
        if not torch.is_tensor(g):
            return f"{key!r} is a {type(g).__name__}, not a shard"
        mine = old_shards(numel, old_n).get(rank, {}).get(key)
        if mine is not None and _same(g.reshape(-1), mine):
            return f"{key!r} is old rank {rank}'s shard, unchanged"
        if g.numel() and not g.float().abs().sum():
            return f"{key!r} is all zeros: Adam would restart its moments"
        if g.numel() != want[key].numel():
            return f"{key!r} has {g.numel()} values, not the {want[key].numel()} of a new shard"
        return f"{key!r} holds other values than new rank {rank}'s slice of the moment"
    return None


def _mistakes(key, numel, old_n, new_n, rank):
    """(the shard it gives, message, hint) for each typical mistake, simulated."""
    size = -(-numel // new_n)
    old = old_shards(numel, old_n)
    by_rank = torch.cat([old[r][key] for r in sorted(old)])
    as_listed = torch.cat([s[key] for s in old.values()])

    def cut(flat, lo):
        flat = torch.cat([flat, torch.zeros(size * (new_n + 5) * 4)])
        return flat[lo:lo + size] if lo >= 0 else None
    real = _wholes(numel)[key]
    yield (cut(as_listed[:numel], rank * size),
           "the old shards were joined in the order they came (as files are listed), not by rank",
           "sort the old ranks (sorted(old_shards)) before joining them")
    yield (cut(as_listed, rank * size), ("the old shards were joined in the order they came, not "
           "by rank, and their padding kept"), "sort the old ranks, then keep only numel elements")
    for shift in (1, -1):
        yield (cut(real, rank * size + shift), (f"off by one: your shard starts at element "
               f"{rank * size + shift}, rank {rank}'s starts at {rank * size}"),
               "rank r holds [r * size, (r + 1) * size), the end excluded")
    other = new_n - 1 - rank
    if other != rank:
        yield (cut(real, other * size), (f"new rank {rank} holds elements [{other * size}, "
               f"{(other + 1) * size}), which are rank {other}'s slice: the new ranks are "
               f"counted from the wrong end"), "new rank r starts at r * size")
    if rank:
        yield (cut(real, rank * size * 4), (f"your shard starts at element {rank * size * 4} = 4 "
               f"x {rank * size}: bytes and elements mixed"), "offsets in elements, not bytes")
    yield (cut(by_rank, rank * size), ("the old ranks' padding (NaN here: its values mean "
           "nothing) was kept inside the unit, so the new shards hold it"),
           "drop everything past numel (the old padding) before cutting the new shards")


def _same(got: torch.Tensor, candidate) -> bool:
    return (candidate is not None and len(candidate) == len(got)
            and torch.equal(torch.nan_to_num(got, nan=-7.5),
                            torch.nan_to_num(candidate.to(got.dtype), nan=-7.5)))


def _wrong_size(key, got, size, numel, old_n, new_n, where):
    old_padded = -(-numel // old_n) * old_n
    if got == size * 4:
        return ((f"{key!r} has {got} values, 4 x the {size} elements a shard holds ({where}): "
                f"bytes and elements mixed (a float32 is 4 bytes)"),
                "count elements (numel()), not bytes (nbytes)")
    if got == numel // new_n:
        return ((f"{key!r} has {got} elements, expected {size} ({where}): {numel} elements do not "
                f"split evenly over {new_n} ranks, so every shard holds ceil({numel}/{new_n}) = "
                f"{size} and the last is padded; equal shards of numel // N lose elements"),
                "size = -(-numel // new_world_size)")
    if got == -(-old_padded // new_n):
        return ((f"{key!r} has {got} elements, expected {size} ({where}): you counted the old "
                f"padding ({old_padded} = {numel} + {old_padded - numel}) as elements"),
                "use numel, not the sum of the old shards' lengths")
    return (f"{key!r} has {got} elements, expected ceil({numel}/{new_n}) = {size} ({where})",
            "each new rank holds ceil(numel / N) elements, padded with zeros")


def files_table(folder) -> list[tuple[str, int]]:
    """(relative path, bytes) of every file under ``folder``, sorted."""
    from pathlib import Path
    root = Path(folder)
    return sorted((str(p.relative_to(root)), p.stat().st_size)
                  for p in root.rglob("*") if p.is_file())
