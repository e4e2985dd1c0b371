"""What tests/test_mixed_precision.py runs on every rank, and its single-process reference."""

from __future__ import annotations

import copy

import torch
from workers import OPTIMIZERS, gpt_batch

import fsdp_mini
from fsdp_mini import training
from fsdp_mini.models import GPTConfig, make_model

STEPS = 4
BF16 = {"param_dtype": torch.bfloat16}


def _train(strategy: str, options: dict, rank: int, world_size: int, memory_at: int = 1):
    model = make_model(GPTConfig.tiny())
    model, optimizer = fsdp_mini.parallelize(model, strategy, optimizer=OPTIMIZERS["adamw"],
                                             units=list(model.blocks), **options)
    run = training.train(model, optimizer, lambda step: gpt_batch(step, rank, world_size), STEPS,
                         track_memory_at=memory_at)
    state = fsdp_mini.full_state_dict(model)
    return {"state": state if rank == 0 else None, "losses": run.losses,
            "sent_per_step": run.sent_bytes, "expected": fsdp_mini.expected_costs(model),
            "gathered_peak": run.memory and run.memory.peak_by_category["gathered_params"],
            "step_seconds": run.step_seconds}


def _train_torch_fully_shard(rank: int, world_size: int):
    """The same model, data and optimizer under torch's FSDP2 with the same dtypes."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    model = make_model(GPTConfig.tiny())
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = OPTIMIZERS["adamw"](model.parameters())
    run = training.train(model, optimizer, lambda step: gpt_batch(step, rank, world_size), STEPS)
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state": state if rank == 0 else None, "losses": run.losses,
            "step_seconds": run.step_seconds}


def precision_run(rank: int, world_size: int):
    """fsdp in fp32 and in bf16, torch fully_shard in bf16; ddp, zero1, zero2 with bf16
    gradients; on the same model and data. Then the loss-scaling steps."""
    torch.set_num_threads(1)
    out = {"fsdp": _train("fsdp", {}, rank, world_size),
           "fsdp bf16": _train("fsdp", BF16, rank, world_size),
           "torch bf16": _train_torch_fully_shard(rank, world_size)}
    for strategy in ("ddp", "zero1", "zero2"):
        out[strategy + " bf16 grads"] = _train(strategy, {"reduce_dtype": torch.bfloat16}, rank,
                                               world_size, memory_at=None)
    out["scaler"] = {"fsdp fp16": scaler_steps("fsdp", {"param_dtype": torch.float16}, rank,
                                               world_size),
                     "zero2": scaler_steps("zero2", {}, rank, world_size),
                     "ddp": scaler_steps("ddp", {}, rank, world_size)}
    return out


def emulated_bf16(world_size: int = 2):
    """One process, the casts of fsdp bf16 written out: each rank's half of the batch through a
    bf16 copy of the fp32 master weights, its gradients cast to fp32, averaged, AdamW in fp32."""
    model = make_model(GPTConfig.tiny())
    params = list(model.parameters())
    optimizer = OPTIMIZERS["adamw"](params)
    for step in range(STEPS):
        grads = [torch.zeros_like(p) for p in params]
        for rank in range(world_size):
            low = copy.deepcopy(model).to(torch.bfloat16)
            low(*gpt_batch(step, rank, world_size))[1].backward()
            for g, p in zip(grads, low.parameters()):
                g.add_(p.grad.float())
        for p, g in zip(params, grads):
            p.grad = g / world_size
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


# -- loss scaling ------------------------------------------------------------------------------

def _poison_on_rank_1(model, rank: int) -> bool:
    """Rank 1 sets one element of a gradient it owns to inf; the other ranks do nothing."""
    if rank != 1:
        return False
    grads = [g for g in model.fsdp_mini.grads_for_norm()[0] if g.numel()]
    with torch.no_grad():
        grads[0].view(-1)[0] = float("inf")
    return True


def scaler_steps(strategy: str, options: dict, rank: int, world_size: int):
    """Step 1: rank 1 injects an inf; step 2: no overflow. What each rank saw."""
    model = make_model(GPTConfig.tiny())
    model, optimizer = fsdp_mini.parallelize(model, strategy, optimizer=OPTIMIZERS["adamw"],
                                             units=list(model.blocks), **options)
    scaler = fsdp_mini.ShardedGradScaler(init_scale=2.0**10, growth_interval=100)
    ledger = model.fsdp_mini.comm.ledger
    out = {"scales": [scaler.get_scale()], "skipped": [], "changed": []}
    for step in range(2):
        before = fsdp_mini.full_state_dict(model)
        x, y = gpt_batch(step, rank, world_size)
        scaler.scale(model(x, y)[1]).backward()
        if step == 0:
            out["poisoned"] = _poison_on_rank_1(model, rank)
        scaler.step(optimizer)
        out["skipped"].append(scaler.found_inf(optimizer))
        scaler.update()
        optimizer.zero_grad()
        after = fsdp_mini.full_state_dict(model)
        out["changed"].append(sorted(k for k in before if not torch.equal(before[k], after[k])))
        out["scales"].append(scaler.get_scale())
    out["flag_records"] = [(r.op, r.unit, r.phase, r.payload_bytes) for r in ledger.records
                           if r.unit == "scaler"]
    return out


