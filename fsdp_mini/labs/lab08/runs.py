"""Lab 08's rank functions: the GPT trained under fsdp, saved, killed while saving, resumed at
another world size, and loaded into torch's own ``fully_shard``; and DCP interop (``dcp_run``):
the kit's checkpoint in torch.distributed.checkpoint's format resumed by ``fully_shard``, whose
own ``dcp.save`` the kit then resumes.

    fsdp_mini.launch(labs.save_run, 2, folder, 3, "tiny", 12)         # 3 steps, tiny GPT, batch 12
    fsdp_mini.launch(labs.resume_run, 3, folder, reshard, 2, 3, "tiny", 12)   # saved at 2, now 3

Every run trains on the same global batches (split over the ranks), so a run at N ranks and one at
M ranks take the same steps. Besides the kit's checkpoints, ``save_run`` writes each rank's *flat
shards* (``flat_rank<r>.pt``: per unit, this rank's slice of the padded flat parameter and of
Adam's two moments, laid out the same way), the raw material of the lab's exercise: from them,
``resume_run`` rebuilds each new rank's shards with your ``reshard`` and compares them with what
the kit's loader put there.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

from ...api import full_state_dict, parallelize
from ...checkpoint.save_load import load_checkpoint, save_checkpoint
from ...launcher import rank_device
from ...models import GPTConfig, SyntheticText, make_model

__all__ = [
    "dcp_run",
    "die_while_saving",
    "flat_shards",
    "lab_model",
    "lab_optimizer",
    "relative_error",
    "resume_run",
    "save_run",
    "train_steps",
]

STATES = ("exp_avg", "exp_avg_sq")   # Adam's moments: one value per parameter element
lab_optimizer = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1)


def lab_model(model: str = "tiny", seed: int = 0):
    """The lab's GPT (``seed``: its initial weights; a resumed run starts from other ones)."""
    return make_model(GPTConfig.sized(model), seed=seed)


def build(model: str, seed: int = 0):
    net = lab_model(model, seed).to(rank_device())
    return parallelize(net, "fsdp", units=list(net.blocks), optimizer=lab_optimizer)


def train_steps(net, optimizer, steps, rank: int, world_size: int,
                global_batch: int) -> list[float]:
    """``steps`` (step numbers) on this rank's rows of the same global batches; the losses."""
    cfg = net.config
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    losses = []
    for step in steps:
        x, y = (t.to(rank_device()) for t in data.local_batch(step, global_batch, rank,
                                                               world_size))
        loss = net(x, y)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def flat_shards(net, optimizer) -> list[dict]:
    """Per unit (its trainable flat group), this rank's flat shards: ``{"unit", "numel",
    "param", "exp_avg", "exp_avg_sq"}``; the moments laid out like the parameter's shard, zeros
    in the padding. Example, a unit of 9 elements at N = 4: every shard has 3, rank 3's are
    padding only."""
    out = []
    for group in net.fsdp_mini.groups():
        if not group.trainable:
            continue
        shard = {"unit": group.label, "numel": group.layout.numel,
                 "param": group.shard.detach().to("cpu", copy=True)}
        for key in STATES:
            flat = torch.zeros_like(shard["param"])
            for piece, (lo, hi) in zip(group.pieces.params, group.pieces.ranges):
                state = optimizer.state.get(piece, {})
                if key in state and hi > lo:
                    flat[lo:hi] = state[key].detach().reshape(-1).cpu()
            shard[key] = flat
        out.append(shard)
    return out


def save_run(rank: int, world_size: int, folder: str, steps: int, model: str,
             global_batch: int) -> dict:
    """Train ``steps`` steps, save ``folder/sharded`` and ``folder/full`` (and this rank's flat
    shards), then one more step: the uninterrupted run. Returns the losses and (rank 0) the
    whole parameters after that step (``next``)."""
    torch.set_num_threads(1)
    net, optimizer = build(model)
    losses = train_steps(net, optimizer, range(steps), rank, world_size, global_batch)
    save_checkpoint(net, optimizer, Path(folder) / "sharded")
    save_checkpoint(net, optimizer, Path(folder) / "full", sharded=False)
    save_checkpoint(net, optimizer, Path(folder) / "dcp", format="dcp")  # for torch (dcp_run)
    torch.save(flat_shards(net, optimizer), Path(folder) / f"flat_rank{rank}.pt")
    losses += train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    after = _cpu(full_state_dict(net))  # Note: on the CPU, so the notebook reads it anywhere
    return {"losses": losses, "next": after if rank == 0 else None}


def resume_run(rank: int, world_size: int, folder: str, reshard, old_world_size: int,
               steps: int, model: str, global_batch: int) -> dict:
    """At another world size: load ``folder/sharded`` into a fresh fsdp GPT (other initial
    weights); compare its flat shards with ``reshard`` of the saved ones; one more step. Then
    ``folder/full/full.pt`` into torch's ``fully_shard`` GPT, one more step there too. Returns
    (rank 0) ``meta``, ``next`` and ``torch_next`` (whole parameters after the step), and on
    every rank ``mine``: per unit, whether your shards equal the loader's."""
    torch.set_num_threads(1)
    net, optimizer = build(model, seed=1)
    meta = load_checkpoint(net, optimizer, Path(folder) / "sharded")
    loaded = flat_shards(net, optimizer)
    old = [torch.load(Path(folder) / f"flat_rank{r}.pt", weights_only=True)
           for r in range(old_world_size)]
    mine = []
    for u, shard in enumerate(loaded):
        pieces = {r: {k: old[r][u][k] for k in ("param", *STATES)}
                  for r in reversed(range(old_world_size))}  # Note: as files come, not sorted
        got = reshard(pieces, shard["numel"], world_size, rank)
        mine.append({k: bool(torch.equal(got[k], shard[k])) for k in ("param", *STATES)})
    train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    after = _cpu(full_state_dict(net))
    torch_next = _fully_shard_step(rank, world_size, Path(folder) / "full" / "full.pt", steps,
                                   model, global_batch)
    return {"mine": mine, "meta": meta if rank == 0 else None,
            "next": after if rank == 0 else None, "torch_next": torch_next}


def _fully_shard_step(rank, world_size, file: Path, steps, model, global_batch):
    """``full.pt`` into torch's FSDP2 through its DCP state-dict API, then one step."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard
    net = lab_model(model, seed=1).to(rank_device())
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    optimizer = lab_optimizer(net.parameters())
    saved = torch.load(file, weights_only=True)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    set_model_state_dict(net, saved["model"], options=full)
    set_optimizer_state_dict(net, optimizer, saved["optimizer"], options=full)
    train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    after = get_model_state_dict(net, options=full)  # Note: collective; rank 0 gets them
    return _cpu(after) if rank == 0 else None


def dcp_run(rank: int, world_size: int, folder: str, steps: int, model: str,
            global_batch: int) -> dict:
    """Torch's side of DCP interop, at another world size: a ``fully_shard`` GPT (other initial
    weights) loads ``folder/dcp`` (the kit's, saved at N by ``save_run``) the way a torch job
    does, takes step ``steps``; saves itself with ``dcp.save`` to ``folder/torch_dcp`` and takes
    step ``steps + 1``, its uninterrupted run. Returns (rank 0) ``torch_next`` and
    ``torch_after``, the whole parameters after each step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    torch.set_num_threads(1)
    net, optimizer = _torch_fully_shard(model)
    model_sd, optim_sd = get_state_dict(net, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(folder) / "dcp"))
    set_state_dict(net, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    torch_next = _full_on_rank0(net, rank)
    model_sd, optim_sd = get_state_dict(net, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(folder) / "torch_dcp"))
    train_steps(net, optimizer, [steps + 1], rank, world_size, global_batch)
    return {"torch_next": torch_next, "torch_after": _full_on_rank0(net, rank)}


def _torch_fully_shard(model: str):
    from torch.distributed.fsdp import fully_shard
    net = lab_model(model, seed=1).to(rank_device())
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    return net, lab_optimizer(net.parameters())


def _full_on_rank0(net, rank: int):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    return _cpu(full) if rank == 0 else None  # Note: collective; rank 0 gets them


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu() for k, v in state.items()}


def die_while_saving(rank: int, world_size: int, folder: str, victim: int, steps: int,
                     model: str, global_batch: int) -> None:
    """Resume ``folder/sharded``, train one step, save over it: rank ``victim`` dies in the
    middle of that save (its file written, before the commit), like a node lost mid-save."""
    torch.set_num_threads(1)
    from ...checkpoint import atomic
    net, optimizer = build(model)
    load_checkpoint(net, optimizer, Path(folder) / "sharded")
    train_steps(net, optimizer, [steps], rank, world_size, global_batch)
    if rank == victim:
        atomic.ranks_that_failed = lambda *args: os._exit(3)  # killed here: its
        # file is written, the ranks have not yet agreed that every file is
    save_checkpoint(net, optimizer, Path(folder) / "sharded")


def relative_error(state: dict, reference: dict) -> float:
    """The worst ||a - b|| / ||b|| over the tensors of two state dicts."""
    worst = 0.0
    for name, ref in reference.items():
        diff = (state[name].double().cpu() - ref.double().cpu()).norm().item()
        worst = max(worst, diff / (ref.double().norm().item() or 1.0))
    return worst
