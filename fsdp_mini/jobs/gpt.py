"""Ready-made training functions for ``launch``: what the demo and the labs run on every rank.

    fsdp_mini.launch(train_gpt, 4, "fsdp", monitor=Dashboard())

Each writes telemetry (``Recorder.from_env``), so a dashboard passed to ``launch`` shows it live,
and returns what a test or a lab checks afterwards.
"""

from __future__ import annotations

from functools import partial

import torch

from ..api import parallelize
from ..launcher import rank_device
from ..models import GPTConfig, SyntheticText, make_model
from ..telemetry import Recorder
from ..training import train


def train_gpt(rank: int, world_size: int, strategy="fsdp", steps: int = 5,
              model: str = "default", global_batch: int = 8, telemetry: bool = True,
              check_collectives: bool = False, lr: float = 1e-3) -> dict:
    """Train the tiny GPT under ``strategy``; return losses, step times and the ledger's totals.

    ``strategy``: a name, or a :class:`~fsdp_mini.Strategy` subclass (yours, defined in a notebook:
    ``launch`` ships it to the ranks, where it is used as it is). ``telemetry=False`` trains
    without a recorder (to measure what telemetry costs).
    """
    device = rank_device()
    cfg = GPTConfig.sized(model)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    name = strategy if isinstance(strategy, str) else getattr(strategy, "strategy", "run")
    recorder = Recorder.from_env(run=name) if telemetry else None
    net = make_model(cfg).to(device)
    options = {"check_collectives": True} if check_collectives else {}
    net, optimizer = parallelize(net, strategy, units=list(net.blocks), recorder=recorder,
                                 optimizer=partial(torch.optim.AdamW, lr=lr), **options)
    ledger = net.fsdp_mini.comm.ledger
    run = train(net, optimizer, lambda step: tuple(
        t.to(device) for t in data.local_batch(step, global_batch, rank, world_size)), steps,
        recorder=recorder)
    if recorder is not None:
        recorder.close()
    totals = {op: t.sent_bytes for op, t in ledger.totals().items()}
    return {"losses": run.losses, "step_seconds": run.step_seconds, "sent_bytes_by_op": totals,
            "sent_bytes": ledger.sent_bytes()}


def train_strategies(rank: int, world_size: int, strategies=("ddp", "zero1", "zero2", "fsdp"),
                     steps: int = 5, model: str = "default", global_batch: int = 8) -> dict:
    """The same job under each strategy in turn, in one launch (one telemetry run each)."""
    return {s: train_gpt(rank, world_size, s, steps, model, global_batch) for s in strategies}
