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
    from fsdp_mini import checkpoint_files
    model, optimizer = build("fsdp", "adamw")
    train_steps(model, optimizer, [0], rank, world_size)
    for name in ("ckpt", "copy"):
        fsdp_mini.save_checkpoint(model, optimizer, Path(root) / name)
    train_steps(model, optimizer, [1], rank, world_size)
    if rank == victim:
        checkpoint_files.CheckpointWriter.commit = lambda *args: os._exit(3)
    fsdp_mini.save_checkpoint(model, optimizer, Path(root) / "ckpt")


def into_fully_shard(rank: int, world_size: int, full_file: str):
    """A full checkpoint into torch's ``fully_shard`` model through torch's DCP state-dict API;
    then one step. Returns (on rank 0) the full states read back before and after it."""
    torch.set_num_threads(1)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
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
