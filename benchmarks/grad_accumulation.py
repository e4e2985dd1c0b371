"""Gradient accumulation under fsdp: keep whole gradients between micro-batches (``no_sync``), or
reduce-scatter after every micro-batch? Bytes sent and peak memory per rank, side by side.

    python benchmarks/grad_accumulation.py [--world-size 2] [--micro-batches 4]
                                           [--model tiny|default] [--strategies fsdp ddp zero2]

One launch. On every rank, for each strategy and each way, a fresh model trains a warm-up step
(so AdamW's state exists), then one measured step of k micro-batches under ``track_memory``:

    no_sync   the first k−1 backwards inside ``fsdp_mini.no_sync``, the last one outside
    every     all k backwards outside: the gradients are communicated after each of them

The ledger gives that step's bytes by collective; ``track_memory`` the peak (``own_peak_bytes``)
and the ``grads`` category. Both ways must end with the same weights (checked, printed).
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from functools import partial

import torch

import fsdp_mini
from fsdp_mini.models import GPTConfig, SyntheticText, make_model

WAYS = ("no_sync", "every")


def accumulation_step(model, optimizer, x, y, k: int, quiet: bool) -> None:
    """One optimizer step over k micro-batches; with ``quiet``, the first k−1 under no_sync."""
    for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k))):
        with fsdp_mini.no_sync(model) if quiet and i < k - 1 else nullcontext():
            (model(xm, ym)[1] / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def measure_rank(rank, world_size, strategies, k, model_size, global_batch):
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model_size)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    out = {}
    for strategy in strategies:
        for way in WAYS:
            model = make_model(cfg)
            model, optimizer = fsdp_mini.parallelize(
                model, strategy, units=list(model.blocks),
                optimizer=partial(torch.optim.AdamW, lr=1e-3))
            ledger = model.fsdp_mini.comm.ledger
            for step in range(2):
                x, y = data.local_batch(step, global_batch, rank, world_size)
                with fsdp_mini.track_memory(model, optimizer) if step else nullcontext() as mem:
                    accumulation_step(model, optimizer, x, y, k, quiet=way == "no_sync")
            totals = ledger.totals(step=ledger.step)
            state = fsdp_mini.full_state_dict(model)
            out[strategy, way] = {
                "sent": {op: t.sent_bytes for op, t in totals.items()},
                "calls": {op: t.calls for op, t in totals.items()},
                "own_peak": mem.own_peak_bytes, "grads_peak": mem.peak_by_category["grads"],
                "grads_at_peak": mem.at_peak["grads"],
                "numel": model.fsdp_mini.numel()[0],
                "state": state if rank == 0 else None}
    return out


def _row(label: str, a: float, b: float) -> str:
    ratio = f"{a / b:8.2f}x" if b else "       -"
    return f"  {label:<38}{a:>14,.0f}{b:>14,.0f}  {ratio}"


def report(results, strategies, k: int, world_size: int, model_size: str) -> None:
    for strategy in strategies:
        per_rank = [{way: r[strategy, way] for way in WAYS} for r in results]
        first = per_rank[0]
        psi = first["no_sync"]["numel"]
        print(f"\n{strategy}, world size {world_size}, k = {k} micro-batches, {model_size} GPT "
              f"(Ψ = {psi:,} parameters), per rank, one step")
        print(f"  {'':<38}{'no_sync':>14}{'every':>14}  {'ratio':>8}")
        ops = sorted(set(first["no_sync"]["sent"]) | set(first["every"]["sent"]))
        for op in ops:
            a, b = (first[w]["sent"].get(op, 0.0) for w in WAYS)
            calls = "/".join(str(first[w]["calls"].get(op, 0)) for w in WAYS)
            print(_row(f"{op} sent, B ({calls} calls)", a, b))
        print(_row("total sent, B", *(sum(first[w]["sent"].values()) for w in WAYS)))
        print(_row("peak memory, B (worst rank)",
                   *(max(r[w]["own_peak"] for r in per_rank) for w in WAYS)))
        print(_row("  grads at that peak, B", *(first[w]["grads_at_peak"] for w in WAYS)))
        print(_row("  highest grads, B", *(first[w]["grads_peak"] for w in WAYS)))
        a, b = (first[w]["state"] for w in WAYS)
        diff = max(((a[n] - b[n]).norm() / b[n].norm().clamp_min(1e-30)).item() for n in b)
        print(f"  same weights after the step: largest relative difference {diff:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--model", choices=("tiny", "default"), default="tiny")
    parser.add_argument("--strategies", nargs="+", default=["fsdp"],
                        choices=("ddp", "zero1", "zero2", "fsdp"))
    parser.add_argument("--global-batch", type=int, default=16,
                        help="sequences per step, divisible by world size x micro-batches")
    args = parser.parse_args()
    if args.global_batch % (args.world_size * args.micro_batches):
        parser.error(f"--global-batch {args.global_batch} must be divisible by world size x "
                     f"micro-batches = {args.world_size * args.micro_batches}")
    results = fsdp_mini.launch(measure_rank, args.world_size, args.strategies,
                               args.micro_batches, args.model, args.global_batch, timeout=300)
    report(results, args.strategies, args.micro_batches, args.world_size, args.model)


if __name__ == "__main__":
    main()
