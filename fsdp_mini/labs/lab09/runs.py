"""Lab 09's runs: the small net, its data, one process's answer, and what runs on the ranks.

    model = debug_net()                  # 4 → 7 → 3, initialised from torch's global RNG
    x, y = debug_batch(step, rank, 2)    # this rank's rows of the step's 12
    one_process(clip=0.6)                # the weights exercise 3 must reach
    run_on_ranks(rank, 2, [train], 3)    # on a rank: the weights before and after, rows fed
"""

from __future__ import annotations

import contextlib
import importlib
import io
from functools import partial

import torch
from torch import nn

from ..common.checking import batch

DEBUG_STEPS = 3       # steps a checker trains
debug_sgd = partial(torch.optim.SGD, lr=0.1, momentum=0.9)
debug_batch = batch   # (step, rank=0, world_size=1): this rank's rows of the step's 12


def debug_net() -> nn.Module:
    """4 → 7 → 3 (59 parameters), initialised from torch's global RNG: the seed decides it."""
    return nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 3))


def one_process(steps: int = DEBUG_STEPS, world_size: int = 1, rows: str = "own",
                scale: float = 1.0, clip: float | None = None) -> dict:
    """Plain torch in this process: seed 0, the whole batch of every step, SGD + momentum.

    The variants replay a mistake of ``world_size`` ranks exactly: ``rows="first"`` every rank
    uses rank 0's rows; ``scale`` multiplies the averaged gradient (``1/N``: a loss divided by
    N); ``clip`` clips by the global norm. Example: ``one_process(clip=0.6)`` is the answer of
    exercise 3.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = debug_net()
    opt = debug_sgd(model.parameters())
    for step in range(steps):
        x, y = debug_batch(step, 0, world_size) if rows == "first" else debug_batch(step)
        (nn.functional.mse_loss(model(x), y) * scale).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_on_ranks(rank, world_size, fns, steps):
    """On each rank, for each function: its weights before training and after ``steps`` steps,
    the rows of each step its net was fed (``rows``: indices into the step's 12, None for a row
    not in the batch) and what it printed while training (``printed``).
    Note: several functions in one launch, so that tests pay for one start of the ranks."""
    labs_namespace = vars(importlib.import_module(__package__.rpartition(".")[0]))  # fsdp_mini.labs
    torch.set_num_threads(1)
    out = []
    for fn in fns:
        before = _cpu(fn(rank, world_size, 0))
        fed, printed = [], io.StringIO()
        labs_namespace["debug_net"] = partial(_recording_net, fed)  # labs.debug_net() records
        try:
            with contextlib.redirect_stdout(printed):
                after = _cpu(fn(rank, world_size, steps))
        finally:
            labs_namespace["debug_net"] = debug_net
            print(printed.getvalue(), end="")   # what it printed still shows, as before
        out.append({"before": before, "after": after, "rows": _rows(fed),
                    "printed": printed.getvalue()})
    return out


def _recording_net(fed: list) -> nn.Module:
    """debug_net(), the same weights from the same RNG, that keeps the input of every forward."""
    net = debug_net()
    net[0].register_forward_pre_hook(lambda module, args: fed.append(args[0].detach().clone()))
    return net


def _rows(fed: list) -> list:
    """Per forward, the indices (into its step's whole batch) of the rows fed; forward k is
    taken as step k. None for a row that is not one of the step's."""
    out = []
    for step, x in enumerate(fed[:DEBUG_STEPS]):
        whole = debug_batch(step)[0]
        out.append([next((i for i in range(len(whole)) if torch.equal(row, whole[i])), None)
                    for row in x.reshape(-1, whole.shape[1])])
    return out


def _cpu(state) -> dict:
    if not isinstance(state, dict):
        raise TypeError(f"your function must return the weights (fsdp_mini.full_state_dict("
                        f"model)), a dict of tensors; it returned {type(state).__name__}")
    return {k: v.detach().cpu().clone() for k, v in state.items()}
