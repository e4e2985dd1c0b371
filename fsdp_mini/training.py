"""One training loop for the whole kit: the main job, the ready-made jobs, the tests, the
benchmarks and the labs all train through :func:`train_step` (and :func:`train` around it).

    result = train(model, optimizer, lambda step: data.local_batch(step, 8, rank, world_size),
                   steps=5)
    result.losses, result.step_seconds, result.sent_bytes   # per step

    times = train_in_turns({"ddp": (net1, opt1), "fsdp": (net2, opt2)}, batches, steps=4)
    median_of_slowest([r["fsdp"]["seconds"] for r in per_rank])   # over the ranks' results

It is the loop of plain PyTorch: forward, backward (once per micro-batch), ``optimizer.step()``,
``optimizer.zero_grad()``. Nothing in it knows the strategy; that is the point.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from .memory import MemoryTracker, track_memory


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of ``model(x, y)``: the models of the kit return ``(output, loss)`` or the loss."""
    out = model(x, y)
    return out[1] if isinstance(out, (tuple, list)) else out


def train_step(model, optimizer, batch, micro_batches: int = 1,
               memory: MemoryTracker | None = None) -> float:
    """One step on ``batch = (x, y)``, cut into ``micro_batches`` whose gradients accumulate;
    returns the loss (the mean over micro-batches). With ``memory`` (a tracker), the model
    state is marked ``"after_step"`` between the update and ``zero_grad()``, where it is whole."""
    x, y = batch
    total = torch.zeros(())
    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        loss = loss_of(model, xm, ym)
        (loss / micro_batches).backward()
        total = total + loss.detach().cpu() / micro_batches
    optimizer.step()
    if memory is not None:
        memory.mark("after_step")
    optimizer.zero_grad()
    return total.item()


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    sent_bytes: list[float] = field(default_factory=list)  # this rank, per step (the ledger's)
    memory: MemoryTracker | None = None                    # of the step given as track_memory_at


def train(model, optimizer, batches: Callable[[int], tuple], steps: int, *,
          micro_batches: int = 1, recorder=None, track_memory_at: int | None = None
          ) -> TrainResult:
    """``steps`` training steps on ``batches(step)``; per step: the loss, the seconds (the GPU
    waited for), the bytes this rank sent. ``recorder``: a telemetry Recorder told each step's
    end. ``track_memory_at``: the step to run under :func:`~fsdp_mini.track_memory`."""
    engine = getattr(model, "fsdp_mini", None)
    ledger = engine.comm.ledger if engine is not None else None
    if ledger is not None and ledger.select(step=ledger.step):
        ledger.next_step()  # the collectives of wrapping (or of an earlier loop) stay apart
    result = TrainResult()
    for step in range(steps):
        batch = batches(step)
        start = time.perf_counter()
        if step == track_memory_at:
            with track_memory(model, optimizer) as mem:
                loss = train_step(model, optimizer, batch, micro_batches, mem)
            result.memory = mem
        else:
            loss = train_step(model, optimizer, batch, micro_batches)
        _wait_for_device(batch[0])
        result.step_seconds.append(time.perf_counter() - start)
        result.losses.append(loss)
        result.sent_bytes.append(ledger.sent_bytes(step=ledger.step) if ledger else 0.0)
        if recorder is not None:
            recorder.step_end(loss)
    return result


def train_in_turns(models: dict, batches: Callable[[int], tuple], steps: int,
                   warmup: int = 1) -> dict:
    """Train several ``{name: (model, optimizer)}`` side by side on the same ``batches(step)``,
    timed, each under a parallel strategy on this rank. Per name: ``seconds`` of each step after
    the first ``warmup``, ``blocked`` (the part of it spent waiting for collectives, from each
    wait to its end, as the ledger saw it), ``compute`` (the rest) and ``records``: the last
    step's collectives, as dicts of ledger records.

    Note: the models take turns step by step (step k starts with the k-th, mod their number),
    so that a slow spell of the machine falls on all of them alike; before each model's step
    the ranks meet at a barrier (torch's own, not through any simulated link), so that every
    step starts together on every rank.
    """
    out = {name: {"seconds": [], "blocked": [], "compute": []} for name in models}
    names = list(models)
    for step in range(steps):
        batch = batches(step)
        for name in names[step % len(names):] + names[:step % len(names)]:
            model, optimizer = models[name]
            dist.barrier()
            start = time.perf_counter()
            train_step(model, optimizer, batch)
            _wait_for_device(batch[0])
            seconds = time.perf_counter() - start
            if step >= warmup:
                blocked = _blocked_seconds(model.fsdp_mini.comm.ledger)
                out[name]["seconds"].append(seconds)
                out[name]["blocked"].append(blocked)
                out[name]["compute"].append(seconds - blocked)
    for name, (model, _) in models.items():
        ledger = model.fsdp_mini.comm.ledger
        out[name]["records"] = [vars(r).copy() for r in ledger.select(ledger.step)
                                if r.op != "barrier"]
    return out


def median_of_slowest(per_rank: list[list[float]]) -> float:
    """The median over steps of the slowest rank's figure: a step ends when its last rank does.

    >>> median_of_slowest([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]])   # steps' slowest: 3, 5, 2.5
    3.0
    """
    return statistics.median(max(step) for step in zip(*per_rank))


def _blocked_seconds(ledger) -> float:
    """Seconds this rank's last step spent waiting for its collectives (each from its wait to
    its end: a collective that finished before its wait cost nothing)."""
    return sum(r.seconds - r.waited for r in ledger.select(ledger.step))


def _wait_for_device(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)
