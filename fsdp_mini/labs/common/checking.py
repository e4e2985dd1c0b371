"""What the labs' checkers share: a small net and its data, training it step by step,
running the learner's code on ranks (a failure becomes one ✘ line), and comparing the ranks'
states with one another and with one process trained on the whole batch. For the measurements:
``measure_strategies``, the GPT trained under several strategies on each rank.

Note: SGD with momentum beside AdamW, because AdamW divides each update by the gradient's own size
and so hides a gradient that is N times too large.
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
from torch import nn

from ...launcher import LaunchError, LaunchTimeoutError, launch
from ...registry import register_strategy
from ...strategy import Strategy
from ...telemetry import Recorder
from .exercise import not_written_yet
from .report import CheckResult

OPTIMIZERS = {"SGD+momentum": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
              "AdamW": partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1)}
STEPS, GLOBAL_BATCH = 3, 12   # 12 rows split over 1, 2, 3 or 4 ranks
CHECK_TIMEOUT = 20            # seconds a checker's collective may wait (a skipped one hangs)


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


def make_mlp() -> nn.Module:
    """4 → 7 → 3: 59 parameters, so the flat buffer needs padding at N = 2, 3 and 4."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 3))


def train_states(model, optimizer, rank=0, world_size=1, rows=GLOBAL_BATCH, tracked=None) -> list[dict]:
    """Train ``STEPS`` steps on the checkers' data; the whole state after each step.

    ``tracked``: a list; the last step then runs under ``track_memory`` (appended to it, marked
    ``after_step`` after the update), the steps before with no tracker, as ``training.train``
    with ``track_memory_at`` runs them in the labs' later cells. Note: the tracker's dispatch
    mode hides some autograd errors (writing a view made under no_grad), so a check must not run
    every step under it."""
    from ...api import full_state_dict
    from ...memory import track_memory
    states = []
    for step in range(STEPS):
        x, y = batch(step, rank, world_size, rows)
        if tracked is not None and step == STEPS - 1:
            with track_memory(model, optimizer) as mem:
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                mem.mark("after_step")
                optimizer.zero_grad()
            tracked.append(mem)
        else:
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        states.append(full_state_dict(model))
    return states


def reference(make=make_mlp, rows=GLOBAL_BATCH) -> dict[str, list[dict]]:
    """One process trained on the whole batch, with each optimizer: the answer to match."""
    return {name: train_states(m, factory(m.parameters()), rows=rows)
            for name, factory in OPTIMIZERS.items() for m in [make()]}


def run_ranks(result: CheckResult, fn, world_size: int, *args, explain=None):
    """``launch`` for a checker: a failure becomes one ✘ line, never a long traceback.
    ``explain(message, frame)``: the lab's sentence naming the mistake behind an error, or None."""
    try:
        return launch(fn, world_size, *args, backend="gloo", timeout=CHECK_TIMEOUT, deadline=180)
    except LaunchTimeoutError as e:
        forget_logs(e)
        result.wrong(str(e).splitlines()[0][:400], hint="a rank waits in a collective another rank "
                     "never issued: every rank must call the same collectives in the same order")
    except LaunchError as e:
        forget_logs(e)
        kind = str(e.exc_type).rsplit(".", 1)[-1]
        named = explain(e.message or "", user_frame(e.traceback)) if explain else None
        result.wrong((f"{named} (rank {e.rank} raised {kind}" + where(e.traceback) + ")") if named
                     else f"rank {e.rank} raised {kind}: {(e.message or '').strip()[:500]}"
                     + where(e.traceback), hint="is a collective under an `if` on the rank?"
                     if kind == "CollectiveMismatchError" else "")
    return None


def where(tb: str) -> str:
    """`` (in f: `line`)`` for the last frame of a traceback outside torch and fsdp_mini."""
    frame = user_frame(tb)
    return f" (in {frame[0]}: `{frame[1]}`)" if frame else ""


def user_frame(tb: str) -> tuple[str, str] | None:
    """(function, source line) of the last frame of a traceback outside torch and fsdp_mini:
    ``('train', 'loss.backward()')``; None when the traceback has no frame of the user's."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)\n\s*(.*)', tb or "")
    mine = [f for f in frames if "site-packages" not in f[0] and "/fsdp_mini/" not in f[0]]
    return (mine[-1][1], mine[-1][2].strip()) if mine else None


def compare_states(result, label, runs, ref, init, tol=1e-5, guess=True) -> bool:
    """✔/✘ lines: do the ranks agree with one another, and with the reference, step by step?
    ``guess``: say what the size of the first update suggests (N times too large, or too small);
    False where the checker knows the gradients were not reduced at all."""
    for step, state in enumerate(runs[0]):
        for r, other in enumerate(runs[1:], start=1):
            diff = {k: (v - state[k]).abs().max().item() for k, v in other[step].items()}
            name = max(diff, key=diff.get)
            if diff[name] > 0:
                result.wrong(f"{label}: after step {step + 1}, rank {r}'s {name!r} differs from "
                             f"rank 0's by up to {diff[name]:.3g}: the ranks drift apart",
                             hint="after the optimizer step every rank must get every rank's "
                                  "updated slice (an all-gather)")
                return False
    worst = max(((runs[0][s][k] - v).abs().max().item() / (v.abs().max().item() + 1e-3), k, s + 1)
                for s, state in enumerate(ref) for k, v in state.items())
    if worst[0] <= tol:
        result.ok(f"{label}: {len(runs)} ranks train like one process on the whole batch "
                  f"({len(ref)} steps, largest relative difference {worst[0]:.1e})")
        return True
    keys = list(ref[0])
    mine, want = (torch.cat([(s[k] - init[k]).flatten() for k in keys]) for s in (runs[0][0], ref[0]))
    ratio, n = float(mine @ want / (want @ want)), len(runs)
    why = (f": the first update is {ratio:.2f}x the single-process one, gradients {n}x too large. "
           f"Did you divide the sum over ranks by the world size? (AdamW hides it: it divides "
           f"each update by the gradient's own size)" if abs(ratio - n) < 0.05 * n else
           f": the first update is {ratio:.2f}x too small: did you divide twice?"
           if abs(ratio * n - 1) < 0.05 else "") if guess else ""
    result.wrong(f"{label}: {worst[1]!r} differs from one-process training by {worst[0]:.2g} "
                 f"(relative) after step {worst[2]}" + why)
    return False


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


def explain_failure(result, err, timeout, hang_hint, raise_hint=None) -> CheckResult:
    """A ✘ line for a rank that raised or hung: what a learner needs, not the traceback."""
    if isinstance(err, LaunchTimeoutError):
        return result.wrong(f"the ranks did not finish: rank {err.rank} waited {timeout:g} s for "
                            f"a message or collective that never came", hint=hang_hint)
    message = re.sub(r"\s+", " ", str(err.message)).strip()[:400]
    kind = "" if str(err.exc_type).endswith("ExerciseRaised") else f"{err.exc_type}: "
    return result.wrong(f"your code raised on rank {err.rank}: {kind}{message}",
                        hint=raise_hint or "the line above says which; fix it and run it again")


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
