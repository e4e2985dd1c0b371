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


def measure_option_peaks(rank: int, world_size: int, cases: list[tuple[str, dict, str, dict, int]],
                         micro_batch: int) -> dict:
    """For each (shape name, GPTConfig fields, strategy, parallelize options, micro-batches per
    step): a warm-up step, then one step under track_memory; micro-batches after the first run
    under ``no_sync`` but the last. Returns {key: own peak bytes} (this rank's)."""
    torch.set_num_threads(1)
    out = {}
    for shape, fields, strategy, options, micro in cases:
        cfg = GPTConfig(**fields)
        data = SyntheticText(cfg.vocab_size, cfg.block_size)
        model, optimizer = fsdp_mini.parallelize(
            make_model(cfg), strategy, units=None, optimizer=partial(torch.optim.AdamW, lr=1e-3),
            **options) if strategy != "fsdp" else _fsdp(cfg, options)

        def step(s, mem=None, model=model, optimizer=optimizer):
            x, y = data.local_batch(s, micro_batch * micro * world_size, rank, world_size)
            for i, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
                quiet = fsdp_mini.no_sync(model) if i < micro - 1 else _nothing()
                with quiet:
                    (model(xm, ym)[1] / micro).backward()
            optimizer.step()
            if mem is not None:
                mem.mark("after_step")
            optimizer.zero_grad()

        step(0)
        with fsdp_mini.track_memory(model, optimizer) as mem:
            step(1, mem)
        out[_key(shape, strategy, options, micro)] = mem.own_peak_bytes
        del model, optimizer, mem
        gc.collect()
    return out


def _fsdp(cfg, options):
    model = make_model(cfg)
    return fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                 optimizer=partial(torch.optim.AdamW, lr=1e-3), **options)


def _key(shape, strategy, options, micro) -> str:
    opts = ",".join(f"{k}={str(v).removeprefix('torch.')}" for k, v in options.items())
    return f"{shape}/{strategy}" + (f",{opts}" if opts else "") + (f",x{micro}" if micro > 1 else "")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
