"""The planner's step time against measured steps on this machine's ranks (ddp and fsdp).

    python benchmarks/step_time_check.py                     # 4 CPU ranks, the lab's GPT
    python benchmarks/step_time_check.py --world-size 2 --model tiny

The planner needs what it would take from a datasheet, measured here instead: the FLOP/s one rank
achieves (one process training the same GPT, 6Ψ FLOPs per token: efficiency 1 of that) and the
network (a large and a small all-reduce between the ranks: bandwidth and latency, used as the
"node" level). Then it predicts each strategy's step and the ranks measure it (the median of the
slowest rank, in turns). The ratio says how far the time model carries to this machine; on CPU
ranks with gloo nothing overlaps (one thread computes and communicates), which the planner's
GPU model of streams does not assume, so expect it to predict low, FSDP most.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini.models import GPTConfig, SyntheticText, make_model
from fsdp_mini.planner.plan import plan
from fsdp_mini.planner.shapes import ModelShape
from fsdp_mini.training import median_of_slowest, train_in_turns, train_step


def single_process_flops(model: str, local_batch: int, steps: int = 4) -> float:
    """FLOP/s of one process training the GPT on one rank's share (6Ψ per token)."""
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model)
    net = make_model(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    times = []
    for step in range(steps + 1):
        batch = data.local_batch(step, local_batch, 0, 1)
        start = time.perf_counter()
        train_step(net, opt, batch)
        times.append(time.perf_counter() - start)
    seconds = sorted(times[1:])[len(times[1:]) // 2]
    return 6 * net.num_params() * local_batch * cfg.block_size / seconds


def rank_figures(rank, world_size, model, global_batch, steps) -> dict:
    torch.set_num_threads(1)
    big, small = torch.ones(2**20), torch.ones(1)          # 4 MiB and 4 B
    timed = {}
    for name, t in (("big", big), ("small", small)):
        seconds = []
        for _ in range(11):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            seconds.append(time.perf_counter() - start)
        timed[name] = sorted(seconds)[len(seconds) // 2]
    cfg = GPTConfig.sized(model)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    models = {}
    for s in ("ddp", "fsdp"):
        net = make_model(cfg)
        models[s] = fsdp_mini.parallelize(net, s, units=list(net.blocks),
                                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    out = train_in_turns(models, lambda step: data.local_batch(step, global_batch, rank,
                                                                world_size), steps)
    return {"all_reduce": timed, **{s: out[s]["seconds"] for s in out}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--model", choices=("tiny", "default"), default="default")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    n, local = args.world_size, args.global_batch // args.world_size
    flops = single_process_flops(args.model, local)
    per_rank = fsdp_mini.launch(rank_figures, n, args.model, args.global_batch, args.steps,
                                timeout=600)
    # Note: a ring all-reduce moves 2(N-1)/N of its payload per rank, in 2(N-1) steps: the
    # small one is the latency, the big one less the small one the bandwidth
    big = max(r["all_reduce"]["big"] for r in per_rank)
    small = max(r["all_reduce"]["small"] for r in per_rank)
    latency = small / (2 * (n - 1))
    bandwidth = 2 * (n - 1) / n * 4 * 2**20 / max(big - small, 1e-6) / 1e9
    # Note: ranks beyond the cores share them: each computes at cores/N of one process's rate
    flops *= min(1.0, (os.cpu_count() or 1) / n)
    p = plan(model=ModelShape.from_gpt(GPTConfig.sized(args.model)), gpus=n, precision="fp32",
             micro_batch=local, tflops=flops / 1e12, efficiency=1.0, gpus_per_node=n,
             node_bandwidth_gbs=bandwidth, node_latency_us=latency * 1e6,
             strategies=("ddp", "fsdp"))
    print(f"step_time_check: {args.model} GPT, {n} gloo ranks, {local} sequences per rank; "
          f"measured: {flops / 1e9:.2f} GFLOP/s per rank ({os.cpu_count()} cores shared), gloo "
          f"{bandwidth:.2f} GB/s and "
          f"{latency * 1e6:.0f} µs per ring step")
    print(f"{'strategy':8s} {'predicted ms':>13s} {'(compute':>9s} {'+ exposed)':>11s} "
          f"{'measured ms':>12s} {'predicted/measured':>19s}")
    for s in ("ddp", "fsdp"):
        measured = median_of_slowest([r[s] for r in per_rank])
        x = p.strategies[s]
        print(f"{s:8s} {x.step_seconds * 1e3:13.1f} {x.compute_seconds * 1e3:9.1f} "
              f"{x.exposed_comm_seconds * 1e3:11.1f} {measured * 1e3:12.1f} "
              f"{x.step_seconds / measured:19.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
