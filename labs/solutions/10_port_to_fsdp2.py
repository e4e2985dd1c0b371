"""Reference solution of lab 10: fsdp_mini's units, written with torch's fully_shard (FSDP2)."""

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def port_to_fsdp2(model, param_dtype=None, lr=1e-3):
    policy = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
              if param_dtype is not None else MixedPrecisionPolicy())
    for block in model.blocks:              # each block a unit: units=list(model.blocks)
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)    # then the root: embeddings, final norm, head
    # Note: after fully_shard the parameters are new DTensor parameters: build the optimizer now.
    return model, torch.optim.AdamW(model.parameters(), lr=lr)
