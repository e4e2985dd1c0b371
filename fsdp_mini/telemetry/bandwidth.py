"""All-reduce time against message size, measured on live ranks, and what it says: the latency
floor and the size that reaches half the peak bus bandwidth (Hockney's n½).

Each size is timed in rounds where the sizes take turns, the round's time is its slowest rank's,
and each size gets the median of its rounds: a burst of other work on a shared laptop then moves
one round, not the result. Drawn by :func:`fsdp_mini.plots.collectives.plot_bandwidth`.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ..comm.collectives import Comm
from .units import busbw_factor, fmt_bytes

__all__ = ["all_reduce_sweep", "bandwidth_summary"]


def all_reduce_sweep(rank: int, world_size: int, sizes, repeats: int = 9) -> list[dict]:
    """Time all-reduces of ``sizes`` bytes (float32) through :class:`fsdp_mini.Comm`: per size
    the median of ``repeats`` rounds (a round's time: its slowest rank's), algbw and busbw.

    Note: the sizes take turns, one all-reduce each per round, so a burst of load from other
    programs slows one round of every size, not every repeat of one size."""
    comm = Comm()
    device = comm.device
    xs = [torch.ones(max(1, int(nbytes) // 4), device=device) for nbytes in sizes]
    times = torch.zeros(1 + repeats, len(xs), dtype=torch.float64, device=device)
    for i in range(1 + repeats):  # Note: round 0 is a warm-up, not counted
        for j, x in enumerate(xs):
            comm.barrier()  # start together, so one rank's late arrival is not timed
            start = time.perf_counter()
            comm.all_reduce(x, label=f"sweep {fmt_bytes(4 * x.numel())}")
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # Note: the host returns before the GPU is done
            times[i, j] = time.perf_counter() - start
    if world_size > 1:
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank sets each round's pace
    rows, factor = [], busbw_factor("all_reduce", world_size)
    for x, round_times in zip(xs, times[1:].cpu().T.tolist()):
        payload, seconds = 4 * x.numel(), statistics.median(round_times)
        rows.append({"bytes": payload, "seconds": seconds, "algbw": payload / seconds,
                     "busbw": payload / seconds * factor})
    return rows


def bandwidth_summary(rows: list[dict], half: float = 0.5, small: int = 1024) -> dict:
    """From a sweep: the latency floor, the peak busbw, and the smallest size that reaches
    ``half`` of it (Hockney's n½: below it, latency dominates). The floor is the median time of
    the messages up to ``small`` bytes (all latency on any link), so one slow row on a busy
    machine does not move it; ``small_spread`` is the slowest of them over the fastest."""
    if not rows:
        raise ValueError("no rows: run all_reduce_sweep first")
    rows, peak = sorted(rows, key=lambda r: r["bytes"]), max(r["busbw"] for r in rows)
    few = [r["seconds"] for r in rows if r["bytes"] <= small] or [rows[0]["seconds"]]
    return {"latency_floor": statistics.median(few), "small_sizes": len(few),
            "small_spread": max(few) / min(few), "peak_busbw": peak,
            "n_half": next(r["bytes"] for r in rows if r["busbw"] >= half * peak)}
