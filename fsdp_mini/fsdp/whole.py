"""FSDP seen whole: every parameter gathered for reading (``summon_full_params``) or saving
(``full_state_dict``), and the sizes the formulas of :mod:`fsdp_mini.theory` need.

A mixin of :class:`fsdp_mini.fsdp.algorithm.FSDP`, kept apart so that ``algorithm.py`` holds the
training step alone. Everything here is collective: every rank must call it.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager

import torch
from torch import nn

from ..comm.collectives import Tag
from ..memory import allocating
from ..strategy import PieceRange
from ..theory import UnitSize, fsdp_sent_bytes


class WholeView:
    """Needs ``self.units``, ``self.groups()``, ``self.comm``, ``self.module``,
    ``self.state_dict_keys`` and ``self.precision`` (FSDP has them)."""

    @contextmanager
    def summon(self, writeback: bool):
        """Every unit gathered, its module attributes the whole tensors.

        Note: gathered into fresh buffers in the shards' dtype, not into the units' own (bf16 in
        mixed precision): a reader wants the master weights, and a writeback through bf16 would
        round every shard."""
        busy = [u.name for u in self.units
                if u.state.value in ("forward", "backward")]
        if busy:
            raise RuntimeError(f"summon_full_params inside the forward or backward of unit(s) "
                               f"{busy}; call it between training steps")
        before = [dict(o._parameters) for u in self.units for o in _owners(u)]
        wholes = [self._whole(group, "summon") for group in self.groups()]
        for group, full in zip(self.groups(), wholes):
            group.point_modules_at(group.layout.views(full))
        try:
            yield
            if writeback:
                with torch.no_grad():
                    for group, full in zip(self.groups(), wholes):
                        start, end = group.layout.shard_range(self.comm.rank)
                        group.shard.copy_(full[start:end])
        finally:
            for owner, params in zip([o for u in self.units for o in _owners(u)], before):
                owner._parameters.update(params)

    def full_state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """Every parameter gathered, under its original name; collective: all ranks call it."""
        tensors: dict[str, torch.Tensor] = {}
        for group in self.groups():
            full = self._whole(group, "state_dict")
            for slot, view in zip(group.layout.slots, group.layout.views(full)):
                value = view.clone()
                for name in slot.names:
                    tensors[name] = value
        for name, buf in self.module.named_buffers():
            tensors[name] = buf.detach().clone()
        return OrderedDict((k, tensors[k]) for k in self.state_dict_keys)

    def param_pieces(self) -> list[tuple[torch.Tensor, PieceRange]]:
        """This rank's piece of every parameter, trainable or frozen (not collective)."""
        return [(piece, PieceRange(tuple(slot.names), lo, hi, tuple(slot.shape)))
                for group in self.groups()
                for slot, piece, (lo, hi) in zip(group.layout.slots, group.pieces.params,
                                                 group.pieces.in_params())]

    def _whole(self, group, phase: str) -> torch.Tensor:
        """The group's whole flat tensor, all-gathered in the shards' own dtype."""
        with allocating("gathered_params"):
            full = torch.empty(group.layout.padded_numel, dtype=group.shard.dtype,
                               device=group.device)
        self.comm.all_gather(full, group.shard.to(group.device), label=Tag(group.label, phase))
        return full

    def numel(self) -> tuple[int, int]:
        slots = [s for g in self.groups() for s in g.layout.slots]
        return (sum(s.numel for s in slots if s.requires_grad),
                sum(s.numel for s in slots if not s.requires_grad))

    def padded_numel(self) -> int:
        return sum(g.layout.padded_numel for g in self.groups() if g.trainable)

    def padded_frozen_numel(self) -> int:
        return sum(g.layout.padded_numel for g in self.groups() if not g.trainable)

    def sent_bytes_per_step(self) -> float:
        return fsdp_sent_bytes(self.unit_sizes(), self.comm.world_size, *self.collective_bytes())

    def unit_sizes(self) -> list[UnitSize]:
        """Each unit as the formulas see it (padded element counts)."""
        return [UnitSize(trainable=sum(g.layout.padded_numel for g in u.groups if g.trainable),
                         frozen=sum(g.layout.padded_numel for g in u.groups if not g.trainable),
                         gathered_in_backward=u.reshard_after_forward and u is not self.root)
                for u in self.units]

    def collective_bytes(self) -> tuple[int, int]:
        """Bytes per element of the all-gathers (param_dtype) and the reduce-scatters."""
        shard_dtype = self.groups()[0].shard.dtype
        return (self.precision.param(shard_dtype).itemsize,
                self.precision.reduce(shard_dtype).itemsize)



def _owners(unit) -> list[nn.Module]:
    return list({id(m): m for g in unit.groups for s in g.layout.slots
                 for m, _ in s.owners}.values())
