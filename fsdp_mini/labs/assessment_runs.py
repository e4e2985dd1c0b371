"""The assessment's runs on the ranks: the job's stand-in, a small GPT the labs never trained,
under the configurations the tasks ask about, with or without the job's slow link.

    runs = run_job_configs(cfg, {"ddp": DDP_FP32, "fsdp": chosen})
    runs["fsdp"]["collectives"]     # the last step's ledger records: op, payload_bytes, sent_bytes
    runs["fsdp"]["compute_s"]       # the step less the time it waited for collectives
    runs["fsdp"]["sent_bytes"]      # what one rank sent in that step (the ledger's total)

A configuration is what ``choose_config`` returns: ``{"strategy": "fsdp", "precision":
"bf16-mixed", "checkpointing": False}``. "bf16-mixed" is the planner's: 2-byte all-gathers *and*
2-byte gradient reductions, in fsdp_mini ``param_dtype=torch.bfloat16, reduce_dtype=
torch.bfloat16`` (fsdp_mini's own default reduces in fp32; lab 07 measured that).
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch

from ..launcher import launch, rank_device
from ..models import GPTConfig

__all__ = ["DDP_FP32", "JOB_GPT", "options_of", "run_job_configs"]

# Note: a shape no lab trains (labs train the tiny and the default GPT): 3 blocks of width 48.
JOB_GPT = GPTConfig(vocab_size=96, block_size=24, n_layer=3, n_head=3, n_embd=48)
DDP_FP32 = {"strategy": "ddp", "precision": "fp32", "checkpointing": False}


def options_of(config: dict) -> dict:
    """The ``parallelize`` options of a configuration, as the planner counts it.

    >>> options_of({"strategy": "fsdp", "precision": "bf16-mixed", "checkpointing": False})
    {'reduce_dtype': torch.bfloat16, 'param_dtype': torch.bfloat16}
    """
    strategy, options = config["strategy"], {}
    if config["precision"] == "bf16-mixed":
        if strategy in ("zero1", "zero2"):
            # Note: zero all-gathers its fp32 shards; the planner counts 2-byte all-gathers there.
            raise ValueError(f"{strategy} with bf16-mixed cannot run as the planner counts it in "
                             f"fsdp_mini (zero all-gathers fp32 parameters): run fp32, or fsdp")
        options["reduce_dtype"] = torch.bfloat16
        if strategy == "fsdp":
            options["param_dtype"] = torch.bfloat16
    if config["checkpointing"]:
        if strategy != "fsdp":
            raise ValueError("activation checkpointing is an fsdp option in fsdp_mini")
        options["activation_checkpointing"] = True
    return options


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
                     "seconds": _slowest(mine, "seconds"),
                     "compute_s": _slowest(mine, "compute"),
                     "collectives": mine[0]["collectives"],
                     "sent_bytes": sum(c["sent_bytes"] for c in mine[0]["collectives"])}
    return out


def _slowest(runs: list[dict], key: str) -> float:
    """The median over steps of the slowest rank's figure: a step ends when its last rank does."""
    return statistics.median(max(step) for step in zip(*(r[key] for r in runs)))


def _job_rank(rank, world_size, configs, steps, link, global_batch) -> dict:
    import torch.distributed as dist

    from ..api import parallelize
    from ..models import SyntheticText, make_model
    from ..training import train_step
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
    out = {name: {"seconds": [], "compute": []} for name in configs}
    for step in range(steps):
        batch = tuple(t.to(device) for t in data.local_batch(step, global_batch, rank, world_size))
        names = list(models)[step % len(models):] + list(models)[:step % len(models)]
        for name in names:  # Note: in turns, so a slow spell of the machine falls on all alike
            dist.barrier()
            start = time.perf_counter()
            train_step(*models[name], batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            if step:
                out[name]["seconds"].append(seconds)
                out[name]["compute"].append(seconds - _waited(models[name][0]))
    for name, (model, _) in models.items():
        ledger = model.fsdp_mini.comm.ledger
        out[name]["collectives"] = [
            {"op": r.op, "payload_bytes": r.payload_bytes, "sent_bytes": r.sent_bytes}
            for r in ledger.select(ledger.step) if r.op != "barrier"]
    return out


def _waited(model) -> float:
    """Seconds the last step spent waiting for its collectives (from each wait to its end)."""
    ledger = model.fsdp_mini.comm.ledger
    return sum(r.seconds - r.waited for r in ledger.select(ledger.step))
