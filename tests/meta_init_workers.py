"""Ranks for tests/test_meta_init.py: a model built on the meta device, materialised while it is
parallelized, compared with the same model built on the CPU."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

import fsdp_mini
from fsdp_mini.registry import strategy_names

WIDTH, LAYERS, SEED = 64, 12, 7
SGD = partial(torch.optim.SGD, lr=0.1)


class Layer(nn.Module):
    """One unit: an MLP and a random buffer (materialised and initialised like the weights)."""

    def __init__(self, d: int = WIDTH):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.register_buffer("gain", torch.empty(d))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.uniform_(self.gain, 0.5, 1.5)

    def forward(self, x):
        return x + self.gain * self.proj(torch.tanh(self.fc(x)))


class Tower(nn.Module):
    """LAYERS units, then the root's own head, built last (so the init draws come in the same
    order as under meta init: the units first, the root's own parameters last)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x, y):
        for layer in self.layers:
            x = layer(x)
        return ((self.head(x) - y) ** 2).mean()


def full_bytes() -> int:
    with torch.device("meta"):
        model = Tower()
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def batch(rank: int, world_size: int):
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(12, WIDTH, generator=g), torch.randn(12, 1, generator=g)
    n = 12 // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def build(meta: bool, strategy: str = "fsdp", **kw):
    torch.manual_seed(SEED)  # Note: on every rank for the CPU build; meta init syncs rank 0's
    if meta:
        with torch.device("meta"):
            model = Tower()
    else:
        model = Tower()
    return fsdp_mini.parallelize(model, strategy, units=list(model.layers), optimizer=SGD, **kw)


def one_step(model, optim, rank, world_size) -> float:
    loss = model(*batch(rank, world_size))
    loss.backward()
    optim.step()
    optim.zero_grad()
    return loss.item()


def meta_vs_cpu(rank: int, world_size: int) -> dict:
    """The meta-initialised model: its peak memory in parallelize, its state, one step, and the
    same for a CPU-built model and for the strategies that materialise it whole."""
    torch.set_num_threads(1)
    with torch.device("meta"):
        model = Tower()
    torch.manual_seed(SEED + rank)  # different on each rank: rank 0's state is broadcast
    with fsdp_mini.track_memory(model) as mem:
        model, optim = fsdp_mini.parallelize(model, "fsdp", units=list(model.layers),
                                             optimizer=SGD)
    out = {"peak": mem.own_peak_bytes, "state": fsdp_mini.full_state_dict(model)}
    out["loss"] = one_step(model, optim, rank, world_size)
    out["trained"] = fsdp_mini.full_state_dict(model)
    cpu, cpu_optim = build(meta=False)
    out["cpu_state"] = fsdp_mini.full_state_dict(cpu)
    out["cpu_loss"] = one_step(cpu, cpu_optim, rank, world_size)
    out["cpu_trained"] = fsdp_mini.full_state_dict(cpu)
    whole = ["ddp", "zero2"] + (["hsdp"] if "hsdp" in strategy_names() else [])
    for strategy in whole:
        kw = {"shard_size": 1} if strategy == "hsdp" else {}
        other, _ = build(meta=True, strategy=strategy, **kw)
        out[strategy] = fsdp_mini.full_state_dict(other)
    return out


def state_at(rank: int, world_size: int) -> dict:
    torch.set_num_threads(1)
    model, _ = build(meta=True)
    return fsdp_mini.full_state_dict(model)
