"""Which module is a unit, and which unit each parameter belongs to (FSDP's wrapping policy).

``parallelize(model, "fsdp", units=list(model.blocks))`` makes every block a unit; the root
module is always a unit too and holds every parameter no listed unit holds (embeddings, final
norm, head). A parameter belongs to the innermost unit whose module contains it.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.utils.checkpoint import checkpoint

from ..buffers.flat import ParamSlot, param_slots


def check_units(module: nn.Module, units: list[nn.Module]) -> dict[int, str]:
    """Names of the unit modules; a clear error if one is not a submodule or units overlap."""
    names = {id(m): name for name, m in module.named_modules()}
    found: dict[int, str] = {}
    for u in units:
        if not isinstance(u, nn.Module):
            raise TypeError(f"units must be nn.Modules, got a {type(u).__name__}")
        if u is module:
            raise ValueError("the root module is always a unit; list only its submodules in units=")
        if isinstance(u, (nn.ModuleList, nn.ModuleDict)):
            raise ValueError(f"unit {names.get(id(u), type(u).__name__)!r} is a "
                             f"{type(u).__name__}, which is never called, so it would never be "
                             f"gathered; pass the modules inside it, e.g. units=list(model.blocks)")
        if id(u) not in names:
            raise ValueError(f"unit {type(u).__name__} is not a submodule of the model; pass "
                             f"modules reached from it, e.g. units=list(model.blocks)")
        if id(u) in found:
            raise ValueError(f"unit {names[id(u)]!r} is listed twice in units=")
        found[id(u)] = names[id(u)]
    for a in found.values():
        for b in found.values():
            if a != b and b.startswith(a + "."):
                raise ValueError(f"units overlap: {b!r} is inside {a!r}; a parameter must belong "
                                 f"to exactly one unit, so list either the outer or the inner ones")
    return found


def assign_slots(module: nn.Module, unit_names: dict[int, str]) -> dict[int, list[ParamSlot]]:
    """Give every parameter to the innermost unit that holds it (the root for the rest)."""
    prefixes = {name: uid for uid, name in unit_names.items()}
    by_unit: dict[int, list[ParamSlot]] = {uid: [] for uid in unit_names}
    by_unit[id(module)] = []

    def unit_of(param_name: str) -> int:
        for prefix, uid in prefixes.items():
            if param_name.startswith(prefix + "."):
                return uid
        return id(module)

    for slot in param_slots(module):
        owners = {unit_of(n) for n in slot.names}
        if len(owners) > 1:
            raise ValueError(f"parameter shared by several units (tied weights): "
                             f"{', '.join(slot.names)}; put the modules that share it in one "
                             f"unit, e.g. leave them all in the root (not in units=)")
        by_unit[owners.pop()].append(slot)
    return by_unit


def checkpoint_forward(module: nn.Module) -> None:
    """Run ``module``'s forward under activation checkpointing (non-reentrant).

    Only the unit's inputs are kept for backward; its activations are recomputed when backward
    reaches it, while the unit is gathered for its backward anyway, so the recomputation costs
    compute but no extra all-gather. Note: the forward hooks stay outside the checkpoint, so
    the recomputation neither gathers nor frees anything by itself.
    """
    module.forward = partial(checkpoint, module.forward, use_reentrant=False)
