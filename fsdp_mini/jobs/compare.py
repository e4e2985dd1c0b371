"""The main job: train the tiny GPT under every strategy and set measurement beside theory.

``fsdp-mini compare --world-size 4`` runs :func:`compare_on_rank` on 4 ranks. For each strategy
every rank builds the same model, trains it for a few steps on its slice of the same global
batches, and reports: peak tensor memory by category (one tracked step), the model state it keeps
between steps, the bytes it sent per step, its median step time and its final loss. ``single``
is the reference: rank 0 alone trains on the whole global batch. With ``link_bandwidth_gbs``
(``--link-bandwidth``) every strategy runs on a simulated network (:class:`~fsdp_mini.Link`).
"""

from __future__ import annotations

import gc
import statistics
import sys
from dataclasses import asdict, dataclass, field
from functools import partial

import torch
import torch.distributed as dist

from ..api import STRATEGIES, expected_costs, parallelize
from ..arguments import choice, flag, number
from ..comm.link import Link
from ..launcher import rank_device
from ..memory import PERSISTENT
from ..models import GPTConfig, SyntheticText, make_model
from ..registry import get_strategy
from ..training import train

RUNNABLE = STRATEGIES + ("hsdp",)  # hsdp runs when asked for, with a shard size


@dataclass
class CompareConfig:
    strategies: tuple[str, ...] = STRATEGIES
    steps: int = 8
    warmup: int = 2
    global_batch: int = 8
    model: str = "default"  # or "tiny"
    lr: float = 1e-3
    bucket_mb: float = 2.0  # several buckets, so DDP/ZeRO overlap communication with backward
    progress: bool = False
    link_bandwidth_gbs: float | None = None  # a simulated link (None: the real one)
    link_latency_us: float = 0.0
    shard_size: int | None = None  # for "hsdp": ranks per shard group (divides the world size)

    def gpt(self) -> GPTConfig:
        return GPTConfig.sized(self.model)

    def link(self) -> Link | None:
        """A fresh simulated link for one model, or None."""
        if self.link_bandwidth_gbs is None:
            return None
        return Link(self.link_bandwidth_gbs, self.link_latency_us)

    def __post_init__(self):
        # Note: checked here, not only in the CLI, so a bad config fails in the caller before any
        # rank starts, whether it came from `fsdp-mini compare` or from Python. Each field alone
        # first (its type, its range), then what they mean together.
        names = self.strategies
        if not isinstance(names, (tuple, list)) or not all(isinstance(s, str) for s in names):
            raise TypeError(f"strategies must be a tuple of names from {', '.join(STRATEGIES)}, "
                            f"e.g. ('ddp', 'fsdp'), got {self.strategies!r}")
        self.strategies = tuple(self.strategies)
        if not self.strategies:
            raise ValueError(f"strategies must name at least one of {', '.join(STRATEGIES)}, got none")
        repeated = sorted({s for s in self.strategies if self.strategies.count(s) > 1})
        if repeated:
            raise ValueError(f"strategies name {repeated} more than once; name each strategy once")
        unknown = [s for s in self.strategies if s not in RUNNABLE]
        if unknown:
            raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(RUNNABLE)}")
        for name in ("steps", "warmup", "global_batch") + (
                ("shard_size",) if self.shard_size is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0 steps, got {self.warmup}")
        if self.steps < self.warmup + 2:
            raise ValueError(f"steps must be at least warmup + 2 = {self.warmup + 2} (a timed "
                             f"step and a memory-tracked step), got {self.steps}")
        if self.global_batch < 1:
            raise ValueError(f"global_batch must be >= 1 (sequences per step), got {self.global_batch}")
        if self.shard_size is not None and self.shard_size < 1:
            raise ValueError(f"shard_size must be an int >= 1 (ranks per shard group), got "
                             f"{self.shard_size}")
        choice("model", self.model, ("default", "tiny"))
        self.lr = number("lr", self.lr, above=0, example="1e-3")
        self.bucket_mb = number("bucket_mb", self.bucket_mb, unit="MB", above=0)
        flag("progress", self.progress)
        self.link_latency_us = number("link_latency_us", self.link_latency_us, unit="µs",
                                      at_least=0)
        if "hsdp" in self.strategies and self.shard_size is None:
            raise ValueError("hsdp needs shard_size (--shard-size S): the ranks that shard the "
                             "model together, a divisor of the world size")
        if self.shard_size is not None and "hsdp" not in self.strategies:
            raise ValueError(f"shard_size is hsdp's, but strategies {self.strategies} has no "
                             f"hsdp; add hsdp, or leave shard_size out")
        if self.link_bandwidth_gbs is None and self.link_latency_us != 0:
            raise ValueError("link_latency_us needs link_bandwidth_gbs: a simulated link has both")
        self.link()  # Note: Link checks its own numbers


@dataclass
class RankResult:
    rank: int
    peak_bytes: int
    peak_by_category: dict[str, int]
    persistent_bytes: int
    sent_bytes_per_step: float
    step_seconds: float
    final_loss: float
    losses: list[float] = field(default_factory=list)


def compare_on_rank(rank: int, world_size: int, config: CompareConfig) -> dict:
    """Run every strategy on this rank; return {strategy: {"theory": …, "rank": RankResult}}."""
    gpt = config.gpt()
    data = SyntheticText(gpt.vocab_size, gpt.block_size)
    out = {}
    for i, strategy in enumerate(config.strategies):
        if strategy == "single":
            result = _run("single", 0, 1, config, data, whole_batch=True) if rank == 0 else None
            if world_size > 1:
                dist.barrier()
        else:
            result = _run(strategy, rank, world_size, config, data)
        if result is not None:
            out[strategy] = result
        if config.progress and rank == 0:
            _progress_bar(i + 1, len(config.strategies), strategy)
        gc.collect()
    return out


def _run(strategy, rank, world_size, config, data, whole_batch=False):
    device = rank_device()
    model = make_model(config.gpt()).to(device)
    options = ({"bucket_mb": config.bucket_mb}
               if "bucket_mb" in get_strategy(strategy).options() else {})
    if strategy == "hsdp":
        options["shard_size"] = config.shard_size
    model, optimizer = parallelize(model, strategy, units=list(model.blocks),
                                   optimizer=partial(torch.optim.AdamW, lr=config.lr),
                                   link=config.link(), **options)

    def batches(step):
        x, y = (data.batch(step, config.global_batch) if whole_batch else
                data.local_batch(step, config.global_batch, rank, world_size))
        return x.to(device), y.to(device)

    last = config.steps - 1  # the step measured under track_memory (not timed)
    run = train(model, optimizer, batches, config.steps, track_memory_at=last)
    mem = run.memory
    persistent = sum(mem.snapshots[-1].by_category[c] for c in PERSISTENT)  # "after_step"
    result = RankResult(rank, mem.own_peak_bytes, dict(mem.peak_by_category), persistent,
                        run.sent_bytes[last - 1], statistics.median(run.step_seconds[
                            config.warmup:last]), run.losses[-1], run.losses)
    return {"theory": expected_costs(model), "rank": result}


def _progress_bar(done: int, total: int, name: str) -> None:
    width = 30
    filled = width * done // total
    sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name:<6}")
    if done == total:
        sys.stdout.write("\n")
    sys.stdout.flush()


def run_info(config: CompareConfig, backend: str) -> dict:
    """Where and how a report was measured (for its readers: a slide's caption, say)."""
    gpu = backend == "nccl" and torch.cuda.is_available()
    return {"backend": backend, "device": torch.cuda.get_device_name(0) if gpu else "cpu",
            "torch": torch.__version__, "model": config.model, "steps": config.steps,
            "global_batch": config.global_batch}


def gather_report(per_rank: list[dict], world_size: int, params: int,
                  link: Link | None = None, run: dict | None = None) -> dict:
    """Merge the ranks' results into the JSON report of ``fsdp-mini compare --json``."""
    strategies = {}
    for rank_out in per_rank:
        for name, res in rank_out.items():
            entry = strategies.setdefault(name, {"theory": res["theory"], "ranks": []})
            entry["ranks"].append(asdict(res["rank"]))
    return {"world_size": world_size, "params": params, "strategies": strategies,
            "link": link.as_dict() if link is not None else None, "run": run}


def format_table(report: dict) -> str:
    """One table: per strategy and rank, memory by category, bytes, time, loss."""
    cats = ("params", "gathered_params", "grads", "optimizer_state", "comm_buffers", "activations")
    short = ("param", "gathr", "grads", "optim", "comm", "activ")
    head = (f"{'strategy':<8} {'rank':>4} {'peak MiB':>9} " + " ".join(f"{s:>6}" for s in short)
            + f" {'state MiB':>9} {'theory':>7} {'sent MiB/step':>13} {'theory':>7}"
            f" {'step ms':>8} {'loss':>7}")
    lines = [head, "-" * len(head)]
    for name, entry in report["strategies"].items():
        th = entry["theory"]
        for r in entry["ranks"]:
            cat_mib = " ".join(f"{r['peak_by_category'][c] / 2**20:6.2f}" for c in cats)
            lines.append(
                f"{name:<8} {r['rank']:>4} {r['peak_bytes'] / 2**20:9.2f} {cat_mib}"
                f" {r['persistent_bytes'] / 2**20:9.2f} {th['persistent_bytes'] / 2**20:7.2f}"
                f" {r['sent_bytes_per_step'] / 2**20:13.3f} {th['sent_bytes_per_step'] / 2**20:7.3f}"
                f" {r['step_seconds'] * 1e3:8.1f} {r['final_loss']:7.4f}")
        losses = [r["final_loss"] for r in entry["ranks"]]
        lines.append(f"{'':<8} {'mean':>4} final loss over ranks {sum(losses) / len(losses):.5f}")
    return "\n".join(lines)
