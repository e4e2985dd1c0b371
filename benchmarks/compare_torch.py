"""fsdp_mini against torch's own DDP and FSDP2 (fully_shard): step time, peak memory, losses.

    python benchmarks/compare_torch.py                     # world size 4, gloo, the default GPT
    python benchmarks/compare_torch.py --world-size 1 --backend nccl   # on one GPU

One launch; on every rank all four models live side by side and train on the same batches in
alternating rounds (the order of each pair flips every step), so the machine's load hits both
sides alike. Step time: median over the timed steps, per rank, then the slowest rank. Peak
memory: one step under ``track_memory`` per model (``own_peak_bytes``: the bytes that model's
step adds to what it keeps), per rank. Losses: every step, both sides, must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial

import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini.models import GPTConfig, SyntheticText, make_model
from fsdp_mini.training import train_step

PAIRS = (("fsdp_mini ddp", "torch DDP"), ("fsdp_mini fsdp", "torch fully_shard"),
         ("fsdp_mini fsdp prefetch", "torch fully_shard"),
         ("fsdp_mini fsdp bf16", "torch fully_shard bf16"))
TARGET_TIME, TARGET_PEAK = 1.00, 1.00


def build(kind: str, cfg: GPTConfig, device: torch.device):
    model = make_model(cfg).to(device)
    adamw = partial(torch.optim.AdamW, lr=1e-3)
    if kind == "fsdp_mini ddp":
        return fsdp_mini.parallelize(model, "ddp", optimizer=adamw)
    if kind.startswith("fsdp_mini fsdp"):
        options = {"prefetch": "prefetch" in kind}
        if "bf16" in kind:  # with prefetch too: torch's fully_shard prefetches by default
            options = {"prefetch": True, "param_dtype": torch.bfloat16,
                       "reduce_dtype": torch.float32}
        return fsdp_mini.parallelize(model, "fsdp", optimizer=adamw, units=list(model.blocks),
                                     **options)
    if kind == "torch DDP":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                      else None)
        return ddp, adamw(ddp.parameters())
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if "bf16" in kind else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, adamw(model.parameters())


def bench_rank(rank: int, world_size: int, model_size: str, steps: int, warmup: int,
               global_batch: int) -> dict:
    device = fsdp_mini.rank_device()
    cfg = GPTConfig.sized(model_size)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    kinds = list(dict.fromkeys(k for pair in PAIRS for k in pair))  # torch's FSDP once
    models = {k: build(k, cfg, device) for k in kinds}
    times = {k: [] for k in kinds}
    losses = {k: [] for k in kinds}
    for step in range(warmup + steps):
        x, y = (t.to(device) for t in data.local_batch(step, global_batch, rank, world_size))
        done = set()  # torch's fully_shard is in two pairs: one step each step
        for pair in PAIRS:
            for kind in (pair if step % 2 == 0 else pair[::-1]):
                if kind in done:
                    continue
                done.add(kind)
                dist.barrier()
                _sync(device)
                start = time.perf_counter()
                losses[kind].append(train_step(*models[kind], (x, y)))
                _sync(device)
                if step >= warmup:
                    times[kind].append(time.perf_counter() - start)
    peaks, cuda_peaks = {}, {}
    x, y = (t.to(device) for t in data.local_batch(warmup + steps, global_batch, rank, world_size))
    for kind in kinds:
        dist.barrier()
        with fsdp_mini.track_memory(*models[kind]) as mem:
            losses[kind].append(train_step(*models[kind], (x, y)))
            _sync(device)
        peaks[kind] = mem.own_peak_bytes
        cuda_peaks[kind] = mem.cuda.get("peak_allocated_bytes")
    return {"median_step_seconds": {k: statistics.median(v) for k, v in times.items()},
            "own_peak_bytes": peaks, "cuda_peak_allocated_bytes": cuda_peaks, "losses": losses}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(per_rank: list[dict]) -> dict:
    out = {}
    for mine, theirs in PAIRS:
        t_mine = max(r["median_step_seconds"][mine] for r in per_rank)
        t_theirs = max(r["median_step_seconds"][theirs] for r in per_rank)
        peak_ratio = max(r["own_peak_bytes"][mine] / r["own_peak_bytes"][theirs] for r in per_rank)
        loss_diff = max(abs(a - b) / abs(b) for r in per_rank
                        for a, b in zip(r["losses"][mine], r["losses"][theirs]))
        out[f"{mine} vs {theirs}"] = {
            "step_seconds": [t_mine, t_theirs], "time_ratio": t_mine / t_theirs,
            "peak_bytes_rank0": [per_rank[0]["own_peak_bytes"][mine],
                                 per_rank[0]["own_peak_bytes"][theirs]],
            "peak_ratio_worst_rank": peak_ratio, "max_relative_loss_difference": loss_diff}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--model", choices=("default", "tiny"), default="default")
    parser.add_argument("--steps", type=int, default=12, help="timed steps after warm-up")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--json", metavar="PATH", help="write the summary as JSON")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    per_rank = fsdp_mini.launch(bench_rank, args.world_size, args.model, args.steps, args.warmup,
                                args.global_batch, backend=args.backend, timeout=300)
    summary = summarize(per_rank)
    print(f"world size {args.world_size}, {args.backend}, {args.model} GPT, {args.steps} timed "
          f"steps after {args.warmup} warm-up, alternating rounds "
          f"({time.perf_counter() - started:.0f} s)")
    print(f"{'pair':<36} {'step ms':>17} {'time ratio':>10} {'peak MiB (rank 0)':>19} "
          f"{'peak ratio':>10} {'loss diff':>9}")
    ok = True
    for name, s in summary.items():
        t = f"{s['step_seconds'][0] * 1e3:.1f} / {s['step_seconds'][1] * 1e3:.1f}"
        p = f"{s['peak_bytes_rank0'][0] / 2**20:.2f} / {s['peak_bytes_rank0'][1] / 2**20:.2f}"
        print(f"{name:<36} {t:>17} {s['time_ratio']:>10.3f} {p:>19} "
              f"{s['peak_ratio_worst_rank']:>10.3f} {s['max_relative_loss_difference']:>9.1e}")
        ok &= s["time_ratio"] <= TARGET_TIME and s["peak_ratio_worst_rank"] <= TARGET_PEAK
    print(f"targets: time ratio <= {TARGET_TIME}, peak ratio <= {TARGET_PEAK}: "
          f"{'met' if ok else 'NOT met'}")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"args": vars(args), "summary": summary, "per_rank": per_rank}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
