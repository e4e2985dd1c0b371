"""Flat buffers: many parameters laid end to end in one padded 1-D tensor.

ZeRO and FSDP move parameters and gradients as *one* flat tensor per bucket or unit: one
all-gather, one reduce-scatter, instead of one per weight matrix. The buffer is padded with zeros
to a multiple of the world size N so it splits into N equal shards.

Example: two parameters w (2x3 = 6 elements) and b (3 elements), N = 4::

    flat    [w0 w1 w2 w3 w4 w5 b0 b1 b2 0  0  0 ]     9 elements + 3 padding = 12 = 4 x 3
    shards   rank0 [w0 w1 w2]  rank1 [w3 w4 w5]  rank2 [b0 b1 b2]  rank3 [0 0 0]
    pieces   rank0 w[0:3] b[]  rank1 w[3:6] b[]  rank2 w[] b[0:3]  rank3 w[] b[]

A shard boundary may cut through a parameter. The optimizer still sees one *piece* per original
parameter (the part of it in this rank's shard, possibly empty), so a parameter that got no
gradient keeps ``grad is None`` and is skipped, exactly as in plain PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .absent import absent_everywhere, mark_absent, present_values


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

    def piece_ranges(self, rank: int) -> list[tuple[int, int]]:
        """For each slot, the part of it inside ``rank``'s shard, in shard coordinates."""
        start, end = self.shard_range(rank)
        ranges = []
        for s in self.slots:
            lo, hi = max(s.offset, start), min(s.offset + s.numel, end)
            ranges.append((lo - start, hi - start) if lo < hi else (0, 0))
        return ranges

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate ``tensors`` (one per slot) and zero-pad to ``padded_numel``."""
        first = tensors[0]
        flat = torch.zeros(self.padded_numel, dtype=first.dtype, device=first.device)
        for slot, t in zip(self.slots, tensors):
            flat[slot.offset:slot.offset + slot.numel].copy_(t.reshape(-1))
        return flat

    def flatten_grads(self, grads: list[torch.Tensor | None], like: torch.Tensor
                      ) -> tuple[torch.Tensor, list[int]]:
        """The gradients as one flat buffer to reduce; a missing one (None) is marked absent.

        Returns the buffer and the slots whose gradient was missing on this rank.
        """
        flat = torch.empty(self.padded_numel, dtype=like.dtype, device=like.device)
        flat[self.numel:].zero_()
        absent = [i for i, g in enumerate(grads) if g is None]
        for slot, g in zip(self.slots, grads):
            if g is not None:  # copied with its zeros made +0.0, in one pass
                present_values(g.reshape(-1), out=flat[slot.offset:slot.offset + slot.numel])
        for i in absent:
            mark_absent(self.slot_view(flat, i))
        return flat, absent

    def slot_view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        s = self.slots[i]
        return flat[s.offset:s.offset + s.numel]

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """One view of ``flat`` per slot, shaped like the original parameter."""
        return [flat[s.offset:s.offset + s.numel].view(s.shape) for s in self.slots]


class ShardPieces:
    """This rank's shard of a flat buffer, cut into one ``nn.Parameter`` per original parameter.

    The pieces share the shard's storage: an optimizer that updates a piece updates the shard,
    which is what the next all-gather sends. Their gradients are views of the reduced gradient
    shard, or None for a parameter that no rank gave a gradient to.
    """

    def __init__(self, layout: FlatLayout, shard: torch.Tensor, rank: int):
        self.layout, self.shard = layout, shard
        self.ranges = layout.piece_ranges(rank)
        self.start = layout.shard_range(rank)[0]
        self.params = [nn.Parameter(shard[lo:hi], requires_grad=slot.requires_grad)
                       for slot, (lo, hi) in zip(layout.slots, self.ranges)]

    def in_params(self) -> list[tuple[int, int]]:
        """For each piece, the elements ``[lo, hi)`` of its flattened original parameter it holds
        (checkpoints). Example above: rank 1 -> w (3, 6), b (0, 0) (empty)."""
        return [(self.start + lo - s.offset, self.start + hi - s.offset) if hi > lo else (0, 0)
                for s, (lo, hi) in zip(self.layout.slots, self.ranges)]

    def add_grads(self, grad_shard: torch.Tensor, absent_here: list[int]) -> None:
        """Give each piece its part of ``grad_shard`` (the reduced, averaged gradient shard).

        ``absent_here``: the slots that got no gradient on *this* rank. Only those can be absent
        on every rank; ``absent_everywhere`` tells, from the reduced values themselves.
        """
        skip = set()
        candidates = [i for i in absent_here if self.ranges[i][1] > self.ranges[i][0]]
        if candidates:
            starts = [self.ranges[i][0] for i in candidates]
            for i, gone in zip(candidates, absent_everywhere(grad_shard, starts)):
                if gone:
                    skip.add(i)
        for i, (piece, (lo, hi)) in enumerate(zip(self.params, self.ranges)):
            if i in skip or not piece.requires_grad:
                continue  # Note: frozen since parallelize (requires_grad_(False)): no gradient
            if hi == lo and i in absent_here:
                continue  # an empty piece cannot tell whether another rank had a gradient
            g = grad_shard[lo:hi]
            if piece.grad is None:
                piece.grad = g
            else:
                piece.grad.add_(g)  # gradient accumulation over micro-batches

    def zero_grad(self, set_to_none: bool = True) -> None:
        for piece in self.params:
            if piece.grad is None:
                continue
            if set_to_none:
                piece.grad = None
            else:
                piece.grad.zero_()

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.params if p.grad is not None]


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
