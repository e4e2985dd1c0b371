"""``fsdp-mini``: the kit's command line.

    fsdp-mini compare --world-size 4            # every strategy, one table
    fsdp-mini compare --json results.json       # and the figures as JSON (format in README)
    fsdp-mini compare --link-bandwidth 1 --link-latency 50   # on a simulated 1 GB/s network
    fsdp-mini compare --world-size 4 --shard-size 2          # and hsdp, 2 groups of 2
    fsdp-mini render-labs --out build/labs      # executed HTML copies of the labs
    fsdp-mini plan --params 7e9 --gpus 8 --gpu-mem 80   # will it fit? (formulas, no ranks)
    fsdp-mini doctor --gpus 4 --url http://localhost:8888   # the day before: what is wrong here
    fsdp-mini progress team1/ team2/ --html page.html  # every team's checks (the instructor)

Bad arguments are reported in one line on stderr with exit status 2, before any rank starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

from ..api import STRATEGIES
from ..arguments import count
from .doctor import add_doctor_parser, doctor_command
from .plan_cli import add_plan_parser, number, plan_command
from .progress import add_progress_parser, progress_command


def _default_world_size() -> int:
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.cuda.device_count()
    return 4


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line too (its usage is what --help prints)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fsdp-mini", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="train the tiny GPT under every strategy, side by side")
    cmp.add_argument("--world-size", type=number, default=None,
                     help="ranks to launch (default: GPUs if any, else 4 CPU processes)")
    cmp.add_argument("--strategies", default=None,
                     help=f"comma-separated, from {','.join(STRATEGIES)},hsdp (default: all but "
                          f"hsdp; with --shard-size, hsdp too)")
    cmp.add_argument("--shard-size", type=number, default=None, metavar="S",
                     help="hsdp: ranks per shard group, a divisor of the world size (e.g. GPUs "
                          "per host); adds hsdp to the default strategies")
    cmp.add_argument("--steps", type=number, default=8, help="training steps per strategy")
    cmp.add_argument("--global-batch", type=number, default=8,
                     help="sequences per step, split over the ranks (must divide by world size)")
    cmp.add_argument("--model", choices=("default", "tiny"), default="default",
                     help="GPT size: default (~3.2M parameters) or tiny (~28k)")
    cmp.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                     help="default: nccl with one GPU per rank if there are enough, else gloo")
    cmp.add_argument("--timeout", type=number, default=120.0, help="seconds a collective may hang")
    cmp.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    cmp.add_argument("--link-bandwidth", type=number, default=None, metavar="GB_PER_S",
                     help="simulate a network of this bandwidth (10⁹ B/s per rank; default: none)")
    cmp.add_argument("--link-latency", type=number, default=None, metavar="US",
                     help="the simulated network's latency per message, in µs (default 0)")
    ren = sub.add_parser("render-labs", help="run the labs and write executed HTML copies")
    ren.add_argument("--out", default="build/labs", help="folder for the HTML files")
    ren.add_argument("--ci", action="store_true", help="run at CI size (quick, small model)")
    ren.add_argument("labs", nargs="*", help="only these labs, by number or name (e.g. 03)")
    add_plan_parser(sub)
    add_progress_parser(sub)
    add_doctor_parser(sub)
    return parser


def render_command(args) -> int:
    import signal

    from .render_labs import Interrupted, render_labs
    try:
        render_labs(args.out, args.labs, ci=args.ci)
    except (ValueError, OSError) as err:  # Note: OSError: a notebook moved away while rendering
        print(f"fsdp-mini render-labs: error: {err}", file=sys.stderr)
        return 2
    except Interrupted as stop:
        print(f"fsdp-mini render-labs: interrupted ({stop.signal_name}) while running {stop.lab}; "
              f"its kernel and ranks were stopped and no HTML was written for it",
              file=sys.stderr)
        return 128 + signal.Signals[stop.signal_name].value
    return 0


def _error(message: str) -> int:
    """One clear line on stderr and exit status 2, like argparse's own usage errors."""
    print(f"fsdp-mini compare: error: {message}", file=sys.stderr)
    return 2


def _check_json_path(path: str | None) -> None:
    """Fail now, not after the whole run, if the report cannot be written to path."""
    if path is None:
        return
    if not path.strip():
        raise ValueError("--json needs the path of a file to write, e.g. --json report.json")
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise ValueError(f"--json {path} is a folder; give the path of a file to write")
    if not os.path.isdir(folder):
        problem = ("is a file, not a folder" if os.path.exists(folder)
                   else "does not exist; create it first")
        raise ValueError(f"--json {path}: the folder {folder} {problem}")
    try:
        # Note: do what the final write will do (create a file in that folder) rather than
        # predict it: os.access judges by the real, not the effective, user id.
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".fsdp-mini-check-")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise ValueError(f"--json {path}: cannot write in {folder} ({err.strerror or err}); "
                         "pick a writable folder") from None


def _check_args(args):
    """Every check of `compare`'s input, before any rank starts: (world_size, backend, config)."""
    from ..launcher.inputs import MAX_TIMEOUT_S, MAX_WORLD_SIZE, MIN_TIMEOUT_S, check_launch_args
    from .compare import CompareConfig

    # Note: each flag alone first (its range, then whether it is whole: 2.5 ranks), then what
    # they mean together
    world_size = args.world_size if args.world_size is not None else _default_world_size()
    if not 1 <= world_size <= MAX_WORLD_SIZE:  # Note: also false for nan
        raise ValueError(f"--world-size must be >= 1 and <= {MAX_WORLD_SIZE} (ranks on this machine), "
                         f"got {world_size}")
    world_size = count("--world-size", world_size, at_most=MAX_WORLD_SIZE, unit="ranks")
    if not MIN_TIMEOUT_S <= args.timeout <= MAX_TIMEOUT_S:  # Note: also false for nan
        raise ValueError(f"--timeout must be a number of seconds from {MIN_TIMEOUT_S:g} to "
                         f"{MAX_TIMEOUT_S:g}, got {args.timeout:g}")
    if not args.global_batch >= 1:
        raise ValueError(f"--global-batch must be >= 1, got {args.global_batch}")
    global_batch = count("--global-batch", args.global_batch, unit="sequences")
    if not args.steps >= CompareConfig.warmup + 2:
        raise ValueError(f"--steps must be at least {CompareConfig.warmup + 2} (warm-up, a timed "
                         f"and a memory-tracked step), got {args.steps}")
    steps = count("--steps", args.steps, unit="steps")
    shard_size = None if args.shard_size is None else count("--shard-size", args.shard_size,
                                                            unit="ranks")
    _check_link_args(args.link_bandwidth, args.link_latency)
    if global_batch % world_size:
        raise ValueError(f"--global-batch {global_batch} is not divisible by --world-size "
                         f"{world_size}; pick a multiple of {world_size}")
    names = (args.strategies if args.strategies is not None
             else ",".join(STRATEGIES + (("hsdp",) if shard_size is not None else ())))
    strategies = tuple(s.strip() for s in names.split(",") if s.strip())
    if shard_size is not None and "hsdp" not in strategies:
        raise ValueError(f"--shard-size is hsdp's, but --strategies {names} has no hsdp; add "
                         f"hsdp to --strategies, or leave --shard-size out")
    if shard_size is not None and world_size % shard_size:
        raise ValueError(f"--shard-size must divide --world-size {world_size}, got "
                         f"{shard_size}; use one of "
                         f"{[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    config = CompareConfig(strategies=strategies, steps=steps, global_batch=global_batch,
                           model=args.model, progress=sys.stdout.isatty(),
                           link_bandwidth_gbs=args.link_bandwidth,
                           link_latency_us=args.link_latency or 0.0, shard_size=shard_size)
    world_size, backend, _, _ = check_launch_args(world_size, args.backend, args.timeout)
    _check_json_path(args.json)
    return world_size, backend, config


def _check_link_args(bandwidth: float | None, latency: float | None) -> None:
    if bandwidth is None and latency is not None:
        raise ValueError("--link-latency needs --link-bandwidth: a simulated link has both, e.g. "
                         "--link-bandwidth 1 --link-latency 50")
    if bandwidth is not None and not 0 < bandwidth < math.inf:  # Note: also false for nan
        raise ValueError(f"--link-bandwidth must be a finite number of GB/s > 0, e.g. 1.0, got "
                         f"{bandwidth:g}")
    if latency is not None and not 0 <= latency < math.inf:
        raise ValueError(f"--link-latency must be a finite number of microseconds >= 0, e.g. 50, "
                         f"got {latency:g}")


def compare_command(args) -> int:
    from ..launcher import launch
    from ..models import make_model
    from .compare import compare_on_rank, format_table, gather_report, run_info

    try:
        world_size, backend, config = _check_args(args)
    except (ValueError, TypeError) as err:
        return _error(str(err))
    params = make_model(config.gpt()).num_params()
    link = config.link()
    print(f"fsdp-mini compare: GPT with {params / 1e6:.2f}M parameters (Ψ), world size "
          f"{world_size}, {config.steps} steps, global batch {config.global_batch}"
          + (f", simulated link {link.describe()}" if link else ""), flush=True)
    started = time.perf_counter()
    per_rank = launch(compare_on_rank, world_size, config, backend=backend, timeout=args.timeout)
    report = gather_report(per_rank, world_size, params, link, run_info(config, backend))
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
    if args.command == "render-labs":
        return render_command(args)
    if args.command == "plan":
        return plan_command(args, _check_json_path)
    if args.command == "progress":
        return progress_command(args)
    if args.command == "doctor":
        return doctor_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
