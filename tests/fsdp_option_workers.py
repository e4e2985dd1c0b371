"""What the prefetch and activation-checkpointing tests run on every rank."""

from __future__ import annotations

import warnings
from functools import partial

import torch
from torch import nn
from workers import StateHeavy, gpt_batch

import fsdp_mini
from fsdp_mini import training
from fsdp_mini.comm.collectives import Ledger
from fsdp_mini.models import GPTConfig, make_model


def _gpt(seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make_model(GPTConfig.tiny())


class GatherCounter:
    """A recorder: at each unit's ``gathered`` mark, the all-gathers issued so far this step."""

    def __init__(self, ledger: Ledger):
        self.ledger, self.seen = ledger, {}

    def mark(self, label) -> None:
        if getattr(label, "phase", "") == "gathered":
            step = self.ledger.step
            gathers = [r.unit for r in self.ledger.select(step, "all_gather")]
            self.seen[(step, label.unit)] = gathers


def issue_order(rank: int, world_size: int, prefetch):
    """Per step and unit: which all-gathers were already issued when the unit was ready."""
    ledger = Ledger()
    counter = GatherCounter(ledger)
    model = _gpt()
    model, opt = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks), ledger=ledger,
                                       recorder=counter, prefetch=prefetch)
    training.train(model, opt, lambda s: gpt_batch(s, rank, world_size), 2)
    backward = [f"{r.unit}/{r.phase}" for r in ledger.select(2)
                if r.phase in ("backward", "grad")]
    overlapped = sorted({f"{r.unit}/{r.phase}" for r in ledger.select(2, "all_gather")
                         if r.waited > 0})  # issued, then computed, then waited for
    return {**counter.seen, "backward": backward, "overlapped": overlapped}


def gathered_peak(rank: int, world_size: int, prefetch, depth: int = 4, width: int = 128):
    """Peak bytes of gathered parameters in one step, and one unit's gathered bytes."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = StateHeavy(width, depth)
    model, opt = fsdp_mini.parallelize(model, "fsdp", units=list(model.layers), prefetch=prefetch)
    x = torch.randn(4, width)
    model(x).backward()  # the first step learns the order
    opt.step()
    opt.zero_grad()
    with fsdp_mini.track_memory(model, opt) as mem:
        model(x).backward()
        opt.step()
        opt.zero_grad()
    units = model.fsdp_mini.units
    return {"gathered_peak": mem.peak_by_category["gathered_params"],
            "unit": units[0].padded_bytes, "root": units[-1].padded_bytes,
            "sent": model.fsdp_mini.comm.ledger.sent_bytes(model.fsdp_mini.comm.ledger.step),
            "expected": fsdp_mini.expected_costs(model)["sent_bytes_per_step"]}


class Shuffled(nn.Module):
    """Runs its blocks in an order that changes from step to step (the same on every rank)."""

    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 1)
        self.step = 0

    def forward(self, x, y):
        order = list(range(len(self.blocks)))
        if self.step % 2:
            order = order[::-1][:-1]  # reversed, and the first block skipped
        self.step += 1
        for i in order:
            x = torch.tanh(self.blocks[i](x))
        out = self.head(x)
        return out, ((out - y) ** 2).mean()


def _shuffled_batch(step, rank, world_size, global_batch=8, width=16):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(global_batch, width, generator=g), torch.randn(global_batch, 1, generator=g)
    n = global_batch // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def changing_order(rank: int, world_size: int, options: dict, steps: int = 4):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Shuffled()
    model, opt = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                       optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                                       **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training.train(model, opt, lambda s: _shuffled_batch(s, rank, world_size), steps)
    return {"state": {k: v.clone() for k, v in fsdp_mini.full_state_dict(model).items()},
            "warnings": [str(w.message) for w in caught]}


def changing_order_reference(steps: int = 4):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Shuffled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    training.train(model, opt, lambda s: _shuffled_batch(s, 0, 1), steps)
    return {k: v for k, v in model.state_dict().items()}


def activation_memory(rank: int, world_size: int, checkpointing: bool):
    """Peak activation bytes and bytes sent in one GPT step, with or without checkpointing."""
    model = _gpt()
    model, opt = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                       activation_checkpointing=checkpointing)
    batch = lambda s: gpt_batch(s, rank, world_size)  # noqa: E731
    training.train(model, opt, batch, 1)
    ledger = model.fsdp_mini.comm.ledger
    with fsdp_mini.track_memory(model, opt) as mem:
        training.train(model, opt, batch, 1)
    return {"activations": mem.peak_by_category["activations"], "peak": mem.own_peak_bytes,
            "sent": ledger.sent_bytes(ledger.step),
            "expected": fsdp_mini.expected_costs(model)["sent_bytes_per_step"]}


def all_checks(rank: int, world_size: int):
    """Everything the test file asks, in one launch (each launch costs seconds)."""
    return {"order": {p: issue_order(rank, world_size, p) for p in (False, True, 2)},
            "peak": {p: gathered_peak(rank, world_size, p) for p in (False, True, 2)},
            "changing": {name: changing_order(rank, world_size, opts) for name, opts in
                         (("plain", {}), ("prefetch", {"prefetch": True}),
                          ("both", {"prefetch": 2, "activation_checkpointing": True}))},
            "activations": {c: activation_memory(rank, world_size, c) for c in (False, True)}}
