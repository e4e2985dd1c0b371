"""What a checkpoint holds, read back and compared, and its twin under torch's own FSDP2: each
unit's flat shards with the optimizer state laid out like them (what torch's first FSDP saved),
a folder's files, the worst relative difference of two state dicts (lab 08).

    flat_shards(net, optimizer)     # per unit: {"unit", "numel", "param", "exp_avg", ...}
    relative_error(state, reference)
    net, optimizer = fully_shard_twin(model, make_optimizer)   # each block, then the root
"""

from __future__ import annotations

from pathlib import Path

import torch

STATES = ("exp_avg", "exp_avg_sq")   # Adam's moments: one value per parameter element


def flat_shards(net, optimizer, states=STATES) -> list[dict]:
    """Per unit (its trainable flat group), this rank's flat shards: ``{"unit", "numel",
    "param", *states}``; each state laid out like the parameter's shard, zeros in the padding.
    Example, a unit of 9 elements at N = 4: every shard has 3, rank 3's are padding only."""
    out = []
    for group in net.fsdp_mini.groups():
        if not group.trainable:
            continue
        shard = {"unit": group.label, "numel": group.layout.numel,
                 "param": group.shard.detach().to("cpu", copy=True)}
        for key in states:
            flat = torch.zeros_like(shard["param"])
            for piece, (lo, hi) in zip(group.pieces.params, group.pieces.ranges):
                state = optimizer.state.get(piece, {})
                if key in state and hi > lo:
                    flat[lo:hi] = state[key].detach().reshape(-1).cpu()
            shard[key] = flat
        out.append(shard)
    return out


def relative_error(state: dict, reference: dict) -> float:
    """The worst ||a - b|| / ||b|| over the tensors of two state dicts."""
    worst = 0.0
    for name, ref in reference.items():
        diff = (state[name].double().cpu() - ref.double().cpu()).norm().item()
        worst = max(worst, diff / (ref.double().norm().item() or 1.0))
    return worst


def files_table(folder) -> list[tuple[str, int]]:
    """(relative path, bytes) of every file under ``folder``, sorted."""
    root = Path(folder)
    return sorted((str(p.relative_to(root)), p.stat().st_size)
                  for p in root.rglob("*") if p.is_file())


def fully_shard_twin(model, make_optimizer):
    """``model`` under torch's ``fully_shard`` (each of its blocks, then the root)."""
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, make_optimizer(model.parameters())


def full_on_rank0(net, rank: int):
    """The whole parameters of a ``fully_shard`` model on the CPU, on rank 0 (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    return {k: v.detach().cpu() for k, v in full.items()} if rank == 0 else None
