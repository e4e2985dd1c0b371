"""What the labs' checkers share besides the engine (differential.py): stubs and methods left
unwritten, the checkers' data, a failure's line in the learner's code, the logs of a failed
launch, and for the measurements ``measure_strategies``, the GPT trained under several strategies
on each rank.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import re
import shutil
import statistics
import textwrap
from functools import partial
from pathlib import Path

import torch

from ...launcher import LaunchError
from ...registry import register_strategy
from ...strategy import Strategy
from ...telemetry import Recorder
from .exercise import not_written_yet

GLOBAL_BATCH = 12   # 12 rows split over 1, 2, 3 or 4 ranks


def unwritten(fn) -> bool:
    """A stub: missing, or a body of only ``...`` or ``pass`` (a docstring allowed)."""
    return fn is None or not_written_yet(fn)


def missing_methods(cls, names, base) -> list[str]:
    """The methods ``cls`` still leaves to ``base`` (or to Strategy), or whose body is ``...``.
    A body of ``pass`` is written: the learner decided it does nothing, and the check then says
    what doing nothing breaks (``...`` is how the notebook's stubs read)."""
    return [n for n in names if (unwritten(getattr(cls, n, None)) and not _says_pass(getattr(cls, n)))
            or getattr(cls, n) in (getattr(base, n, None), getattr(Strategy, n, None))]


def _says_pass(fn) -> bool:
    """True when ``fn``'s source (a notebook cell's too) ends its body with ``pass``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = tree.body[0].body if tree.body and hasattr(tree.body[0], "body") else []
    return bool(body) and isinstance(body[-1], ast.Pass)


def rows_for(world_size: int) -> int:
    """How many rows the checkers' global batch has at ``world_size`` ranks: 12 (splits over 1,
    2, 3, 4 and 6 ranks), or the least multiple of 12 that splits over ``world_size``."""
    return math.lcm(GLOBAL_BATCH, world_size)


def batch(step: int, rank: int = 0, world_size: int = 1, rows: int = GLOBAL_BATCH):
    """This rank's rows of the checkers' data: ``rows`` (12) rows of 4 inputs and 3 targets."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(rows, 4, generator=g), torch.randn(rows, 3, generator=g)
    n = rows // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def user_frame(tb: str) -> tuple[str, str] | None:
    """(function, source line) of the last frame of a traceback outside torch and fsdp_mini:
    ``('train', 'loss.backward()')``; None when the traceback has no frame of the user's."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)\n\s*(.*)', tb or "")
    mine = [f for f in frames if "site-packages" not in f[0] and "/fsdp_mini/" not in f[0]]
    return (mine[-1][1], mine[-1][2].strip()) if mine else None


def measure_strategies(rank, world_size, strategies, steps=3, model="tiny", global_batch=4):
    """Train the GPT under each strategy in turn (names, or your classes: registered here), with
    AdamW. Per strategy, this rank's ``sent`` bytes and collective ``calls`` in the last step,
    median step ``seconds``, ``state`` (params + grads + optimizer state after the step, from
    ``track_memory``) with ``by_category`` and the ``peak`` by category, the ``activations``
    autograd saves during a forward (``LiveMemory``), ``expected`` (the formulas) and ``losses``.
    It also writes telemetry, one run per strategy, for a monitor (``Comparison``, ``Dashboard``).
    """
    from ...api import expected_costs, parallelize
    from ...launcher import rank_device
    from ...memory import PERSISTENT
    from ...models import GPTConfig, SyntheticText, make_model
    from ...telemetry import LiveMemory
    from ...training import train
    device = rank_device()
    cfg = GPTConfig.sized(model)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)

    def batches(step):
        return tuple(t.to(device) for t in data.local_batch(step, global_batch, rank, world_size))

    out = {}
    for strategy in strategies:
        if isinstance(strategy, type):
            strategy = register_strategy(strategy).strategy
        rec = Recorder.from_env(run=strategy)
        net = make_model(cfg).to(device)
        net, opt = parallelize(net, strategy, units=list(net.blocks), recorder=rec,
                               optimizer=partial(torch.optim.AdamW, lr=1e-3))
        run = train(net, opt, batches, steps, recorder=rec, track_memory_at=steps - 1)
        rec.close()
        ledger = net.fsdp_mini.comm.ledger
        calls = len(ledger.select(step=ledger.steps()[-1]))  # the last training step's
        after = next(s.by_category for s in run.memory.snapshots if s.label == "after_step")
        live = LiveMemory(net, opt)
        with live:  # Note: one more forward, to read what autograd keeps for backward
            loss = net(*batches(0))[1]
            activations = live.sample()[1]["activations"]
        loss.backward()
        opt.zero_grad()
        out[strategy] = {
            "sent": run.sent_bytes[-1], "calls": calls,
            "seconds": statistics.median(run.step_seconds[1:-1] or run.step_seconds),
            "state": sum(after[c] for c in PERSISTENT), "by_category": after,
            "peak": run.memory.peak_by_category, "activations": activations,
            "expected": expected_costs(net), "losses": run.losses}
    return out


def forget_logs(err: LaunchError) -> None:
    """Remove the logs ``launch`` keeps after a failure: the checker's ✘ line says what a learner
    needs, and a checker leaves no folder behind."""
    folder = getattr(err, "log_dir", None)
    if folder and Path(folder).name.startswith("fsdp_mini_launch_"):  # Note: a temporary one
        shutil.rmtree(folder, ignore_errors=True)                     # only, never a log_dir


def user_line(tb) -> str:
    """"`the line` in function" of the learner's own frame in a traceback; "" if none."""
    frame = user_frame(tb)
    return f"`{frame[1]}` in {frame[0]}" if frame else ""


def rank_lines(err: LaunchError) -> dict[int, str]:
    """Where each rank was in your code when the launch failed, from the logs ``launch`` keeps
    (then removed), to follow "rank r was at": ``{0: "`loss.backward()` in train", 1: ...}``.
    The first rank named is not always where the bug is: a hang shows where ranks *waited*."""
    found = {}
    folder = getattr(err, "log_dir", None)
    for path in sorted(Path(folder).glob("rank*.error")) if folder else []:
        try:
            tb = json.loads(path.read_text()).get("traceback")
            found[int(path.stem[4:])] = user_line(tb) or "a line outside your code"
        except (ValueError, OSError):
            continue
    forget_logs(err)
    return dict(sorted(found.items()))


def relative_difference(a: dict, b: dict) -> float:
    """The largest norm-relative difference of a tensor of ``a`` from ``b``'s."""
    if set(a) != set(b) or any(a[k].shape != b[k].shape for k in b):
        return float("inf")
    return max(float((a[k].double() - b[k].double()).norm() / (b[k].double().norm() + 1e-12))
               for k in b)
