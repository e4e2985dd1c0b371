"""Small data first: a net so small, and a batch so short, that the right answer is known to the
last digit: one process trained on the whole batch. N ranks of data parallelism, ZeRO or FSDP
must reach its weights, step by step (up to the order of float additions)::

    model = debug_net()                  # 4 → 7 → 3, initialised from torch's global RNG
    x, y = debug_batch(step, rank, 2)    # this rank's rows of the step's 12
    one_process(steps=4, clip=0.6)       # what any number of ranks must match
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

__all__ = ["debug_batch", "debug_net", "debug_sgd", "one_process"]

debug_sgd = partial(torch.optim.SGD, lr=0.1, momentum=0.9)   # linear in the gradient: a wrong
ROWS = 12                                                    # scale shows (AdamW divides it away)


def debug_net() -> nn.Module:
    """4 → 7 → 3 (59 parameters), initialised from torch's global RNG: the seed decides it."""
    return nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 3))


def debug_batch(step: int, rank: int = 0, world_size: int = 1, rows: int = ROWS):
    """This rank's rows [rank·n, (rank+1)·n) of the step's ``rows`` (4 inputs, 3 targets each)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(rows, 4, generator=g), torch.randn(rows, 3, generator=g)
    n = rows // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def one_process(steps: int = 4, world_size: int = 1, rows: str = "own", clip=None,
                net=debug_net, batch=debug_batch, optimizer=debug_sgd) -> dict:
    """Plain torch in this process: seed 0, ``net()``, ``optimizer``, the whole ``batch(step)``
    each step (``rows="first"``: only rank 0's rows of ``world_size``), clipped at ``clip``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = net()
    opt = optimizer(model.parameters())
    for step in range(steps):
        x, y = batch(step, 0, world_size) if rows == "first" else batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
