"""Fresh wrong answers for lab 10 (to production): 10_port_to_fsdp2.

Each answer starts from the reference solution and changes one thing, the way a learner would.
Everything is defined at module level, so the ranks (fresh processes) can find it.
"""

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import fsdp_mini
from wrong_answers.round2 import Case
from fsdp_mini import labs


def _policy(param_dtype):
    return (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
            if param_dtype is not None else MixedPrecisionPolicy())


# --- 1. optimizer built before fully_shard: it holds the old, replaced parameters
def port_opt_first(model, param_dtype=None, lr=1e-3):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    policy = _policy(param_dtype)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, optimizer


# --- 2. the blocks only: the root (embeddings, ln_f, head) is never sharded
def port_no_root(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 3. the root only: the whole model is one unit
def port_root_only(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 4. reduce_dtype left out: gradients are reduced in param_dtype (bf16), not fp32
def port_no_reduce_dtype(model, param_dtype=None, lr=1e-3):
    policy = (MixedPrecisionPolicy(param_dtype=param_dtype)
              if param_dtype is not None else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 5. lr argument ignored: AdamW's own default is used
def port_ignores_lr(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters())


# --- 6. blocks kept gathered after forward (reshard_after_forward=False, "faster")
def port_no_reshard(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 7. attention and MLP of each block as units, not the block
def port_sublayers(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    for block in model.blocks:
        fully_shard(block.attn, mp_policy=policy)
        fully_shard(block.mlp, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 8. off by one: the last block is left in the root unit
def port_skip_last(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    for i in range(len(model.blocks) - 1):
        fully_shard(model.blocks[i], mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 9. Adam instead of AdamW (no decoupled weight decay)
def port_adam(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


# --- 10. casts the whole model to param_dtype instead of a mixed-precision policy
def port_cast_model(model, param_dtype=None, lr=1e-3):
    if param_dtype is not None:
        model.to(param_dtype)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 11. param_dtype defaults to bf16: the fp32 run computes in bf16 too
def port_always_bf16(model, param_dtype=None, lr=1e-3):
    policy = MixedPrecisionPolicy(param_dtype=param_dtype or torch.bfloat16,
                                  reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 12. units=list(model.blocks) passed to fully_shard as ONE group
def port_blocks_one_group(model, param_dtype=None, lr=1e-3):
    policy = _policy(param_dtype)
    fully_shard(list(model.blocks), mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


# --- 13. a mesh of 2 ranks written in (copied from a 2-GPU tutorial)
def port_mesh_of_2(model, param_dtype=None, lr=1e-3):
    mesh = init_device_mesh(fsdp_mini.rank_device().type, (2,))
    policy = _policy(param_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def _port(fn):
    return lambda: labs.check_port_to_fsdp2(fn)


CASES = [
    Case("10_port_to_fsdp2", "builds the optimizer before fully_shard, so it holds the replaced parameters",
         _port(port_opt_first)),
    Case("10_port_to_fsdp2", "shards the blocks but never calls fully_shard on the root model",
         _port(port_no_root)),
    Case("10_port_to_fsdp2", "calls fully_shard on the root only: the whole model is one unit",
         _port(port_root_only)),
    Case("10_port_to_fsdp2", "leaves reduce_dtype out, so gradients are reduced in bf16",
         _port(port_no_reduce_dtype)),
    Case("10_port_to_fsdp2", "ignores the lr argument and uses AdamW's default",
         _port(port_ignores_lr)),
    Case("10_port_to_fsdp2", "reshard_after_forward=False on the blocks: kept gathered, no re-gather in backward",
         _port(port_no_reshard)),
    Case("10_port_to_fsdp2", "makes each block's attention and MLP the units instead of the blocks",
         _port(port_sublayers)),
    Case("10_port_to_fsdp2", "off by one: the last block is not made a unit",
         _port(port_skip_last)),
    Case("10_port_to_fsdp2", "uses Adam instead of AdamW",
         _port(port_adam)),
    Case("10_port_to_fsdp2", "casts the whole model to param_dtype instead of using MixedPrecisionPolicy",
         _port(port_cast_model)),
    Case("10_port_to_fsdp2", "param_dtype falls back to bf16, so the fp32 run computes in bf16",
         _port(port_always_bf16)),
    Case("10_port_to_fsdp2", "passes all blocks to fully_shard as one list: one unit for all blocks",
         _port(port_blocks_one_group)),
    Case("10_port_to_fsdp2", "hard-codes a device mesh of 2 ranks",
         _port(port_mesh_of_2)),
]
