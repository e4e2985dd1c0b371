"""A flat range of a parameter as the boxes ``torch.distributed.checkpoint`` stores as chunks.

The kit's pieces are flat ranges [lo, hi) of flattened parameters; DCP stores a tensor as
rectangular chunks, each at its offsets. A flat range is a union of at most 2·ndim − 1 boxes (a
partial row, whole rows, a partial row), so a rank writes and reads its own piece, never the
whole tensor. Example, w of shape (3, 4) at N = 2::

    rank 0 holds [0, 6)    box at (0, 0) of size (1, 4)  +  box at (1, 0) of size (1, 2)
    rank 1 holds [6, 12)   box at (1, 2) of size (1, 2)  +  box at (2, 0) of size (1, 4)

``BoxSaver`` and ``BoxLoader`` are DCP's default planners, plus the write and read items of
those boxes (:mod:`fsdp_mini.checkpoint.dcp` uses them).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner, DefaultSavePlanner,
                                                          create_default_local_load_plan,
                                                          create_default_local_save_plan)
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties)
from torch.distributed.checkpoint.planner import (LoadPlan, TensorWriteData, WriteItem,
                                                  WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list


def boxes(lo: int, hi: int, shape) -> list[tuple[tuple, tuple, int]]:
    """``(offsets, sizes, first flat element)`` of the boxes that elements [lo, hi) of a tensor of
    ``shape`` cover, in order: ``boxes(2, 9, (3, 4))`` is ``[((0, 2), (1, 2), 2), ((1, 0),
    (1, 4), 4), ((2, 0), (1, 1), 8)]``."""
    shape = tuple(shape)
    if hi <= lo:
        return []
    if not shape:
        return [((), (), 0)]
    inner = math.prod(shape[1:])
    (r0, c0), (r1, c1) = divmod(lo, inner), divmod(hi, inner)

    def part_of_row(row, a, b):
        return [((row, *o), (1, *s), row * inner + f) for o, s, f in boxes(a, b, shape[1:])]

    if r0 == r1:
        return part_of_row(r0, c0, c1)
    out = part_of_row(r0, c0, inner) if c0 else []
    first = r0 + bool(c0)
    if r1 > first:
        out.append(((first, *[0] * (len(shape) - 1)), (r1 - first, *shape[1:]), first * inner))
    return out + (part_of_row(r1, 0, c1) if c1 else [])


@dataclasses.dataclass
class Boxes:
    """A leaf of the state dict given to DCP: this rank's boxes of one tensor of ``shape``,
    ``parts[offsets] = (sizes, a view of the rank's piece)``."""
    shape: tuple
    dtype: torch.dtype
    parts: dict


def add_boxes(into: dict, key: str, piece: torch.Tensor, r, writes_empty: bool) -> None:
    """``piece`` (elements [r.lo, r.hi) of a tensor of ``r.shape``) as boxes under ``key``.
    ``writes_empty``: a tensor of no elements still gets its one (empty) box, so it is listed."""
    leaf = into.setdefault(key, Boxes(tuple(r.shape), piece.dtype, {}))
    flat = piece.detach().reshape(-1)
    for offsets, sizes, first in boxes(r.lo, r.hi, r.shape):
        start = first - r.lo
        leaf.parts[offsets] = (sizes, flat[start:start + math.prod(sizes)].view(sizes))
    if writes_empty and math.prod(r.shape) == 0:
        leaf.parts[(0,) * len(r.shape)] = (tuple(r.shape), flat.view(r.shape))


class BoxSaver(DefaultSavePlanner):
    """DCP's planner, plus write items for the ``Boxes`` leaves (one per box)."""

    def create_local_plan(self):
        plain = {k: v for k, v in self.state_dict.items() if not isinstance(v, Boxes)}
        plan = create_default_local_save_plan(plain, self.is_coordinator)
        items = [WriteItem(index=MetadataIndex(fqn, torch.Size(offsets)), type=WriteItemType.SHARD,
                           tensor_data=TensorWriteData(
                               chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)),
                               properties=TensorProperties(dtype=leaf.dtype),
                               size=torch.Size(leaf.shape)))
                 for fqn, leaf in self.state_dict.items() if isinstance(leaf, Boxes)
                 for offsets, (sizes, _) in leaf.parts.items()]
        self.plan = dataclasses.replace(plan, items=plan.items + items,
                                        planner_data=self.mappings)
        return self.plan

    def resolve_data(self, write_item):
        leaf = self.state_dict[write_item.index.fqn]
        if isinstance(leaf, Boxes):
            return leaf.parts[tuple(write_item.index.offset)][1]
        return super().resolve_data(write_item)


class BoxLoader(DefaultLoadPlanner):
    """DCP's planner over a flat state dict, plus read items for the ``Boxes`` leaves; what
    is stored as bytes lands in ``loaded``."""

    def __init__(self):
        super().__init__(flatten_state_dict=False)
        self.loaded = {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        # Note: not DCP's own, which sets every leaf it does not know (ours) to None
        self.state_dict = self.original_state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def create_local_plan(self):
        plain = {k: v for k, v in self.state_dict.items() if not isinstance(v, Boxes)}
        items = create_default_local_load_plan(plain, self.metadata, True).items
        for fqn, leaf in self.state_dict.items():
            if isinstance(leaf, Boxes):
                chunks = [ChunkStorageMetadata(torch.Size(o), torch.Size(s))
                          for o, (s, _) in leaf.parts.items()]
                items += create_read_items_for_chunk_list(
                    fqn, self.metadata.state_dict_metadata[fqn], chunks)
        return LoadPlan(items)

    def lookup_tensor(self, index):
        leaf = self.state_dict[index.fqn]
        if isinstance(leaf, Boxes):
            return leaf.parts[tuple(index.offset)][1]
        return super().lookup_tensor(index)

    def load_bytes(self, read_item, value) -> None:
        # Note: weights_only: a checkpoint may bring tensors and plain values, never code
        self.loaded[read_item.dest_index.fqn] = torch.load(value, weights_only=True)
