"""Lab 08's rank functions: the GPT trained under fsdp, saved, killed while saving, resumed at
another world size and loaded into torch's ``fully_shard``; and DCP interop (``dcp_run``).

    fsdp_mini.launch(labs.save_run, 2, folder, 3, "tiny", 12)         # 3 steps, tiny GPT, batch 12
    fsdp_mini.launch(labs.resume_run, 3, folder, reshard, 2, 3, "tiny", 12)   # saved at 2, now 3

Every run trains on the same global batches (split over the ranks), so runs at N and M ranks take
the same steps. ``save_run`` also writes each rank's flat shards (``flat_rank<r>.pt``, the
exercise's material); ``resume_run`` rebuilds each new rank's with your ``reshard`` and compares
them with what the kit's loader put there. (Flat shards, files and differences:
:mod:`fsdp_mini.checkpoint.contents`.)
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

from ...api import full_state_dict, parallelize
from ...checkpoint.contents import (STATES, files_table, flat_shards, full_on_rank0,
                                    fully_shard_twin, relative_error)
from ...checkpoint.save_load import load_checkpoint, save_checkpoint
from ...launcher import rank_device
from ...models import GPTConfig, SyntheticText, make_model

__all__ = ["dcp_run", "die_while_saving", "files_table", "flat_shards", "lab_model",
           "lab_optimizer", "relative_error", "resume_run", "save_run", "train_steps"]

lab_optimizer = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1)


def lab_model(model: str = "tiny", seed: int = 0):
    """The lab's GPT (``seed``: its initial weights; a resumed run starts from other ones)."""
    return make_model(GPTConfig.sized(model), seed=seed)


def _build(model: str, seed: int = 0):
    torch.set_num_threads(1)
    net = lab_model(model, seed).to(rank_device())
    return parallelize(net, "fsdp", units=list(net.blocks), optimizer=lab_optimizer)


def train_steps(net, optimizer, steps, rank: int, world_size: int,
                global_batch: int) -> list[float]:
    """``steps`` (step numbers) on this rank's rows of the same global batches; the losses."""
    data, losses = SyntheticText(net.config.vocab_size, net.config.block_size), []
    for step in steps:
        x, y = (t.to(rank_device()) for t in data.local_batch(step, global_batch, rank,
                                                               world_size))
        loss = net(x, y)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu() for k, v in state.items()}


def save_run(rank, world_size, folder: str, steps: int, model: str, global_batch: int) -> dict:
    """Train ``steps`` steps, save ``folder/sharded``, ``folder/full``, ``folder/dcp`` and this
    rank's flat shards, then one more step: the uninterrupted run. Returns the losses and (rank
    0) the whole parameters after that step (``next``)."""
    net, optimizer = _build(model)
    losses = train_steps(net, optimizer, range(steps), rank, world_size, global_batch)
    for name, options in (("sharded", {}), ("full", {"sharded": False}), ("dcp", {"format":
                                                                                 "dcp"})):
        save_checkpoint(net, optimizer, Path(folder) / name, **options)
    torch.save(flat_shards(net, optimizer), Path(folder) / f"flat_rank{rank}.pt")
    losses += train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    after = _cpu(full_state_dict(net))  # Note: on the CPU, so the notebook reads it anywhere
    return {"losses": losses, "next": after if rank == 0 else None}


def resume_run(rank, world_size, folder: str, reshard, old_world_size: int, steps: int,
               model: str, global_batch: int) -> dict:
    """At another world size: load ``folder/sharded`` into a fresh fsdp GPT (other initial
    weights); compare its flat shards with ``reshard`` of the saved ones; one more step. Then
    ``folder/full/full.pt`` into torch's ``fully_shard`` GPT, one more step there too. Returns
    (rank 0) ``meta``, ``next``, ``torch_next`` and on every rank ``mine``: per unit, whether
    your shards equal the loader's."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    net, optimizer = _build(model, seed=1)
    meta = load_checkpoint(net, optimizer, Path(folder) / "sharded")
    old = [torch.load(Path(folder) / f"flat_rank{r}.pt", weights_only=True)
           for r in range(old_world_size)]
    mine = []
    for u, shard in enumerate(flat_shards(net, optimizer)):
        pieces = {r: {k: old[r][u][k] for k in ("param", *STATES)}
                  for r in reversed(range(old_world_size))}  # Note: as files come, not sorted
        got = reshard(pieces, shard["numel"], world_size, rank)
        mine.append({k: bool(torch.equal(got[k], shard[k])) for k in ("param", *STATES)})
    train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    after = _cpu(full_state_dict(net))
    twin, twin_optimizer = fully_shard_twin(lab_model(model, seed=1).to(rank_device()),
                                            lab_optimizer)
    saved = torch.load(Path(folder) / "full" / "full.pt", weights_only=True)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    set_model_state_dict(twin, saved["model"], options=full)
    set_optimizer_state_dict(twin, twin_optimizer, saved["optimizer"], options=full)
    train_steps(twin, twin_optimizer, [steps], rank, world_size, global_batch)
    return {"mine": mine, "meta": meta if rank == 0 else None,
            "next": after if rank == 0 else None, "torch_next": full_on_rank0(twin, rank)}


def dcp_run(rank, world_size, folder: str, steps: int, model: str, global_batch: int) -> dict:
    """Torch's side of DCP interop, at another world size: a ``fully_shard`` GPT (other initial
    weights) loads ``folder/dcp`` (the kit's) as a torch job does, takes step ``steps``; saves
    itself with ``dcp.save`` to ``folder/torch_dcp`` and takes step ``steps + 1``. Returns (rank
    0) ``torch_next`` and ``torch_after``, the whole parameters after each step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    torch.set_num_threads(1)
    net, optimizer = fully_shard_twin(lab_model(model, seed=1).to(rank_device()), lab_optimizer)
    model_sd, optim_sd = get_state_dict(net, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(folder) / "dcp"))
    set_state_dict(net, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    torch_next = full_on_rank0(net, rank)
    model_sd, optim_sd = get_state_dict(net, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(folder) / "torch_dcp"))
    train_steps(net, optimizer, [steps + 1], rank, world_size, global_batch)
    return {"torch_next": torch_next, "torch_after": full_on_rank0(net, rank)}


def die_while_saving(rank, world_size, folder: str, victim: int, steps: int, model: str,
                     global_batch: int) -> None:
    """Resume ``folder/sharded``, train one step, save over it: rank ``victim`` dies in the
    middle of that save (its file written, before the commit), like a node lost mid-save."""
    from ...checkpoint import atomic
    net, optimizer = _build(model)
    load_checkpoint(net, optimizer, Path(folder) / "sharded")
    train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    if rank == victim:
        atomic.ranks_that_failed = lambda *args: os._exit(3)  # killed here: its
        # file is written, the ranks have not yet agreed that every file is
    save_checkpoint(net, optimizer, Path(folder) / "sharded")
