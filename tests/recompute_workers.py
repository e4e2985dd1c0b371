"""Activation checkpointing from outside the kit, on every rank (tests/test_recompute.py).

``torch.utils.checkpoint.checkpoint`` is put around a unit's call (its hooks run again in the
recomputation), inside it around its ``forward`` (as Hugging Face's layers do: the hooks stay
outside), or around two units at once; and a
Hugging Face GPT-2 built from a config turns it on with ``gradient_checkpointing_enable()``.
Every run trains 2 SGD-with-momentum steps on the same global batches, so it can be compared
with one process training on the whole batch without any checkpointing.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import fsdp_mini

GLOBAL_BATCH, STEPS = 12, 2  # divisible by 2, 3 and 4 ranks
SGD = partial(torch.optim.SGD, lr=0.1, momentum=0.9)


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), \
            nn.Linear(2 * width, width)

    def forward(self, h):
        return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))


class Stack(nn.Module):
    """Three blocks of odd width (padding), checkpointed as ``mode`` says."""

    def __init__(self, mode: str = "none", reentrant: bool = False, width: int = 15):
        super().__init__()
        self.mode, self.reentrant = mode, reentrant
        self.embed, self.head = nn.Linear(6, width), nn.Linear(width, 2)
        self.blocks = nn.ModuleList(Block(width) for _ in range(3))
        for block in self.blocks if mode == "forward" else ():  # block(h) checkpoints inside
            block.forward = partial(checkpoint, block.forward, use_reentrant=reentrant)

    def forward(self, x, y):
        h, b, ckpt = self.embed(x), self.blocks, partial(checkpoint, use_reentrant=self.reentrant)
        if self.mode == "call":  # the unit's hooks run inside the checkpoint
            for block in b:
                h = ckpt(block, h)
        elif self.mode == "two units":  # one checkpoint around two units, the third plain
            h = b[2](ckpt(lambda t: b[1](b[0](t)), h))
        else:
            for block in b:
                h = block(h)
        return ((self.head(h) - y) ** 2).mean()


def stack(mode="none", reentrant=False) -> Stack:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Stack(mode, reentrant)


def stack_batch(step: int, rank: int, world_size: int):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 2, generator=g)
    n = GLOBAL_BATCH // world_size
    return (x[rank * n:(rank + 1) * n],), {"y": y[rank * n:(rank + 1) * n]}


def gpt2(checkpointing: str = "none"):
    """A small GPT-2 of transformers, from a config (nothing downloaded), no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=3, n_embd=30, n_head=3, vocab_size=50, n_positions=8,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(cfg)
    if checkpointing != "none":
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"})
    return model.train()


def gpt2_batch(step: int, rank: int, world_size: int):
    g = torch.Generator().manual_seed(200 + step)
    ids = torch.randint(0, 50, (GLOBAL_BATCH, 8), generator=g)
    n = GLOBAL_BATCH // world_size
    mine = ids[rank * n:(rank + 1) * n]
    return (), {"input_ids": mine, "labels": mine}


def _loss(out):
    return out if isinstance(out, torch.Tensor) else out.loss


def train(rank: int, world_size: int, model_name: str, mode: str, reentrant: bool,
          strategy: str, options: dict | None = None):
    """Returns the full state after the steps and the bytes each step sent (rank 0)."""
    torch.set_num_threads(1)
    if model_name == "gpt2":
        net, batch = gpt2(mode if mode == "none" else ("reentrant" if reentrant else "plain")), \
            gpt2_batch
        units = list(net.transformer.h)
    else:
        net, batch = stack(mode, reentrant), stack_batch
        units = list(net.blocks)
    if strategy == "single":
        model, opt = net, SGD(net.parameters())
    else:
        model, opt = fsdp_mini.parallelize(net, strategy, optimizer=SGD, units=units,
                                           **(options or {}))
    for step in range(STEPS):
        args, kwargs = batch(step, rank, world_size)
        _loss(model(*args, **kwargs)).backward()
        opt.step()
        opt.zero_grad()
    state = {k: v.detach().cpu().clone() for k, v in fsdp_mini.full_state_dict(model).items()}
    engine = getattr(model, "fsdp_mini", None)
    sent = [engine.comm.ledger.sent_bytes(s) for s in engine.comm.ledger.steps()] if engine else []
    return (state, sent) if rank == 0 else None


CASES = [("stack", "none", False)] + [("stack", mode, r) for mode in ("call", "forward", "two units")
                                      for r in (False, True)] \
    + [("gpt2", "none", False), ("gpt2", "hf", False), ("gpt2", "hf", True)]


def train_all(rank: int, world_size: int, strategy: str, options: dict | None = None):
    """Every case of CASES under ``strategy``: {case: (state, bytes per step)} on rank 0."""
    return {case: train(rank, world_size, *case, strategy, options) for case in CASES}
