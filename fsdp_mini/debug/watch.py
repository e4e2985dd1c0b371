"""A training function watched from outside, on each rank: what its model was fed, the weights
after every step, the step's collectives, what it printed; and, when it hangs, where each rank
waited. The function is not changed: the watch hooks every module's forward and every
optimizer's step (torch's global hooks) while it runs::

    seen = watch_training(train, rank, world_size, 4, whole=lambda step: batch(step)[0])
    seen.rows[1]          # step 1: per forward of the model, the rows of the step's batch it got
    seen.weights[0]       # the whole weights before the first step (then after each step)
    seen.collectives[1]   # step 1's collectives (op, payload bytes, group) of a parallelized model
    seen.printed          # what it printed; seen.returned: what it returned

    run_watched(train, rank, world_size, 4)   # a rank that returns waits for its peers; if one
    # does not return within ``patience`` seconds, Hung names it and where it waited:
    # "rank 0 waited in all_gather_into_tensor, at `weights = full_state_dict(model)` (train_2,
    #  line 12), in step 1; rank 1 had returned after 4 steps"

A rank that waits posts where it is (the innermost frame of its main thread, and the line of the
caller's own code that led there) in the process group's store; the ranks that returned read it.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import linecache
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from .cluster_tools import is_library

_ITEMS = itertools.count()   # Note: every rank watches the same calls in the same order
STILL_S = 0.5                # a main thread on one line this long is taken to be waiting


class PeerGone(RuntimeError):
    """A peer ended (its process gone) while this rank waited for it in a collective: the peer's
    own error, or the rank that returned and named the hang, says more than this one."""


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


class Hung(RuntimeError):
    """Some ranks did not return while others had: ``ranks`` and where each waited (``places``)."""

    def __init__(self, ranks: list, places: dict, text: str):
        super().__init__(text)
        self.ranks, self.places = ranks, places


@dataclass
class Seen:
    rows: dict = field(default_factory=dict)          # step -> [row indices of each forward]
    weights: dict = field(default_factory=dict)       # step -> whole weights (0: before step 1)
    collectives: dict = field(default_factory=dict)   # step -> ((op, payload, group), ...)
    printed: str = ""
    returned: object = None
    step: int = 1                                     # the step under way
    batch_rows: int = 0                               # rows of a step's whole batch
    root: object = None                               # the model last called from outside
    _depth: int = 0
    _ours: list = field(default_factory=list)         # ledger spans of the watch's own gathers


def watch_training(fn, rank: int, world_size: int, steps: int, whole=None, patience=3.0) -> Seen:
    """``fn(rank, world_size, steps)`` watched (see the module's docstring). ``whole(step)``, with
    step counted from 0, is the step's whole input batch: rows fed are named by their index in
    it (None: not a row of it)."""
    seen = Seen()
    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(
                 lambda m, args: _forward(seen, m, args, whole)),
             torch.nn.modules.module.register_module_forward_hook(
                 lambda m, args, out: setattr(seen, "_depth", seen._depth - 1)),
             register_optimizer_step_pre_hook(
                 lambda opt, a, k: _starting(seen, opt)),
             register_optimizer_step_post_hook(
                 lambda opt, a, k: _stepped(seen, opt))]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            seen.returned = run_watched(fn, rank, world_size, steps, patience=patience,
                                        step=lambda: seen.step)
    finally:
        for h in hooks:
            h.remove()
        seen.printed = out.getvalue()
    seen.collectives = _collectives(seen)
    return seen


def _forward(seen: Seen, module, args, whole) -> None:
    if seen._depth == 0 and args and isinstance(args[0], torch.Tensor):
        seen.root = module
        x = args[0].detach()
        batch = whole(seen.step - 1) if whole else None
        seen.batch_rows = len(batch) if batch is not None else 0
        rows = x.reshape(-1, batch.shape[-1]) if batch is not None and x.shape[-1:] == \
            batch.shape[-1:] else []
        seen.rows.setdefault(seen.step, []).append(
            [next((i for i in range(len(batch)) if torch.equal(r, batch[i])), None) for r in rows])
    seen._depth += 1


def _starting(seen: Seen, opt) -> None:
    if seen.step == 1 and 0 not in seen.weights:
        seen.weights[0] = _gather(seen, opt)


def _stepped(seen: Seen, opt) -> None:
    seen.weights[seen.step] = _gather(seen, opt)
    seen.step += 1


def _gather(seen: Seen, opt) -> dict:
    """The whole weights: the model's (gathered under a sharding strategy: every rank steps, so
    every rank gathers), else the optimizer's parameters by place."""
    from ..api import full_state_dict
    if seen.root is None:
        return {f"#{i}": p.detach().clone() for i, p in
                enumerate(p for g in opt.param_groups for p in g["params"])}
    ledger = _ledger(seen.root)
    start = len(ledger.records) if ledger else 0
    state = full_state_dict(seen.root)
    if ledger:
        seen._ours.append((start, len(ledger.records)))
    return dict(state)


def _ledger(model):
    engine = getattr(model, "fsdp_mini", None)
    return engine.comm.ledger if engine is not None else None


def _collectives(seen: Seen) -> dict:
    """Per step (1, 2, ... in the ledger's order), the collectives the function made."""
    ledger = _ledger(seen.root) if seen.root is not None else None
    if ledger is None:
        return {}
    ours = {i for a, b in seen._ours for i in range(a, b)}
    by_step = {}
    for i, r in enumerate(ledger.records):
        if i not in ours:
            by_step.setdefault(r.step, []).append((r.op, r.payload_bytes, r.group))
    return {k: tuple(sorted(v)) for k, v in zip(itertools.count(1), by_step.values())}


# -- a hang, named --------------------------------------------------------------------------------

def run_watched(fn, rank: int, world_size: int, *args, patience: float = 3.0,
                step=lambda: None):
    """``fn(rank, world_size, *args)``; then wait for every rank to return, at most ``patience``
    seconds (or 5x this rank's own time): :class:`Hung` if some did not, and also when this rank's
    collective timed out (no rank returned: each waited for another). ``step()``: the step under
    way, said with where a rank waited."""
    store = dist.distributed_c10d._get_default_store() if dist.is_initialized() and \
        world_size > 1 else None
    if store is None:
        return fn(rank, world_size, *args)
    key, done = f"fsdp_mini_watch/{next(_ITEMS)}", threading.Event()
    poster = threading.Thread(target=_post_where, daemon=True, args=(
        store, f"{key}/where/{rank}", threading.main_thread().ident, done, step))
    poster.start()
    started, out = time.perf_counter(), None
    try:
        out = fn(rank, world_size, *args)
        ended = str(step() or "")
    except RuntimeError as e:
        if any(words in str(e) for words in PEER_GONE):
            raise PeerGone(str(e)) from e
        if "Timed out waiting" not in str(e):
            raise
        ended, patience = "timed out", 1.0   # Note: the others time out about now too
    finally:
        done.set()
    store.set(f"{key}/done/{rank}", ended)
    try:
        store.wait([f"{key}/done/{r}" for r in range(world_size)],
                   timedelta(seconds=max(patience, 5 * (time.perf_counter() - started))))
    except RuntimeError:  # noqa: PERF203  (the store's timeout: some rank never returned)
        pass
    states = {r: store.get(f"{key}/done/{r}").decode() if store.check([f"{key}/done/{r}"])
              else "timed out" for r in range(world_size)}
    late = [r for r, s in states.items() if s == "timed out"]
    if late:
        places = {r: store.get(f"{key}/where/{r}").decode() if store.check(
            [f"{key}/where/{r}"]) else "in a place it never posted" for r in late}
        raise Hung(late, places, "; ".join(
            f"rank {r} waited {places[r]}" if r in late else f"rank {r} had returned" +
            (f" after {int(s) - 1} steps" if s else "") for r, s in states.items())) from None
    return out


def _post_where(store, key: str, main: int, done: threading.Event, step) -> None:
    """While the main thread runs, post where it is once it has stood still for STILL_S."""
    last, since, posted = None, time.monotonic(), None
    while not done.wait(0.1):
        frame = sys._current_frames().get(main)
        here = (id(frame.f_code), frame.f_lineno) if frame else None
        if here != last:
            last, since = here, time.monotonic()
        elif frame is not None and time.monotonic() - since >= STILL_S:
            where = place(frame, step())
            if where != posted:
                store.set(key, where)
                posted = where


def place(frame, step=None) -> str:
    """"in all_gather, at `norm = ...` (train, line 12), in step 2": the collective ``frame``'s
    stack is in (the kit's comm op, else torch's, else the innermost function), the caller's own
    line that led there, and the step."""
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    ops = [f.f_code.co_name for f in stack if f.f_code.co_filename.endswith(_COMM_FILES)
           and f.f_code.co_name.startswith(_COLLECTIVES)]
    mine = next((f for f in stack if not is_library(f.f_code.co_filename)), None)
    op = ops[-1] if ops else stack[0].f_code.co_name
    text = "in the wait for an asynchronous collective" if op == "wait" else f"in {op}"
    if mine is not None:
        source = linecache.getline(mine.f_code.co_filename, mine.f_lineno).strip()
        text += (f", at `{source}`" if source else "") + \
            f" ({mine.f_code.co_name}, line {mine.f_lineno})"
    return text + (f", in step {step}" if step else "")


_COMM_FILES = (os.path.join("comm", "collectives.py"), "distributed_c10d.py")
_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "send",
                "recv", "all_to_all", "gather", "scatter", "reduce", "wait")
