"""What a watched training run saw, as a checker's observations, and two runs read side by side.

    for name, value, where in observations(seen, world_size):   # start, rows, ledger, update...
        record.see(name, value, **where)
    watch_into(record, train, world_size, 4, whole)   # the same, straight into a record
    ratio(mine, want)           # yours / the reference's (dicts of tensors: the projection)
    scale([(2, 0.5), (4, 0.25)])                      # "1/N of": 1/N at every N
    differs_only_where(d, "update", 4, test)          # the updates differ where test holds

Note: the last three read a divergence of the lab kit's checking engine (``d.pairs``) by duck
typing; they are what the training checks of labs 09 and 11 share.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.distributed as dist

from .watch import Hung, PeerGone, Seen, watch_training


def observations(seen: Seen, world_size: int) -> list:
    """``(observable, value, where)`` of a watched run, for a checker's record: ``start`` (the
    weights the first step started from), per step ``rows`` (on rank 0: the rows every rank's
    model was fed, all ranks together, in words), ``ledger``, ``update`` (what the step
    changed) and ``weights``; ``names`` and ``returned`` (what the function returned). Gathers
    the ranks' rows: every rank calls it."""
    out, last = [], max(seen.weights, default=0)
    rows = _all_ranks(seen.rows, world_size) if seen.batch_rows else None
    for step, weights in sorted(seen.weights.items()):
        if step == 0:
            out.append(("start", weights, {"step": 0}))
            continue
        if rows is not None:
            fed = [i for by_step in rows for forward in by_step.get(step, []) for i in forward]
            out.append(("rows", rows_in_words(fed, seen.batch_rows), {"step": step}))
        if step in seen.collectives:
            out.append(("ledger", seen.collectives[step], {"step": step}))
        before = seen.weights.get(step - 1)
        if isinstance(before, dict) and before.keys() == weights.keys() and all(
                before[k].shape == weights[k].shape for k in weights):
            out.append(("update", {k: weights[k] - before[k] for k in weights}, {"step": step}))
        out.append(("weights", weights, {"step": step}))
    out += [("ledger", v, {"step": k}) for k, v in seen.collectives.items() if k > last]
    got = seen.returned
    names = ", ".join(sorted(map(str, got))) if isinstance(got, dict) else f"a {type(got).__name__}"
    out.append(("names", names, {"step": last}))
    if isinstance(got, dict):
        out.append(("returned", {k: v for k, v in got.items() if isinstance(v, torch.Tensor)},
                    {"step": last}))
    return out


def _all_ranks(mine, world_size: int) -> list:
    if world_size == 1 or not dist.is_initialized():
        return [mine]
    out = [None] * world_size
    dist.all_gather_object(out, mine)
    return out


def rows_in_words(fed: list, total: int) -> str:
    """How often each of a batch's ``total`` rows was fed: "rows 0-5 twice, rows 6-11 never"."""
    counts, by_times = Counter(fed), {}
    for i in range(total):
        by_times.setdefault(counts.get(i, 0), []).append(i)
    said = {0: "never", 1: "once", 2: "twice"}
    parts = [f"row{'s' * (len(rows) > 1)} {_spans(rows)} {said.get(n, f'{n} times')}"
             for n, rows in sorted(by_times.items(), key=lambda kv: (kv[0] == 0, kv[0]))]
    if counts.get(None):
        parts.append(f"{counts[None]} row{'s' * (counts[None] > 1)} not of the step's batch")
    return ", ".join(parts) or "no rows"


def _spans(rows: list) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans = []
    for i in rows:
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def watch_into(record, fn, world_size: int, steps: int, whole=None, patch=(), skip=()) -> Seen:
    """Watch ``fn`` on this rank and write what was seen into a checker's ``record`` (anything
    with ``rank``, ``error`` and ``see(observable, value, **where)``), but ``skip``'s
    observables; ``patch``: ``(object, name, value)`` set while it runs (what the function reads,
    say ``labs.debug_sgd``). A hang becomes the record's error ("a hang", where each rank
    waited); a peer gone records nothing (the peer's own record says why)."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patch]
    for obj, name, value in patch:
        setattr(obj, name, value)
    try:
        seen = watch_training(fn, record.rank, world_size, steps, whole)
    except Hung as hung:
        record.error = ("a hang", str(hung), "")
        return None
    except PeerGone:
        return None
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
    for name, value, where in observations(seen, world_size):
        if name not in skip:
            record.see(name, value, **where)
    return seen


# -- two runs side by side ------------------------------------------------------------------------

def ratio(mine, want, tol: float = 1e-4):
    """Yours / the reference's: 1.0 within ``tol`` (norm-relative), else the projection of yours
    on the reference's (dicts of tensors flattened together); None when not comparable."""
    if not (isinstance(mine, dict) and isinstance(want, dict) and mine.keys() == want.keys()) or \
            any(mine[k].shape != want[k].shape for k in want):
        return None
    m, w = (torch.cat([d[k].double().flatten() for k in sorted(want)]) for d in (mine, want))
    if float((m - w).norm()) <= tol * float(w.norm()):
        return 1.0
    return float(m @ w / (w @ w)) if float(w @ w) > 0 else None


def scale(found: list) -> str:
    """From (N, ratio) pairs: "N/2 times" where the ratio is N/k for one k at every N (1 included:
    the sum divided by a fixed k); at N > 1, "N times" or "1/N of" where the ratio is N or 1/N
    at every N, "0.5x" where it is one number at every N, else ""."""
    every = [(n, r) for n, r in found if r]
    k = every[0][0] / every[0][1] if every else 0
    if len(every) > 2 and len(every) == len(found) and not math.isclose(k, 1, rel_tol=1e-3) and all(
            math.isclose(n / r, k, rel_tol=0.02) for n, r in every):
        return f"N/{k:.3g} times"  # Note: the sum over ranks divided by a fixed k, not by N
    c = every[0][0] * every[0][1] if every else 0
    if len(every) > 2 and len(every) == len(found) and not math.isclose(c, 1, rel_tol=1e-3) and all(
            math.isclose(n * r, c, rel_tol=0.02) for n, r in every):
        return f"{c:.3g}/N times"  # Note: a factor that shrinks as N grows: per-rank counts
    found = [(n, r) for n, r in found if n > 1]
    if len(found) < 2 or any(r is None or math.isclose(r, 1, rel_tol=1e-3) for _, r in found):
        return ""
    for said, k in (("N times", 1), ("1/N of", -1)):
        if all(math.isclose(r, n ** k, rel_tol=0.02) for n, r in found):
            return said
    same = all(math.isclose(r, found[0][1], rel_tol=0.02) for _, r in found)
    return f"{found[0][1]:.3g}x" if same else ""


def differs_only_where(d, observable: str, steps: int, test) -> bool:
    """Rank 0's ``observable`` differs from the reference's (at some step) in exactly the
    configurations ``test`` picks, whatever else differs there."""
    seen = {}
    for step in range(1, steps + 1):
        for c, m, w in d.pairs(observable, step=step, rank=0):
            seen[c] = seen.get(c, False) or (w is not None and ratio(m, w) != 1.0)
    return any(seen.values()) and all(v == bool(test(c)) for c, v in seen.items())
