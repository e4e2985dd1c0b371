"""What tests/test_hsdp.py runs on every rank: HSDP training, its ledger by group, its memory,
clipping, and its errors (importable, so ranks can unpickle these by reference)."""

from __future__ import annotations

import torch
from workers import MODELS, OPTIMIZERS, STEPS

import fsdp_mini
from fsdp_mini import training

MAX_NORM = 0.05  # small enough that every step clips


def train_hsdp(rank: int, world_size: int, strategy: str, options: dict, opt_name: str,
               model_name: str = "gpt", clip: float | None = None):
    """Train ``STEPS`` steps on this rank's slice of the global batch; return the final state
    (rank 0), the bytes each group carried per step, the formulas, the model state kept and,
    with ``clip``, the norms ``fsdp_mini.clip_grad_norm_`` returned."""
    build, units_of, batch = MODELS[model_name]
    model = build()
    model, optimizer = fsdp_mini.parallelize(model, strategy, optimizer=OPTIMIZERS[opt_name],
                                             units=units_of(model), **options)
    ledger = model.fsdp_mini.comm.ledger
    wrap_steps = set(ledger.steps())
    ledger.next_step()  # the wrap-time broadcast stays apart from the first step
    norms = []
    for step in range(STEPS):
        x, y = batch(step, rank, world_size)
        training.loss_of(model, x, y).backward()
        if clip is not None:
            norms.append(fsdp_mini.clip_grad_norm_(model, clip).item())
        optimizer.step()
        if step == STEPS - 1:
            with fsdp_mini.track_memory(model, optimizer) as mem:  # nothing allocated: a reading
                kept = sum(mem.category_bytes()[c] for c in ("params", "grads", "optimizer_state"))
            # Note: AdamW's 4-byte step counter per tensor is not in the ZeRO formulas
            kept -= sum(st["step"].nbytes for st in optimizer.state.values()
                        if torch.is_tensor(st.get("step")))
        optimizer.zero_grad()
    by_step = {}
    for record in ledger.records:
        if record.step not in wrap_steps:
            groups = by_step.setdefault(record.step, {})
            groups[(record.group, record.op)] = groups.get((record.group, record.op), 0.0) \
                + record.sent_bytes
    wrap = {(r.group, r.op) for r in ledger.records if r.step in wrap_steps}
    state = fsdp_mini.full_state_dict(model)
    return {"state": state if rank == 0 else None, "by_step": list(by_step.values()),
            "wrap": wrap, "expected": fsdp_mini.expected_costs(model), "kept": kept,
            "norms": norms, "shard_ranks": _ranks(model.fsdp_mini.comm.group)}


def _ranks(group) -> list[int]:
    return torch.distributed.get_process_group_ranks(group) if group is not None else [0]


def parity_and_bytes(rank: int, world_size: int):
    """Everything test_hsdp checks at world size 4, in one launch."""
    runs = {
        ("hsdp2", "adamw"): ("hsdp", {"shard_size": 2}, "adamw"),
        ("hsdp2", "sgd"): ("hsdp", {"shard_size": 2}, "sgd"),
        ("hsdp4", "sgd"): ("hsdp", {"shard_size": 4}, "sgd"),
        ("fsdp", "sgd"): ("fsdp", {}, "sgd"),
        ("hsdp1", "sgd"): ("hsdp", {"shard_size": 1}, "sgd"),
        ("ddp", "sgd"): ("ddp", {}, "sgd"),
    }
    out = {key: train_hsdp(rank, world_size, *args) for key, args in runs.items()}
    out[("hsdp2-odd", "adamw")] = train_hsdp(rank, world_size, "hsdp", {"shard_size": 2},
                                             "adamw", model_name="odd")
    out[("hsdp2-clip", "sgd")] = train_hsdp(rank, world_size, "hsdp", {"shard_size": 2}, "sgd",
                                            clip=MAX_NORM)
    out["errors"] = bad_shard_sizes()
    return out


def bad_shard_sizes() -> dict:
    """The error each bad ``shard_size`` raises (type name and message)."""
    errors = {}
    for bad in (3, 0, 8, 2.0, None):
        model = MODELS["odd"][0]()
        try:
            options = {} if bad is None else {"shard_size": bad}
            fsdp_mini.parallelize(model, "hsdp", **options)
            errors[repr(bad)] = None
        except (TypeError, ValueError) as e:
            errors[repr(bad)] = (type(e).__name__, str(e))
    return errors


def reference_with_clip(model_name: str = "gpt", opt_name: str = "sgd"):
    """Single process, whole global batch, torch's own clip_grad_norm_."""
    build, _, batch = MODELS[model_name]
    model = build()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = OPTIMIZERS[opt_name](params)
    norms = []
    for step in range(STEPS):
        training.loss_of(model, *batch(step)).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, MAX_NORM).item())
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict(), norms
