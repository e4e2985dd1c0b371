"""Bytes sent by any code's collectives, seen where they meet torch's dispatcher.

fsdp_mini's ledger records fsdp_mini's collectives only. torch's DDP and FSDP2 issue theirs as
``c10d`` ops, which a ``TorchDispatchMode`` sees with their tensors: enough to price each with the
ledger's ring model.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..comm.ledger import ring_bytes

__all__ = ["CollectiveBytes"]

_OPS = {"_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
        "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor_coalesced_":
        "reduce_scatter", "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
        "broadcast_": "broadcast", "barrier": "barrier"}


class CollectiveBytes(TorchDispatchMode):
    """Bytes this rank sends, per collective, for any code whose collectives reach the dispatcher.

        with CollectiveBytes(world_size=2) as sent:
            loss.backward()                   # under torch's fully_shard
        sent.totals()    # {"all_gather": 25216.0, "reduce_scatter": 25216.0}

    Each op is priced like the ledger: all-gather and reduce-scatter (N-1)/N of the whole tensor,
    all-reduce 2(N-1)/N. Note: the group's size is taken as ``world_size`` (torch's DDP and
    FSDP2 over the default group); ``calls`` keeps ``(op, payload bytes)`` in order.
    """

    def __init__(self, world_size: int):
        super().__init__()
        self.world_size, self.calls = world_size, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "c10d":
            op = _OPS.get(func._opname, func._opname)
            self.calls.append((op, _payload(op, args)))
        return out

    def totals(self) -> dict[str, float]:
        out = {}
        for op, payload in self.calls:
            if op in ("all_gather", "reduce_scatter", "all_reduce", "broadcast"):
                out[op] = out.get(op, 0.0) + ring_bytes(op, payload, self.world_size)
        return out

    def count(self, op: str) -> int:
        return sum(1 for o, _ in self.calls if o == op)


def _payload(op: str, args) -> int:
    tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
               if isinstance(t, torch.Tensor)]
    if not tensors:
        return 0
    if op in ("all_gather", "reduce_scatter"):  # the whole tensor: the gather's output, the
        return max(t.numel() * t.element_size() for t in tensors)  # scatter's input
    return sum(t.numel() * t.element_size() for t in tensors)
