"""Flat buffers: many parameters laid end to end in one padded 1-D tensor.

ZeRO and FSDP move parameters and gradients as *one* flat tensor per bucket or unit: one
all-gather, one reduce-scatter, instead of one per weight matrix. The buffer is padded with zeros
to a multiple of the world size N so it splits into N equal shards.

Example: two parameters w (2x3 = 6 elements) and b (3 elements), N = 4::

    flat    [w0 w1 w2 w3 w4 w5 b0 b1 b2 0  0  0 ]     9 elements + 3 padding = 12 = 4 x 3
    shards   rank0 [w0 w1 w2]  rank1 [w3 w4 w5]  rank2 [b0 b1 b2]  rank3 [0 0 0]

A shard boundary may cut through a parameter; that is fine, because every optimizer update
fsdp_mini uses (SGD, momentum, Adam/AdamW) is elementwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class ParamSlot:
    """One original parameter inside a flat buffer, and where the module tree refers to it.

    ``param`` is the original tensor until its values have been copied into a flat buffer; a
    strategy that frees the original (FSDP) sets it to None and keeps only the shape.
    """

    param: nn.Parameter | None
    names: list[str]                       # fully-qualified names (two or more for tied weights)
    owners: list[tuple[nn.Module, str]]    # (module, attribute name) for each of those names
    offset: int = 0
    shape: torch.Size = field(default=None)
    requires_grad: bool = True

    def __post_init__(self):
        if self.shape is None:
            self.shape = self.param.shape
            self.requires_grad = self.param.requires_grad

    @property
    def numel(self) -> int:
        return self.shape.numel()


@dataclass
class FlatLayout:
    """Offsets of ``slots`` in a flat buffer of ``padded_numel`` elements (a multiple of N)."""

    slots: list[ParamSlot]
    world_size: int
    numel: int = 0
    padded_numel: int = 0

    def __post_init__(self):
        offset = 0
        for slot in self.slots:
            slot.offset = offset
            offset += slot.numel
        self.numel = offset
        n = self.world_size
        self.padded_numel = -(-offset // n) * n if offset else n

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate ``tensors`` (one per slot) and zero-pad to ``padded_numel``."""
        first = tensors[0]
        flat = torch.zeros(self.padded_numel, dtype=first.dtype, device=first.device)
        for slot, t in zip(self.slots, tensors):
            flat[slot.offset:slot.offset + slot.numel].copy_(t.reshape(-1))
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """One view of ``flat`` per slot, shaped like the original parameter."""
        return [flat[s.offset:s.offset + s.numel].view(s.shape) for s in self.slots]


def param_slots(module: nn.Module, prefix: str = "") -> list[ParamSlot]:
    """Every distinct parameter under ``module``, with all the names it is known by.

    Tied weights (one ``nn.Parameter`` registered in two places) appear once, with two names.
    """
    slots: dict[int, ParamSlot] = {}
    for mod_name, mod in module.named_modules(prefix=prefix, remove_duplicate=False):
        for attr, p in mod._parameters.items():
            if p is None:
                continue
            name = f"{mod_name}.{attr}" if mod_name else attr
            slot = slots.setdefault(id(p), ParamSlot(p, [], []))
            if name not in slot.names:
                slot.names.append(name)
                slot.owners.append((mod, attr))
    return list(slots.values())
