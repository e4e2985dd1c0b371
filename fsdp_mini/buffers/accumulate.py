"""Gradient accumulation without communication: what ``fsdp_mini.no_sync`` keeps on each rank.

A step of k micro-batches runs k backwards. Plain accumulation communicates after each of them
(the averaged gradients add up: ``ShardPieces.add_grads``, or ``p.grad`` under ddp). Under
``no_sync`` the first k−1 backwards keep their gradients on the rank, unreduced, and the k-th
sends their sum once:

    ddp    ``p.grad`` accumulates by itself (autograd adds); the next backward all-reduces it
    zero1  nothing to do: its reduce-scatter waits for ``optimizer.step()`` anyway
    zero2  the whole ``p.grad`` is kept instead of being reduce-scattered and freed
    fsdp   each unit's whole flat gradient is kept here (:class:`LocalGradients`)

The trade, fsdp, Ψ parameters, N ranks: the kept gradients cost 4Ψ bytes per rank (all units,
unsharded, fp32) instead of 4Ψ/N, and save k−1 reduce-scatters of 4Ψ(N−1)/N bytes each. The
all-gathers of forward and backward happen for every micro-batch either way.

Example, fsdp, N = 2, k = 3, a unit of 4 elements::

    micro 1 (no_sync)   rank0 keeps [a a a a]           rank1 keeps [b b b b]      nothing sent
    micro 2 (no_sync)   rank0 keeps a + a'              rank1 keeps b + b'         nothing sent
    micro 3             rank0 sends a + a' + a''        rank1 sends b + b' + b''   one reduce-
                        keeps the mean of its half      keeps the mean of its half  scatter

The "no gradient" marks of :mod:`fsdp_mini.buffers.absent` survive the sums: −0.0 + −0.0 = −0.0 and
x + −0.0 = x, so a slot of a kept buffer still reads −0.0 exactly when no micro-batch gave it a
gradient, and a parameter unused in every micro-batch on every rank keeps ``grad is None``.
"""

from __future__ import annotations

import torch


class LocalGradients:
    """Whole flat gradients kept on this rank between micro-batches, one per flat group.

    ``keep`` adds a backward's flat gradient (and its absent slots) to the group's buffer;
    ``take`` adds the buffer into the flat gradient about to be reduce-scattered and forgets it.
    """

    def __init__(self):
        self._kept: dict[int, tuple[object, torch.Tensor, set[int]]] = {}

    def keep(self, group, flat_grad: torch.Tensor, absent: list[int]) -> None:
        kept = self._kept.get(id(group))
        if kept is None:
            # Note: the flat gradient itself becomes the buffer: no copy, no second allocation.
            self._kept[id(group)] = (group, flat_grad, set(absent))
            return
        _, buffer, was_absent = kept
        with torch.no_grad():
            buffer.add_(flat_grad)
        was_absent &= set(absent)  # absent only if absent in every micro-batch

    def take(self, group, flat_grad: torch.Tensor, absent: list[int]
             ) -> tuple[torch.Tensor, list[int]]:
        """``flat_grad`` plus what was kept for ``group`` (then forgotten), and the slots absent
        in all of them."""
        kept = self._kept.pop(id(group), None)
        if kept is None:
            return flat_grad, absent
        with torch.no_grad():
            flat_grad.add_(kept[1])
        return flat_grad, [j for j in absent if j in kept[2]]

    def leftovers(self, groups) -> list[tuple[object, torch.Tensor, list[int]]]:
        """The kept gradients of groups no backward has taken since (units the last micro-batch
        did not use), in the order of ``groups`` so every rank sends them in the same order."""
        out = []
        for group in groups:
            kept = self._kept.pop(id(group), None)
            if kept is not None:
                out.append((group, kept[1], sorted(kept[2])))
        return out

    @property
    def owed(self) -> bool:
        """Whether some kept gradient still waits to be communicated."""
        return bool(self._kept)

    def tensors(self) -> list[torch.Tensor]:
        """The kept buffers (memory category ``grads``)."""
        return [buffer for _, buffer, _ in self._kept.values()]

    def clear(self) -> None:
        """``zero_grad()``: drop what was accumulated, as plain torch drops ``p.grad``."""
        self._kept.clear()


def check_synced(strategy: str, owed: bool) -> None:
    """A clear error for ``optimizer.step()`` while gradients kept under ``no_sync`` were never
    communicated: each rank would update with its own gradients, or without them."""
    if owed:
        raise RuntimeError(
            f"{strategy}: optimizer.step() after backward() under fsdp_mini.no_sync, with no "
            f"backward outside it since: the accumulated gradients were never averaged over the "
            f"ranks. Run the last micro-batch's backward() outside the no_sync block (it sends "
            f"the sum of all of them), or call zero_grad() to drop them.")
