"""The assessment's runs on the ranks: the job's stand-in, a small GPT the labs never trained,
under the configurations the tasks ask about, with or without the job's slow link.

    runs = run_job_configs(cfg, {"ddp": DDP_FP32, "fsdp": chosen})
    runs["fsdp"]["collectives"]     # the last step's ledger records: op, payload_bytes, sent_bytes
    runs["fsdp"]["compute_s"]       # the step less the time it waited for collectives
    runs["fsdp"]["sent_bytes"]      # what one rank sent in that step (the ledger's total)

A configuration is what ``choose_config`` returns (:mod:`fsdp_mini.labs.common.configurations`).
"""

from __future__ import annotations

from functools import partial

import torch

from ...launcher import launch, rank_device
from ...models import GPTConfig
from ...training import median_of_slowest, train_in_turns
from ..common.configurations import options_of

__all__ = ["DDP_FP32", "JOB_GPT", "run_job_configs"]

# Note: a shape no lab trains (labs train the tiny and the default GPT): 3 blocks of width 48.
JOB_GPT = GPTConfig(vocab_size=96, block_size=24, n_layer=3, n_head=3, n_embd=48)
DDP_FP32 = {"strategy": "ddp", "precision": "fp32", "checkpointing": False}


def run_job_configs(cfg, configs: dict, link=None, steps: int = 4) -> dict:
    """Train the stand-in under each of ``configs`` ({name: configuration}) on ``cfg``'s ranks,
    taking turns step by step (step 0 is a warm-up), on ``link`` (a :class:`fsdp_mini.Link`) or
    none. Per name: the configuration, ``seconds`` and ``compute_s`` (medians over the steps of
    the slowest rank), rank 0's last ``collectives`` and their total ``sent_bytes``."""
    for config in configs.values():
        options_of(config)  # Note: refuse what cannot run before any rank starts
    per_rank = launch(_job_rank, cfg.world_size, configs, steps, link, cfg.global_batch,
                      backend=cfg.backend, timeout=120, deadline=300)
    out = {}
    for name, config in configs.items():
        mine = [r[name] for r in per_rank]
        out[name] = {"config": dict(config),
                     "seconds": median_of_slowest([r["seconds"] for r in mine]),
                     "compute_s": median_of_slowest([r["compute"] for r in mine]),
                     "collectives": mine[0]["collectives"],
                     "sent_bytes": sum(c["sent_bytes"] for c in mine[0]["collectives"])}
    return out


def _job_rank(rank, world_size, configs, steps, link, global_batch) -> dict:
    from ...api import parallelize
    from ...models import SyntheticText, make_model
    torch.set_num_threads(1)
    device = rank_device()
    models = {}
    for name, config in configs.items():
        net = make_model(JOB_GPT).to(device)
        units = list(net.blocks) if config["strategy"] == "fsdp" else None
        models[name] = parallelize(net, config["strategy"], units=units, link=link,
                                   optimizer=partial(torch.optim.AdamW, lr=1e-3),
                                   **options_of(config))
    data = SyntheticText(JOB_GPT.vocab_size, JOB_GPT.block_size)
    out = train_in_turns(models, lambda step: tuple(
        t.to(device) for t in data.local_batch(step, global_batch, rank, world_size)), steps)
    for times in out.values():
        times["collectives"] = [{k: r[k] for k in ("op", "payload_bytes", "sent_bytes")}
                                for r in times.pop("records")]
    return out
