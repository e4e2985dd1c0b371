"""What watching costs: step time with telemetry (and the collective check) on vs off.

    python benchmarks/telemetry_overhead.py [--world-size 4] [--monitor log|none]

One launch. Every rank trains one model, alternating steps with telemetry recording (events
streamed to the caller, which tails them live) and paused; then two models with the
mismatched-collective check on and off, alternating steps. Median step times and ratios are
printed (per rank; the mean and the worst rank); the target for telemetry is at most 3 %.
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
from fsdp_mini.telemetry import EventLog, Recorder
from fsdp_mini.training import train_step


def _step(model, optimizer, x, y) -> float:
    start = time.perf_counter()
    loss = train_step(model, optimizer, (x, y))
    return time.perf_counter() - start, loss


def overhead_rank(rank, world_size, strategy, model_size, steps, global_batch):
    cfg = GPTConfig.sized(model_size)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    adamw = partial(torch.optim.AdamW, lr=1e-3)
    rec = Recorder.from_env(run=strategy)
    model, opt = fsdp_mini.parallelize(make_model(cfg), strategy, optimizer=adamw,
                                       units=None, recorder=rec) if strategy != "fsdp" else \
        fsdp_mini.parallelize(m := make_model(cfg), strategy, optimizer=adamw,
                              units=list(m.blocks), recorder=rec)
    on, off = [], []
    for step in range(2 + 2 * steps):  # two warm-up steps, then on/off alternating
        recording = step % 2 == 1
        rec.resume() if recording else rec.pause()
        x, y = data.local_batch(step, global_batch, rank, world_size)
        dist.barrier()
        seconds, loss = _step(model, opt, x, y)
        rec.step_end(loss)
        if step >= 2:
            (on if recording else off).append(seconds)
    rec.close()
    checked = {}
    for check in (False, True):
        m = make_model(cfg)
        checked[check] = fsdp_mini.parallelize(m, strategy, optimizer=adamw, units=list(m.blocks)
                                               if strategy == "fsdp" else None,
                                               check_collectives=check)
    times = {False: [], True: []}
    for s in range(1 + steps):
        x, y = data.local_batch(s, global_batch, rank, world_size)
        for check in ((False, True) if s % 2 else (True, False)):
            dist.barrier()
            seconds, _ = _step(*checked[check], x, y)
            if s > 0:
                times[check].append(seconds)
    return {"telemetry_on": statistics.median(on), "telemetry_off": statistics.median(off),
            "check_on": statistics.median(times[True]), "check_off": statistics.median(times[False]),
            "events": len(rec.events)}


def _headless_dashboard():
    from fsdp_mini.widgets import Dashboard
    dash = Dashboard()
    dash._displayed = True  # no frontend here: draw, but do not print the widget's text form
    return dash


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--strategy", default="fsdp", choices=fsdp_mini.STRATEGIES[1:])
    parser.add_argument("--model", choices=("tiny", "default"), default="default")
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each kind")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--monitor", choices=("log", "dashboard", "none"), default="log",
                        help="log: the caller tails the events live; dashboard: and draws the "
                             "live dashboard (headless here, its HTML and PNG are still made)")
    args = parser.parse_args(argv)
    monitor = {"log": EventLog, "none": lambda: None, "dashboard": _headless_dashboard}[
        args.monitor]()
    per_rank = fsdp_mini.launch(overhead_rank, args.world_size, args.strategy, args.model,
                                args.steps, args.global_batch, monitor=monitor)
    tel_ratios = [r["telemetry_on"] / r["telemetry_off"] for r in per_rank]
    chk_ratios = [r["check_on"] / r["check_off"] for r in per_rank]
    tel, chk = sum(tel_ratios) / len(tel_ratios), sum(chk_ratios) / len(chk_ratios)
    r0 = per_rank[0]
    seen = sum(r.events for r in monitor.runs) if args.monitor == "dashboard" else \
        len(monitor.events) if monitor else 0
    print(f"world size {args.world_size}, {args.strategy}, {args.model} GPT, monitor={args.monitor}"
          f" ({seen} events seen live)")
    print(f"telemetry         on {r0['telemetry_on'] * 1e3:6.1f} ms  off "
          f"{r0['telemetry_off'] * 1e3:6.1f} ms (rank 0); ratio mean over ranks {tel:.3f}, worst "
          f"{max(tel_ratios):.3f}; target <= 1.03: {'met' if tel <= 1.03 else 'NOT met'}")
    print(f"collective check  on {r0['check_on'] * 1e3:6.1f} ms  off {r0['check_off'] * 1e3:6.1f}"
          f" ms (rank 0); ratio mean over ranks {chk:.3f}, worst {max(chk_ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
