"""``fsdp-mini``: the kit's command line.

    fsdp-mini compare --world-size 4            # every strategy, one table
    fsdp-mini compare --json results.json       # and the figures as JSON (format in README)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .api import STRATEGIES


def _default_world_size() -> int:
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.cuda.device_count()
    return 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fsdp-mini", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="train the tiny GPT under every strategy, side by side")
    cmp.add_argument("--world-size", type=int, default=None,
                     help="ranks to launch (default: GPUs if any, else 4 CPU processes)")
    cmp.add_argument("--strategies", default=",".join(STRATEGIES),
                     help=f"comma-separated, from {','.join(STRATEGIES)} (default: all)")
    cmp.add_argument("--steps", type=int, default=8, help="training steps per strategy")
    cmp.add_argument("--global-batch", type=int, default=8,
                     help="sequences per step, split over the ranks (must divide by world size)")
    cmp.add_argument("--model", choices=("default", "tiny"), default="default",
                     help="GPT size: default (~3.2M parameters) or tiny (~28k)")
    cmp.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                     help="default: nccl with one GPU per rank if there are enough, else gloo")
    cmp.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may hang")
    cmp.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    return parser


def compare_command(args) -> int:
    from .compare import CompareConfig, compare_on_rank, format_table, gather_report
    from .launcher import launch
    from .models import make_model

    world_size = args.world_size if args.world_size is not None else _default_world_size()
    if args.global_batch % max(world_size, 1):
        raise SystemExit(f"fsdp-mini compare: --global-batch {args.global_batch} is not divisible "
                         f"by --world-size {world_size}; pick a multiple of {world_size}")
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    try:
        config = CompareConfig(strategies=strategies, steps=args.steps,
                               global_batch=args.global_batch, model=args.model,
                               progress=sys.stdout.isatty())
    except ValueError as err:
        raise SystemExit(f"fsdp-mini compare: {err}")
    params = make_model(config.gpt()).num_params()
    print(f"fsdp-mini compare: GPT with {params / 1e6:.2f}M parameters (Ψ), world size "
          f"{world_size}, {config.steps} steps, global batch {config.global_batch}", flush=True)
    started = time.perf_counter()
    per_rank = launch(compare_on_rank, world_size, config, backend=args.backend,
                      timeout=args.timeout)
    report = gather_report(per_rank, world_size, params)
    print(format_table(report))
    print(f"({time.perf_counter() - started:.0f} s; peak = tensor bytes this training added, "
          f"state = params + grads + optimizer state after a step; theory from the ZeRO formulas)")
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.json)  # written atomically: never a half-written file
        print(f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "compare":
        return compare_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
