"""Functions the checkpoint tests run on every rank (see tests/test_checkpoint.py).

Every run trains the odd-shaped model (a frozen parameter, a buffer, a unit) on the same global
batches as tests/workers.py, so runs at different world sizes and strategies agree.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from workers import OPTIMIZERS, make_odd, odd_batch

import fsdp_mini

SAVED_AT = 3  # steps trained before the checkpoint


def build(strategy: str, opt_name: str, seed: int = 0):
    model = make_odd(seed)
    return fsdp_mini.parallelize(model, strategy, optimizer=OPTIMIZERS[opt_name],
                                 units=[model.inner])


def train_steps(model, optimizer, steps, rank: int, world_size: int) -> None:
    for step in steps:
        x, y = odd_batch(step, rank, world_size)
        model(x, y)[1].backward()
        optimizer.step()
        optimizer.zero_grad()


def save_runs(rank: int, world_size: int, root: str, configs):
    """Per (strategy, optimizer): 3 steps, then a sharded and a full checkpoint in
    ``root/strategy-opt/{sharded,full}``; returns (rank 0) the full parameters after one more
    step, the uninterrupted run, by ``"strategy-opt"``."""
    torch.set_num_threads(1)
    after = {}
    for strategy, opt_name in configs:
        where = Path(root) / f"{strategy}-{opt_name}"
        model, optimizer = build(strategy, opt_name)
        train_steps(model, optimizer, range(SAVED_AT), rank, world_size)
        fsdp_mini.save_checkpoint(model, optimizer, where / "sharded", step=SAVED_AT)
        fsdp_mini.save_checkpoint(model, optimizer, where / "full", sharded=False)
        train_steps(model, optimizer, [SAVED_AT], rank, world_size)
        after[where.name] = fsdp_mini.full_state_dict(model)
    return after if rank == 0 else None


def resume_runs(rank: int, world_size: int, root: str, sources, strategies,
                torch_file: str | None = None):
    """Load each source's sharded checkpoint under each strategy and write what was loaded as
    a full checkpoint (``loaded``); returns (rank 0) the full parameters after one more step,
    by (source, strategy). With ``torch_file``, also load that full checkpoint into torch's
    fully_shard model (in this launch: each launch costs seconds): ``into_fully_shard``."""
    torch.set_num_threads(1)
    after = {}
    for source in sources:
        opt_name = source.split("-")[1]
        for strategy in strategies:
            out = Path(root) / source / f"resumed-{strategy}-ws{world_size}"
            model, optimizer = build(strategy, opt_name, seed=1)  # other weights: overwritten
            meta = fsdp_mini.load_checkpoint(model, optimizer, Path(root) / source / "sharded")
            assert meta["step"] == SAVED_AT, meta
            fsdp_mini.save_checkpoint(model, optimizer, out / "loaded", sharded=False)
            train_steps(model, optimizer, [SAVED_AT], rank, world_size)
            after[source, strategy] = fsdp_mini.full_state_dict(model)
    into_torch = into_fully_shard(rank, world_size, torch_file) if torch_file else None
    return {"next": after, "torch": into_torch} if rank == 0 else None


def die_while_saving(rank: int, world_size: int, root: str, victim: int) -> None:
    """Save a good checkpoint (and a copy) after one step; after a second step, rank ``victim``
    dies in the middle of the next save: its file written, before the commit."""
    torch.set_num_threads(1)
    from fsdp_mini.checkpoint import atomic
    model, optimizer = build("fsdp", "adamw")
    train_steps(model, optimizer, [0], rank, world_size)
    for name in ("ckpt", "copy"):
        fsdp_mini.save_checkpoint(model, optimizer, Path(root) / name)
    train_steps(model, optimizer, [1], rank, world_size)
    if rank == victim:
        atomic.ranks_that_failed = lambda *args: os._exit(3)  # file written
    fsdp_mini.save_checkpoint(model, optimizer, Path(root) / "ckpt")


def into_fully_shard(rank: int, world_size: int, full_file: str):
    """A full checkpoint into torch's ``fully_shard`` model through torch's DCP state-dict API;
    then one step. Returns (on rank 0) the full states read back before and after it."""
    torch.set_num_threads(1)
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard
    from torch.utils._pytree import tree_map
    model = make_odd(seed=1)
    fully_shard(model.inner)
    fully_shard(model)
    optimizer = OPTIMIZERS["adamw"]([p for p in model.parameters() if p.requires_grad])
    saved = torch.load(full_file, weights_only=True)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    set_model_state_dict(model, saved["model"], options=full)
    set_optimizer_state_dict(model, optimizer, saved["optimizer"], options=full)
    loaded = tree_map(lambda t: t.clone() if torch.is_tensor(t) else t,  # the step changes them
                      {"model": get_model_state_dict(model, options=full),
                       "optimizer": get_optimizer_state_dict(model, optimizer, options=full)})
    train_steps(model, optimizer, [SAVED_AT], rank, world_size)
    after = get_model_state_dict(model, options=full)
    return {"loaded": loaded, "next": after} if rank == 0 else None


# -- a save destroys nothing, changes no random state (tests/test_checkpoint_safety.py) ----------

def try_save(rank: int, world_size: int, path: str, strategy: str = "fsdp"):
    """Build, one step, save to ``path``: ``(kind of error or None, its message, seconds)``."""
    import time
    torch.set_num_threads(1)
    model, optimizer = build(strategy, "adamw")
    train_steps(model, optimizer, [0], rank, world_size)
    start = time.monotonic()
    try:
        fsdp_mini.save_checkpoint(model, optimizer, path)
    except Exception as e:  # noqa: BLE001  (the test reads what each rank saw)
        return type(e).__name__, str(e), time.monotonic() - start
    return None, "", time.monotonic() - start


def slow_save(rank: int, world_size: int, path: str, release: str):
    """A save that holds on: every rank waits, after writing its file, until ``release`` exists
    (at most 60 s)."""
    import time

    from fsdp_mini.checkpoint import atomic
    agree = atomic.ranks_that_failed

    def slowly(*args):
        until = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < until:
            time.sleep(0.02)
        return agree(*args)
    atomic.ranks_that_failed = slowly
    return os.getpid(), try_save(rank, world_size, path)


def one_rank_cannot_write(rank: int, world_size: int, path: str, victim: int):
    """Rank ``victim``'s file cannot be written (as on a full disk): what every rank saw."""
    from fsdp_mini.checkpoint import atomic
    if rank == victim:
        def full_disk(self, name, obj):
            raise OSError(28, "No space left on device", str(self.tmp / name))
        atomic.CheckpointWriter.write_here = full_disk
    return try_save(rank, world_size, path)


def random_states() -> dict:
    import random

    import numpy as np
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": np.random.get_state()[1].copy()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def states_equal(a: dict, b: dict) -> list[str]:
    """The generators whose state differs between ``a`` and ``b``."""
    import numpy as np
    differ = []
    for k in a:
        if k == "python":
            same = a[k] == b[k]
        elif k == "numpy":
            same = np.array_equal(a[k], b[k])
        elif k == "cuda":
            same = all(torch.equal(x, y) for x, y in zip(a[k], b[k]))
        else:
            same = torch.equal(a[k], b[k])
        if not same:
            differ.append(k)
    return differ


def rng_around_saves(rank: int, world_size: int, root: str, strategy: str):
    """Seed every generator alike on every rank, then save sharded and full, and load: which
    generators each call moved, the next ``torch.rand`` and a seeded data order."""
    import random

    import numpy as np
    torch.set_num_threads(1)
    model, optimizer = build(strategy, "adamw")
    train_steps(model, optimizer, [0], rank, world_size)
    moved = {}
    for name, call in [
            ("save sharded", lambda: fsdp_mini.save_checkpoint(model, optimizer, Path(root) / "s")),
            ("save full", lambda: fsdp_mini.save_checkpoint(model, optimizer, Path(root) / "f",
                                                             sharded=False)),
            ("load", lambda: fsdp_mini.load_checkpoint(model, optimizer, Path(root) / "s"))]:
        torch.manual_seed(123)
        random.seed(123)
        np.random.seed(123)
        before = random_states()
        call()
        moved[name] = states_equal(before, random_states())
    torch.manual_seed(123)
    fsdp_mini.save_checkpoint(model, optimizer, Path(root) / "s")
    return {"moved": moved, "rand": torch.rand(1).item(), "order": torch.randperm(16).tolist()}


def rng_around_meta_parallelize(rank: int, world_size: int):
    """parallelize of a meta model leaves each rank's own (different) random state alone."""
    torch.set_num_threads(1)
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(7, 15), torch.nn.Tanh(), torch.nn.Linear(15, 3))
    torch.manual_seed(100 + rank)  # e.g. a dropout seed of its own per rank
    before = random_states()
    fsdp_mini.parallelize(model, "fsdp", optimizer=OPTIMIZERS["adamw"], units=[model[0]])
    return states_equal(before, random_states()), fsdp_mini.full_state_dict(model)


def rng_around_the_kit(rank: int, world_size: int, root: str):
    """Every call of the kit a training job makes, under every strategy, seeded alike on every
    rank: [(strategy, call, generators it moved)] for the calls that moved any."""
    import random
    from functools import partial

    import numpy as np
    torch.set_num_threads(1)
    moved = []

    def check(strategy, name, call):
        torch.manual_seed(7)
        random.seed(7)
        np.random.seed(7)
        before = random_states()
        out = call()
        differ = states_equal(before, random_states())
        if differ:
            moved.append((strategy, name, differ))
        return out

    for strategy, options in [("ddp", {}), ("zero1", {}), ("zero2", {}), ("fsdp", {}),
                              ("fsdp", {"prefetch": 1, "activation_checkpointing": True}),
                              ("hsdp", {"shard_size": max(1, world_size // 2)})]:
        label = strategy + (f" {sorted(options)}" if options else "")
        net = check(label, "build", lambda: make_odd(0))
        model, opt = check(label, "parallelize", partial(
            fsdp_mini.parallelize, net, strategy, optimizer=OPTIMIZERS["sgd"],
            units=[net.inner], **options))
        x, y = odd_batch(0, rank, world_size)
        with fsdp_mini.no_sync(model):
            check(label, "backward under no_sync", lambda: model(x, y)[1].backward())
        check(label, "backward", lambda: model(x, y)[1].backward())
        check(label, "clip_grad_norm_", lambda: fsdp_mini.clip_grad_norm_(model, 0.1))
        check(label, "step", opt.step)
        check(label, "zero_grad", opt.zero_grad)
        check(label, "full_state_dict", lambda: fsdp_mini.full_state_dict(model))
        folder = Path(root) / label.replace(" ", "_")
        check(label, "save_checkpoint", lambda: fsdp_mini.save_checkpoint(model, opt, folder))
        check(label, "load_checkpoint", lambda: fsdp_mini.load_checkpoint(model, opt, folder))
    return moved
