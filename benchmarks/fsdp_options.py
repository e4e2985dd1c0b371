"""What each fsdp option costs and saves, side by side in one run: step time, memory, bytes.

    python benchmarks/fsdp_options.py                      # world size 4, gloo, the default GPT
    python benchmarks/fsdp_options.py --link-bandwidth 0.05   # the same on a slow simulated link

Every rank builds one model per variant and trains them in alternating rounds (the order turns
every step), so the machine's load hits all alike. Step time: median of the timed steps, slowest
rank. Memory: one step under ``track_memory`` per variant (own peak, and the ``activations`` and
``gathered_params`` categories at their highest). Bytes: the ledger's, per rank per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial

import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini.models import GPTConfig, SyntheticText, make_model
from fsdp_mini.training import train_step

VARIANTS = {
    "plain": {},
    "prefetch": {"prefetch": True},
    "checkpointing": {"activation_checkpointing": True},
    "prefetch + checkpointing": {"prefetch": True, "activation_checkpointing": True},
    "prefetch + bf16": {"prefetch": True, "param_dtype": torch.bfloat16},
}


def bench_rank(rank: int, world_size: int, model_size: str, steps: int, warmup: int,
               global_batch: int, link) -> dict:
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model_size)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    models = {}
    for name, options in VARIANTS.items():
        model = make_model(cfg)
        models[name] = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks), link=link,
                                             optimizer=partial(torch.optim.AdamW, lr=1e-3),
                                             **options)
    times = {name: [] for name in VARIANTS}
    for step in range(warmup + steps):
        batch = data.local_batch(step, global_batch, rank, world_size)
        names = list(VARIANTS)[step % len(VARIANTS):] + list(VARIANTS)[:step % len(VARIANTS)]
        for name in names:
            dist.barrier()
            start = time.perf_counter()
            train_step(*models[name], batch)
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    out = {}
    batch = data.local_batch(warmup + steps, global_batch, rank, world_size)
    for name, (model, optimizer) in models.items():
        dist.barrier()
        ledger = model.fsdp_mini.comm.ledger
        with fsdp_mini.track_memory(model, optimizer) as mem:
            train_step(model, optimizer, batch)
        out[name] = {"seconds": statistics.median(times[name]), "peak": mem.own_peak_bytes,
                     "activations": mem.peak_by_category["activations"],
                     "gathered": mem.peak_by_category["gathered_params"],
                     "sent": ledger.sent_bytes(ledger.step)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--model", choices=("default", "tiny"), default="default")
    parser.add_argument("--steps", type=int, default=8, help="timed steps after warm-up")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--link-bandwidth", type=float, metavar="GB_PER_S",
                        help="simulate a link of this bandwidth (fsdp_mini.Link)")
    parser.add_argument("--link-latency", type=float, default=50.0, metavar="US")
    args = parser.parse_args(argv)
    link = (fsdp_mini.Link(args.link_bandwidth, args.link_latency)
            if args.link_bandwidth is not None else None)
    started = time.perf_counter()
    per_rank = fsdp_mini.launch(bench_rank, args.world_size, args.model, args.steps, args.warmup,
                                args.global_batch, link, timeout=300)
    print(f"fsdp options, world size {args.world_size}, gloo, {args.model} GPT, "
          f"{'link ' + link.describe() if link else 'no simulated link'}, {args.steps} timed "
          f"steps, alternating rounds ({time.perf_counter() - started:.0f} s); ratios to plain")
    print(f"{'variant':<26} {'step ms':>8} {'×':>5} {'peak MiB':>9} {'×':>5} "
          f"{'activ. MiB':>10} {'×':>5} {'gathered MiB':>12} {'sent MB':>8} {'×':>5}")
    worst = {name: {"seconds": max(r[name]["seconds"] for r in per_rank),
                    **{k: max(r[name][k] for r in per_rank)
                       for k in ("peak", "activations", "gathered", "sent")}}
             for name in VARIANTS}
    base = worst["plain"]
    for name, w in worst.items():
        print(f"{name:<26} {w['seconds'] * 1e3:>8.1f} {w['seconds'] / base['seconds']:>5.2f} "
              f"{w['peak'] / 2**20:>9.2f} {w['peak'] / base['peak']:>5.2f} "
              f"{w['activations'] / 2**20:>10.2f} {w['activations'] / base['activations']:>5.2f} "
              f"{w['gathered'] / 2**20:>12.2f} {w['sent'] / 1e6:>8.2f} "
              f"{w['sent'] / base['sent']:>5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
