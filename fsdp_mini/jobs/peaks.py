"""One training step's peak per rank, measured under a strategy and its options: what the
planner's peaks are checked against (tests/test_planner_options.py, benchmarks/planner_check.py).

    cases = {"fsdp bf16": (GPTConfig.tiny(), "fsdp", {"param_dtype": torch.bfloat16}, 1)}
    per_rank = fsdp_mini.launch(option_peaks, 2, cases, 4)    # 4 sequences per micro-batch
    per_rank[0]["fsdp bf16"]["tensors"]                        # rank 0's own peak, in bytes

Each case: a warm-up step, then one step under ``track_memory``; a step of k micro-batches runs
all but the last under ``no_sync``. AdamW updates parameter by parameter (``foreach=False``), as
the planner counts its temporaries. On a GPU each case also gives the caching allocator's peak
above what was allocated before it, and its reserved-over-allocated at the peak (fragmentation).
"""

from __future__ import annotations

import contextlib
import gc
from functools import partial

import torch

from ..api import no_sync, parallelize
from ..launcher import rank_device
from ..memory import track_memory
from ..models import SyntheticText, make_model


def option_peaks(rank: int, world_size: int, cases: dict, micro_batch: int) -> dict:
    """``cases``: {key: (GPTConfig, strategy, parallelize options, micro-batches per step)};
    returns {key: {"tensors": bytes, "at_peak": bytes by category at that peak[,
    "allocator": bytes, "fragmentation": bytes]}}."""
    torch.set_num_threads(1)
    device = rank_device()
    out = {}
    for key, (cfg, strategy, options, micro) in cases.items():
        out[key] = _one_case(cfg, strategy, options, micro, micro_batch, rank, world_size, device)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def _one_case(cfg, strategy, options, micro, micro_batch, rank, world_size, device) -> dict:
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    net = make_model(cfg).to(device)
    net, opt = parallelize(net, strategy, units=list(net.blocks) if strategy == "fsdp" else None,
                           optimizer=partial(torch.optim.AdamW, lr=1e-3, foreach=False), **options)

    def step(s, mem=None):
        x, y = (t.to(device) for t in data.local_batch(s, micro_batch * micro * world_size, rank,
                                                      world_size))
        for i, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
            with no_sync(net) if i < micro - 1 else contextlib.nullcontext():
                (net(xm, ym)[1] / micro).backward()
        opt.step()
        if mem is not None:
            mem.mark("after_step")
        opt.zero_grad()

    step(0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with track_memory(net, opt) as mem:
        step(1, mem)
    fig = {"tensors": mem.own_peak_bytes, "at_peak": dict(mem.at_peak)}
    if cuda:
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        fig.update(allocator=torch.cuda.max_memory_allocated() - base,
                   fragmentation=stats["reserved_bytes.all.peak"]
                   - stats["allocated_bytes.all.peak"])
    return fig
