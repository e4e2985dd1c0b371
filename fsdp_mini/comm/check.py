"""Debug mode: ranks compare every collective before issuing it (``check_collectives=True``).

Collectives pair up by order alone: if rank 1 skips a unit's all-gather, its next all-gather
meets rank 0's previous one, and the job hangs or silently mixes two units.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

# Note: torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class CollectiveMismatchError(RuntimeError):
    """Ranks were about to issue different collectives (the classic cause of a hang)."""


class SequenceCheck:
    """Debug mode: before every collective, the ranks compare what they are about to issue.

    Collectives pair up by order alone: if rank 1 skips a unit's all-gather, its next all-gather
    meets rank 0's previous one, and the job hangs or silently mixes two units. With the check on,
    every rank first shares (op, label, elements, dtype) over a side channel, and on the first
    difference every rank raises a :class:`CollectiveMismatchError` naming both sides, at once.
    Cost: one all-gather of one integer (a hash of the description) per collective; the
    descriptions themselves travel only when the hashes differ. None when off.
    """

    def __init__(self, group, world_size: int):
        # Note: a gloo side channel, so the check also works when the job itself runs on NCCL.
        same = dist.get_backend(group) == "gloo"
        self.group = group if same else dist.new_group(dist.get_process_group_ranks(group),
                                                       backend="gloo")
        self.world_size, self.calls = world_size, 0

    def __call__(self, op: str, label: str, tensor: torch.Tensor | None, step: int) -> None:
        self.calls += 1
        mine = (op, label, 0 if tensor is None else tensor.numel(),
                "-" if tensor is None else str(tensor.dtype).replace("torch.", ""))
        digest = torch.tensor([zlib.crc32(repr(mine).encode())], dtype=torch.int64)
        digests = torch.empty(self.world_size, dtype=torch.int64)
        all_gather_flat(digests, digest, group=self.group)
        if bool((digests != digests[0]).any()):
            everyone: list = [None] * self.world_size
            dist.all_gather_object(everyone, mine, group=self.group)
            odd = next(r for r, theirs in enumerate(everyone) if theirs != everyone[0])
            raise CollectiveMismatchError(
                f"collective mismatch at step {step}, collective #{self.calls} of this job: "
                f"rank 0 issues {_describe(everyone[0])} but rank {odd} issues "
                f"{_describe(everyone[odd])}. Every rank must issue the same collectives in the "
                f"same order (a rank that skips a unit or a batch breaks the pairing).")


def _describe(fingerprint) -> str:
    op, label, numel, dtype = fingerprint
    return f"{op} {label!r} ({numel} {dtype} elements)"


