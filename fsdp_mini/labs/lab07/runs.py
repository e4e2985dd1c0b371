"""Lab 07's measurements: the fsdp options side by side on the lab's GPT, and meta init.

    runs = measure_options(cfg)               # one launch: fp32, bf16, checkpointing,
    runs["bf16"]["sent"]                      # accumulation with and without no_sync, meta init
    runs["meta init"]["peak"]                 # parallelize's peak for a GPT built on meta

Each variant trains the lab's GPT under fsdp with AdamW (``foreach=False``: the per-parameter
update the planner assumes): a warm-up step, timed steps, then one step under ``track_memory``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from ...api import no_sync, parallelize
from ...launcher import launch, rank_device
from ...memory import track_memory
from ...models import GPTConfig, SyntheticText, make_model
from ...training import loss_of

__all__ = ["VARIANTS", "gpt2_init", "measure_options"]

# name: (fsdp options, micro-batches per step, no_sync on all but the last micro-batch)
VARIANTS = {
    "fp32": ({}, 1, False),
    "bf16": ({"param_dtype": torch.bfloat16}, 1, False),
    "checkpointing": ({"activation_checkpointing": True}, 1, False),
    "accumulate": ({}, 2, False),              # 2 micro-batches, a reduce-scatter after each
    "accumulate + no_sync": ({}, 2, True),     # 2 micro-batches, one reduce-scatter
    "offload": ({"offload": True}, 1, False),  # GPUs only (on CPU ranks it changes nothing)
}


def gpt2_init(module: nn.Module) -> None:
    """A ``param_init_fn`` for meta init: GPT-2's N(0, 0.02) weights, zero biases, LayerNorm =
    identity, on the tensors of ``module`` that are real (a unit's other tensors are meta)."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)) and not m.weight.is_meta:
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.LayerNorm) and not m.weight.is_meta:
                nn.init.ones_(m.weight)
            bias = getattr(m, "bias", None)
            if isinstance(bias, torch.Tensor) and not bias.is_meta:
                nn.init.zeros_(bias)


def measure_options(cfg, variants=None) -> dict:
    """Run each variant (default: all, but offload only on GPUs) on ``cfg.world_size`` ranks and
    meta init; returns {variant: figures}: peaks the largest over ranks, bytes rank 0's."""
    names = list(variants or [v for v in VARIANTS if v != "offload" or cfg.device == "cuda"])
    per_rank = launch(_options_rank, cfg.world_size, cfg.model, cfg.global_batch, names,
                      min(cfg.steps, 3), backend=cfg.backend, timeout=300)
    out = {}
    for name in per_rank[0]:
        runs = [r[name] for r in per_rank]
        merged = dict(runs[0])
        for key in ("peak", "cuda_peak", "cuda_kept", "seconds"):
            if key in merged:
                merged[key] = max(r[key] for r in runs)
        merged["peak_by_rank"] = [r.get("peak") for r in runs]
        out[name] = merged
    return out


def _options_rank(rank, world_size, model_size, global_batch, names, steps) -> dict:
    torch.set_num_threads(1)
    gpt = GPTConfig.sized(model_size)
    device = rank_device()
    data = SyntheticText(gpt.vocab_size, gpt.block_size)

    def batch(step):
        return tuple(t.to(device) for t in data.local_batch(step, global_batch, rank, world_size))

    # Note: a throwaway run first, so that the first measured variant's steps do not pay the
    # process's one-time costs (first autograd graph, allocator, thread pools) alone.
    _one_variant(gpt, device, batch, 1, *VARIANTS["fp32"])
    out = {name: _one_variant(gpt, device, batch, steps, *VARIANTS[name]) for name in names}
    out["meta init"] = _meta_init(gpt, device)
    return out


def _one_variant(gpt, device, batch, steps, options, micro_batches, use_no_sync) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
    model = make_model(gpt).to(device)
    calls = [0]  # forward calls of the blocks' Linear layers (recomputation calls them again)
    for m in model.blocks.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    model, optimizer = parallelize(model, "fsdp", units=list(model.blocks),
                                   optimizer=partial(torch.optim.AdamW, lr=1e-3, foreach=False),
                                   **options)
    ledger = model.fsdp_mini.comm.ledger

    def step(s, mem=None):
        x, y = batch(s)
        for i, (xm, ym) in enumerate(zip(x.chunk(micro_batches), y.chunk(micro_batches))):
            quiet = use_no_sync and i < micro_batches - 1
            with no_sync(model) if quiet else contextlib.nullcontext():
                (loss_of(model, xm, ym) / micro_batches).backward()
        optimizer.step()
        if mem is not None:
            mem.mark("after_step")
        optimizer.zero_grad()

    step(0)  # warm-up: Adam makes its state
    seconds = []
    for s in range(1, steps + 1):
        dist.barrier()
        start = time.perf_counter()
        step(s)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    fig = {"seconds": statistics.median(seconds)}
    if cuda:
        torch.cuda.synchronize()
        fig["cuda_kept"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
    calls[0] = 0
    dist.barrier()
    with track_memory(model, optimizer) as mem:
        step(steps + 1, mem)
    if cuda:
        fig["cuda_peak"] = torch.cuda.max_memory_allocated() - base
    after = next(s for s in mem.snapshots if s.label == "after_step").by_category
    fig.update(peak=mem.own_peak_bytes, at_peak=dict(mem.at_peak),
               peak_by_category=dict(mem.peak_by_category), linear_calls=calls[0],
               persistent={c: after[c] for c in ("params", "grads", "optimizer_state")},
               sent={op: t.sent_bytes for op, t in ledger.totals(ledger.step).items()},
               calls={op: t.calls for op, t in ledger.totals(ledger.step).items()})
    return fig


def _meta_init(gpt, device) -> dict:
    """The peak of parallelize for a GPT built on the meta device, against its whole size."""
    with torch.device("meta"):
        model = make_model(gpt)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    with track_memory(model) as mem:
        model, _ = parallelize(model, "fsdp", units=list(model.blocks), param_init_fn=gpt2_init,
                               device=device)
    shards = sum(p.numel() * p.element_size() for p in model.fsdp_mini.optimizer_params())
    return {"peak": mem.own_peak_bytes, "whole": whole, "shards": shards}
