"""Rank functions of tests/test_dcp.py: the tiny GPT trained under the kit's strategies and under
torch's FSDP2 (``fully_shard``), saved in DCP's format, resumed by the other at another world size.

Every run trains on the same global batches (split over the ranks), so a run at N ranks and one
at M ranks take the same steps. A torch job saves and loads as torchtitan-style jobs do::

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)        # and to resume:
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

import fsdp_mini
from fsdp_mini.models import GPTConfig, SyntheticText, make_model

OPTIMIZERS = {"adamw": partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1),
              "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9)}  # Note: SGD, as Adam would
# hide a gradient of the wrong scale
GLOBAL_BATCH = 12  # splits over 1, 2, 3 and 4 ranks
SAVED_AT = 2       # steps trained before the checkpoint


def kit_job(strategy: str, opt: str, seed: int = 0):
    net = make_model(GPTConfig.tiny(), seed=seed)
    options = {"units": list(net.blocks)} if strategy in ("fsdp", "hsdp") else {}
    if strategy == "hsdp":
        options["shard_size"] = 2  # at 4 ranks: 2 replicas of 2 shards
    return fsdp_mini.parallelize(net, strategy, optimizer=OPTIMIZERS[opt], **options)


def torch_job(opt: str, world_size: int, seed: int = 0):
    """Torch's FSDP2 on the CPU: every block a unit, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    net = make_model(GPTConfig.tiny(), seed=seed)
    mesh = init_device_mesh("cpu", (world_size,))
    for block in net.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net, OPTIMIZERS[opt](net.parameters())


def train(net, optimizer, steps, rank: int, world_size: int) -> None:
    cfg = GPTConfig.tiny()
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    for step in steps:
        x, y = data.local_batch(step, GLOBAL_BATCH, rank, world_size)
        net(x, y)[1].backward()
        optimizer.step()
        optimizer.zero_grad()


def torch_save(net, optimizer, folder) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(net, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))


def torch_load(net, optimizer, folder) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(net, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
    set_state_dict(net, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def whole_params(net) -> dict | None:
    """Every rank calls it (collective); rank 0 gets the whole tensors on the CPU."""
    if getattr(net, "fsdp_mini", None) is not None:
        full = fsdp_mini.full_state_dict(net)
    else:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict)
        full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True,
                                                                  cpu_offload=True))
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return {k: v.detach().cpu().clone() for k, v in full.items()} if rank == 0 else None


def run(rank: int, world_size: int, root: str, saves=(), resumes=()) -> dict:
    """``saves``: ``(job, opt)`` pairs, job "torch" or a strategy of the kit: train SAVED_AT
    steps, save in DCP's format to ``root/<job>-<opt>``, one more step (the uninterrupted run).
    ``resumes``: ``(job, folder)`` pairs: fresh weights (another seed), load ``root/<folder>``,
    one step. Returns (rank 0) ``{"<job>-<opt>": whole parameters after the next step}`` and
    ``{"<job><-<folder>": (whole parameters after the step, what load_checkpoint returned)}``."""
    torch.set_num_threads(1)
    out = {}
    for job, opt in saves:
        net, optimizer = build(job, opt, world_size, seed=0)
        train(net, optimizer, range(SAVED_AT), rank, world_size)
        save(net, optimizer, Path(root) / f"{job}-{opt}")
        train(net, optimizer, [SAVED_AT], rank, world_size)
        out[f"{job}-{opt}"] = whole_params(net)
    for job, folder in resumes:
        net, optimizer = build(job, folder.split("-")[1], world_size, seed=1)
        meta = load(net, optimizer, Path(root) / folder)
        train(net, optimizer, [SAVED_AT], rank, world_size)
        out[f"{job}<-{folder}"] = (whole_params(net), meta)
    return out if rank == 0 else {}


def build(job: str, opt: str, world_size: int, seed: int):
    return torch_job(opt, world_size, seed) if job == "torch" else kit_job(job, opt, seed)


def save(net, optimizer, folder) -> None:
    if getattr(net, "fsdp_mini", None) is None:
        torch_save(net, optimizer, folder)
    else:
        fsdp_mini.save_checkpoint(net, optimizer, folder, format="dcp")


def load(net, optimizer, folder):
    if getattr(net, "fsdp_mini", None) is None:
        return torch_load(net, optimizer, folder)
    return fsdp_mini.load_checkpoint(net, optimizer, folder)


def save_dcp_failing(rank: int, world_size: int, folder: str, victim: int) -> str:
    """Save in DCP's format over ``folder``; rank ``victim``'s writes fail half-way. Returns
    how the save ended on this rank."""
    torch.set_num_threads(1)
    from torch.distributed.checkpoint import filesystem
    net, optimizer = kit_job("fsdp", "adamw", seed=2)
    train(net, optimizer, [0], rank, world_size)
    if rank == victim:
        def broken(*args, **kwargs):
            raise OSError("disk full (simulated)")
        filesystem._write_item = broken
    try:
        fsdp_mini.save_checkpoint(net, optimizer, folder, format="dcp")
    except Exception as e:  # noqa: BLE001  (the test reads what each rank saw)
        return f"{type(e).__name__}: {e}"
    return "saved"
