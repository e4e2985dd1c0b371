"""Gradient accumulation with and without ``fsdp_mini.no_sync``, run on every rank by
tests/test_no_sync.py.

Each step is K = 3 micro-batches: the first two backwards inside ``no_sync`` (mode "no_sync") or
not (mode "every"), the last outside, then one optimizer step. The model has a parameter no
micro-batch uses, one used in the first micro-batch only (inside no_sync), and a whole FSDP unit
used in the first micro-batch only.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import torch
from torch import nn

import fsdp_mini

K = 3             # micro-batches per step
GLOBAL_BATCH = 18  # per step: K micro-batches of 6, split over 1, 2 or 3 ranks
STEPS = 2
OPTIMIZERS = {
    "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    "adamw": partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1),
}
VARIANTS = [("ddp", {}), ("zero1", {}), ("zero2", {}), ("fsdp", {}),
            ("ddp", {"bucket_mb": 1e-4}), ("zero2", {"bucket_mb": 1e-4}),
            ("fsdp", {"reshard_after_forward": False})]


def variant_name(strategy: str, options: dict) -> str:
    return strategy + "".join(f",{k}={v}" for k, v in sorted(options.items()))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.early = nn.Linear(6, 6)                # used in micro-batch 0 only
        self.never = nn.Parameter(torch.randn(5))   # used in no micro-batch

    def forward(self, h, micro):
        h = torch.tanh(self.lin(h))
        return h + self.early(h) if micro == 0 else h


class Accum(nn.Module):
    """Units: ``block`` and ``extra`` (the latter used in micro-batch 0 only); root: ``head``."""

    def __init__(self, seed: int = 0):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            super().__init__()
            self.block = Block()
            self.extra = nn.Linear(6, 6)
            self.head = nn.Linear(6, 3)

    def forward(self, x, y, micro):
        h = self.block(x, micro)
        if micro == 0:
            h = h + self.extra(h)
        return ((self.head(h) - y) ** 2).mean()


def global_micro_batch(step: int, micro: int):
    g = torch.Generator().manual_seed(700 + step)
    x, y = torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)
    n = GLOBAL_BATCH // K
    return x[micro * n:(micro + 1) * n], y[micro * n:(micro + 1) * n]


def micro_batch(step: int, micro: int, rank: int, world_size: int):
    x, y = global_micro_batch(step, micro)
    n = len(x) // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def reference(opt_name: str):
    """One process, one backward per step on the whole global batch (its K parts concatenated;
    the model treats each part as its micro-batch index says, so the loss is their mean)."""
    model = Accum()
    optimizer = OPTIMIZERS[opt_name]([p for p in model.parameters() if p.requires_grad])
    for step in range(STEPS):
        loss = sum(model(*global_micro_batch(step, m), m) for m in range(K)) / K
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def _grads_numel(model) -> int:
    return sum(t.numel() for t in model.memory_categories()["grads"] if t is not None)


def train(rank, world_size, strategy, options, opt_name, mode):
    model = Accum()
    model, optimizer = fsdp_mini.parallelize(model, strategy, optimizer=OPTIMIZERS[opt_name],
                                             units=[model.block, model.extra], **options)
    ledger = model.fsdp_mini.comm.ledger
    ledger.next_step()  # the broadcasts of parallelize stay in a step of their own
    ops, totals, never_none, kept_numel = [], [], [], []
    for step in range(STEPS):
        for m in range(K):
            before = len(ledger.records)
            quiet = mode == "no_sync" and m < K - 1
            with fsdp_mini.no_sync(model) if quiet else nullcontext():
                (model(*micro_batch(step, m, rank, world_size), m) / K).backward()
            ops.append([r.op for r in ledger.records[before:]])
            kept_numel.append(_grads_numel(model))
        never_none.append(model.block.never.grad is None)
        optimizer.step()
        totals.append({op: (t.calls, t.sent_bytes)
                       for op, t in ledger.totals(step=ledger.step).items()})
        optimizer.zero_grad()
    state = {k: v.cpu() for k, v in fsdp_mini.full_state_dict(model).items()}
    engine = model.fsdp_mini
    return {"state": state if rank == 0 else None, "ops": ops, "totals": totals,
            "never_none": never_none, "grads_numel": kept_numel,
            "padded_numel": engine.padded_numel(),
            "units": [g.layout.padded_numel for g in engine.groups()]
            if strategy == "fsdp" else None}


def run_all(rank, world_size, variants=VARIANTS, opt_names=tuple(OPTIMIZERS)):
    return {(variant_name(s, o), opt, mode): train(rank, world_size, s, o, opt, mode)
            for s, o in variants for opt in opt_names for mode in ("no_sync", "every")}
