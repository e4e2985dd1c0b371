"""The four jobs lab 10 compares: fsdp_mini's ``ddp`` and ``fsdp``, torch's DDP and FSDP2
(``fully_shard``), each built on the same model with AdamW.

    model, opt = build("torch fully_shard", make_model(GPTConfig.tiny()))   # on a started rank
"""

from __future__ import annotations

from functools import partial

import torch

__all__ = ["KINDS", "build"]

KINDS = ("fsdp_mini ddp", "torch DDP", "fsdp_mini fsdp", "torch fully_shard")


# -- building the four jobs -----------------------------------------------------------------------

def build(kind: str, net, lr: float = 1e-3, param_dtype=None):
    """``(model, optimizer)`` for one of :data:`KINDS`; every block is a unit (fsdp_mini's
    ``units=``, torch's ``fully_shard`` on each block, then on the root)."""
    import fsdp_mini
    adamw = partial(torch.optim.AdamW, lr=lr)
    if kind == "fsdp_mini ddp":
        return fsdp_mini.parallelize(net, "ddp", optimizer=adamw)
    if kind == "fsdp_mini fsdp":
        mp = ({"param_dtype": param_dtype, "reduce_dtype": torch.float32} if param_dtype else {})
        return fsdp_mini.parallelize(net, "fsdp", optimizer=adamw, units=list(net.blocks), **mp)
    if kind == "torch DDP":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(net)
        return ddp, adamw(ddp.parameters())
    if kind == "torch fully_shard":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32
                                      if param_dtype else None)
        for block in net.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(net, mp_policy=policy)
        return net, adamw(net.parameters())
    raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
