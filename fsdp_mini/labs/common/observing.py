"""What the multi-rank checks observe of a training run, and the small nets they train.

    net, batch = small_net("padding"), batches_for("padding")   # rank r's rows of each step
    observe_training(record, net, optimizer, batch, steps=4)     # start, loss, grads, ledger, weights
    observe_memory(record, net, optimizer, batch, steps=4)       # memory by category, per step

The nets are chosen from what the lessons' invariants depend on: a size that N does not divide
(``mlp``: 59 parameters), a net whose last rank holds only padding at N = 4 (``padding``: 9
parameters, shards of 3), two layers of equal size (``twins``), and the lab's own GPT last.
Each rank builds its net with its own seed, so a strategy must broadcast rank 0's weights; the
data is the same global batch on every world size, each rank taking its own rows.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

OPTIMIZERS = {"SGD+momentum": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
              "AdamW": partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1)}
ROWS = 12  # the global batch: splits over 1, 2, 3 and 4 ranks
NETS = {"mlp": (4, 7, 3), "padding": (2, 2, 1), "twins": (4, 4, 4, 3)}  # widths, layer by layer


def small_net(kind: str, seed: int = 0) -> nn.Sequential:
    """Linear layers of ``NETS[kind]``'s widths with tanh between them, initialised by ``seed``."""
    widths = NETS[kind]
    layers = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def batches_for(kind: str, rank: int = 0, world_size: int = 1, rows: int = ROWS):
    """``batch(step) -> (x, y)``: this rank's rows of the step's global batch for ``kind``."""
    widths = NETS[kind]

    def batch(step: int):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(rows, widths[0], generator=g), torch.randn(rows, widths[-1], generator=g)
        n = rows // world_size
        return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
    return batch


def units_of(net: nn.Sequential) -> list[nn.Module]:
    """The Linear layers of a small net: one unit each under fsdp."""
    return [m for m in net if isinstance(m, nn.Linear)]


def ledger_of(net):
    engine = getattr(net, "fsdp_mini", None)
    return engine.comm.ledger if engine is not None else None


def mse(net, x, y):
    return nn.functional.mse_loss(net(x), y)


def training_run(kind: str, rank: int, world_size: int, dtype: str = "float32"):
    """(net, batch, loss) of ``kind``: a small net (:data:`NETS`) or a GPT preset of the labs
    (``"tiny"``...), rank ``rank``'s net with its own seed and its rows of each step's batch;
    a small net's parameters and data in ``dtype`` (``"bfloat16"``: buffers made without the
    parameters' dtype show)."""
    if kind in NETS:
        to = getattr(torch, dtype)
        rows = batches_for(kind, rank, world_size)
        return (small_net(kind, rank).to(to),
                lambda step: tuple(t.to(to) for t in rows(step)), mse)
    from ...models import GPTConfig, SyntheticText, make_model
    gpt = GPTConfig.sized(kind)
    data = SyntheticText(gpt.vocab_size, gpt.block_size)
    return (make_model(gpt, seed=rank),
            lambda step: data.local_batch(step, 4 * world_size, rank, world_size),
            lambda net, x, y: net(x, y)[1])


def runs_of(cfg, rank: int):
    """(memory, net, batch, loss) for each run a strategy check makes of ``cfg`` on ``rank``:
    one observing training, then, with AdamW (the optimizer whose state is the memory to see),
    one observing memory (``memory`` True). Note: two runs, because the memory tracker's
    dispatch mode must not sit under the run that checks the values."""
    for memory in (False, True)[:1 + (cfg["optimizer"] != "SGD+momentum")]:
        yield (memory, *training_run(cfg["net"], rank, cfg["world_size"], cfg["dtype"]))


def observe_training(record, net, optimizer, batch, steps: int, loss=mse,
                     each_step=lambda step: None) -> None:
    """Train ``steps`` steps; record what wrapping sent (the ledger at step 0), the start, and
    per step the loss, the weights once backward
    is over (only the optimizer may change them), the gradients the optimizer is about to apply,
    the step's collectives and every whole weight after the step."""
    from ...api import full_state_dict
    ledger = ledger_of(net)
    if ledger is not None and net.fsdp_mini.comm.world_size > 1:  # Note: what wrapping sent
        # (rank 0's weights to every rank; on one rank there is no one to send to)
        record.see("ledger", tuple(sorted((r.op, r.payload_bytes, r.group)
                                          for r in ledger.records)), step=0)
    record.see("start", full_state_dict(net), step=0)
    for step in range(1, steps + 1):
        each_step(step)
        x, y = batch(step)
        mark = _Marks(ledger)
        value = loss(net, x, y)
        record.see("loss", value.item(), step=step)
        value.backward()
        grads = _grads(net, optimizer)
        mark.pause()  # Note: full_state_dict's own gathers are not the step's
        record.see("backward_weights", full_state_dict(net), step=step)
        mark.resume()
        record.see("grads", grads, step=step)
        optimizer.step()
        if ledger is not None:
            record.see("ledger", mark.collectives(), step=step)
        optimizer.zero_grad()
        record.see("weights", full_state_dict(net), step=step)


def _grads(net, optimizer) -> dict:
    """The gradients the optimizer is about to apply, by the parameter's name where the module
    has it (``'0.weight'``), else by its place in the optimizer (``'#3'``)."""
    names = {id(p): n for n, p in net.named_parameters()}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return {names.get(id(p), f"#{i}"): None if p.grad is None else p.grad.clone()
            for i, p in enumerate(params)}


class _Marks:
    """The records a step added to the ledger, less those made while paused."""

    def __init__(self, ledger):
        self.ledger, self.spans = ledger, [[len(ledger.records) if ledger else 0, None]]

    def pause(self):
        self.spans[-1][1] = len(self.ledger.records) if self.ledger else 0

    def resume(self):
        self.spans.append([len(self.ledger.records) if self.ledger else 0, None])

    def collectives(self) -> tuple:
        self.pause()
        return tuple(sorted((r.op, r.payload_bytes, r.group) for a, b in self.spans
                            for r in self.ledger.records[a:b]))


def observe_memory(record, net, optimizer, batch, steps: int, loss=mse,
                   before_zero_grad: bool = False, also: dict | None = None) -> None:
    """Train ``steps`` steps under ``track_memory``; record per step the bytes at the step's
    peak, and by category what is still alive once it is over (kept references show there):
    after ``zero_grad`` ("alive"), or with ``before_zero_grad`` once the update is done (a sharded
    strategy's gradient shards still there: "alive") and after ``zero_grad`` ("between steps"). ``also``: {observable: fn(tracker)}, each recorded
    per step too. Note: the peak as one number: which category a tensor counts in is settled
    when the tracker next looks, so a breakdown *at* the peak moves with the backend's timing;
    the total does not."""
    from ...memory import track_memory
    with track_memory(net, optimizer) as mem:
        for step in range(1, steps + 1):
            mem.reset_peak()
            loss(net, *batch(step)).backward()   # Note: the batch is not kept alive here
            optimizer.step()
            if before_zero_grad:
                record.see("alive", settled(mem), step=step)
            optimizer.zero_grad()
            record.see("peak", mem.own_peak_bytes, step=step)
            # Note: between two steps, after zero_grad, nothing of a step's gradients is left
            record.see("between steps" if before_zero_grad else "alive", settled(mem), step=step)
            for name, read in (also or {}).items():
                record.see(name, read(mem), step=step)


def settled(mem) -> dict:
    """What stays alive, once the backend has let go of what it sent: gloo's worker thread drops
    its reference to a finished collective's tensor a moment after wait() returns, so a tensor
    that is already garbage may still count. The least of a few reads 5 ms apart: a tensor kept
    by the code stays in every read; one the backend was about to drop does not."""
    import time
    reads = []
    for _ in range(3):
        reads.append(mem.category_bytes())
        time.sleep(0.003)
    return {c: min(r[c] for r in reads) for c in reads[0]}
