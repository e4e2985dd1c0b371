"""What torch's FSDP2 (``fully_shard``) made of a model and its optimizer, in plain values that two
ports can be compared on: which modules are units and with which policy, how each parameter is
placed, what the optimizer holds and with which settings.

    units(model)          # {"the root": {"param_dtype": None, ..., "reshard_after_forward": False},
                          #  "blocks.0": {...}, ...}: every FSDPModule, by its name in the model
    placements(model)     # {"wte.weight": "(Shard(dim=0),)", ...}, "not a DTensor" if left whole
    optimizer_settings(optimizer)    # [{"class": "AdamW", "lr": 0.001, "betas": (0.9, 0.999),
                                     #   ...every other entry of each param_group}]
    held_by(optimizer, model)        # "26 of its 26 parameters are the model's"
    local_weights(model)             # {name: this rank's shard}: no collective

Note: ``reshard_after_forward`` is read from the unit's parameter group once the model has run
forward (FSDP2 decides the root's then: it keeps the root gathered).
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["held_by", "local_weights", "optimizer_settings", "placements", "units"]


def units(model) -> dict:
    """Every FSDP unit of ``model`` (``isinstance(m, FSDPModule)``), by name ("the root" for the
    model itself): the dtypes it computes and reduces in (its MixedPrecisionPolicy's, None read
    as FSDP2 reads it: param_dtype the parameters' own, reduce_dtype param_dtype), the policy's
    other fields, whether it reshards after forward, and which other modules share its unit
    (``fully_shard([a, b])``)."""
    from torch.distributed.fsdp import FSDPModule
    out, states = {}, {}
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            states.setdefault(id(module._get_fsdp_state()), []).append(name or "the root")
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            group = state._fsdp_param_group
            policy = group.mp_policy if group is not None else state._mp_policy
            own = next(module.parameters(), torch.empty(0)).dtype
            seen = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}
            seen["param_dtype"] = seen["param_dtype"] or own
            seen["reduce_dtype"] = seen["reduce_dtype"] or seen["param_dtype"]
            # Note: fully_shard([a, b]) makes a and b one unit: one state, one all-gather
            together = [n for n in states[id(state)] if n != (name or "the root")]
            out[name or "the root"] = {**{k: _shown(v) for k, v in seen.items()},
                                       "reshard_after_forward": group is not None and
                                       group.post_forward_mesh_info is not None,
                                       "one unit with": ", ".join(together) or "none"}
    return out


def placements(model) -> dict:
    """Each parameter's DTensor placements, as text; "not a DTensor" for one left whole."""
    from torch.distributed.tensor import DTensor
    return {name: str(p.placements) if isinstance(p, DTensor) else "not a DTensor"
            for name, p in model.named_parameters()}


def optimizer_settings(optimizer) -> list:
    """The optimizer's class and every entry of each param_group but the parameters."""
    return [{"class": type(optimizer).__name__,
             **{k: _shown(v) for k, v in group.items() if k != "params"}}
            for group in optimizer.param_groups]


def held_by(optimizer, model) -> str:
    """How many of the optimizer's parameters are the model's own (after fully_shard, a
    parameter is a new DTensor: an optimizer built before it holds the old ones)."""
    live = {id(p) for p in model.parameters()}
    held = [p for g in optimizer.param_groups for p in g["params"]]
    return f"{sum(id(p) in live for p in held)} of its {len(held)} parameters are the model's"


def local_weights(model) -> dict:
    """This rank's part of each parameter (its DTensor shard, or the whole tensor)."""
    return {name: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
            for name, p in model.named_parameters()}


def _shown(value):
    """A setting as a plain value: dtypes and tensors as text, tuples kept."""
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else str(value)
    return value
