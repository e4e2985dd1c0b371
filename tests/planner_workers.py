"""Functions the planner tests run on every rank: measure one training step of the kit's GPT
under each strategy, to set beside :func:`fsdp_mini.plan`'s prediction."""

from __future__ import annotations

import gc
from functools import partial

import torch

import fsdp_mini
from fsdp_mini.models import GPTConfig, SyntheticText, make_model
from fsdp_mini.training import train


def measure_peaks(rank: int, world_size: int, cases: list[tuple[str, dict, str, dict]],
                  micro_batch: int) -> dict:
    """For each (shape name, GPTConfig fields, strategy, options): one warm-up step, then one step
    under track_memory. Returns {f"{shape}/{strategy}": figures} (rank's own)."""
    torch.set_num_threads(1)
    out = {}
    for shape, fields, strategy, options in cases:
        cfg = GPTConfig(**fields)
        data = SyntheticText(cfg.vocab_size, cfg.block_size)
        model = make_model(cfg)
        model, optimizer = fsdp_mini.parallelize(
            model, strategy, units=list(model.blocks),
            optimizer=partial(torch.optim.AdamW, lr=1e-3), **options)
        batches = partial(data.local_batch, global_batch_size=micro_batch * world_size,
                          rank=rank, world_size=world_size)
        run = train(model, optimizer, batches, 2, track_memory_at=1)
        mem = run.memory
        after = mem.snapshots[-1].by_category
        out[f"{shape}/{strategy}" + "".join(f",{k}={v}" for k, v in options.items())] = {
            "own_peak": mem.own_peak_bytes, "at_peak": dict(mem.at_peak),
            "peak_by_category": dict(mem.peak_by_category),
            "persistent": sum(after[c] for c in ("params", "grads", "optimizer_state")),
            "expected": fsdp_mini.expected_costs(model)}
        del model, optimizer, run, mem
        gc.collect()
    return out


def sent_per_step(rank: int, world_size: int) -> dict:
    """Bytes this rank sent in its second training step of the tiny GPT, per (strategy, reduce
    dtype name or None): fsdp in bf16 (``param_dtype``) and ddp, each reduced in fp32 (None,
    the default) and in bf16."""
    torch.set_num_threads(1)
    cfg = GPTConfig.tiny()
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    out = {}
    for strategy, reduce in (("fsdp", None), ("fsdp", "bf16"), ("ddp", None), ("ddp", "bf16")):
        options = {"param_dtype": torch.bfloat16} if strategy == "fsdp" else {}
        if reduce:
            options["reduce_dtype"] = torch.bfloat16
        model = make_model(cfg)
        model, optimizer = fsdp_mini.parallelize(model, strategy, units=list(model.blocks),
                                                 optimizer=partial(torch.optim.AdamW, lr=1e-3),
                                                 **options)
        run = train(model, optimizer, partial(data.local_batch, global_batch_size=2 * world_size,
                                              rank=rank, world_size=world_size), 2)
        out[strategy, reduce] = run.sent_bytes[-1]
    return out
