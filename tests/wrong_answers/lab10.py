"""Lab 10's wrong answers: ``port_to_fsdp2`` (fsdp_mini's units with torch's ``fully_shard``)
ported the way a learner gets it wrong. Each runs the checker itself (a launch of 2 ranks)."""

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from fsdp_mini import labs

from . import Wrong

EX = "10_port_to_fsdp2"


def _policy(param_dtype, reduce=torch.float32):
    return (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce)
            if param_dtype is not None else MixedPrecisionPolicy())


def root_not_wrapped(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def blocks_not_wrapped(model, param_dtype=None, lr=1e-3):
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def optimizer_first(model, param_dtype=None, lr=1e-3):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for block in model.blocks:
        fully_shard(block, mp_policy=_policy(param_dtype))
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, optimizer


def no_policy(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def module_list(model, param_dtype=None, lr=1e-3):
    fully_shard(model.blocks)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def policy_on_root_only(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def no_reduce_dtype(model, param_dtype=None, lr=1e-3):
    policy = MixedPrecisionPolicy(param_dtype=param_dtype)   # reduce_dtype left out: bf16
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def kept_gathered(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:              # "faster": no all-gather in backward
        fully_shard(block, mp_policy=_policy(param_dtype), reshard_after_forward=False)
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def per_layer(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:              # attention and MLP each a unit, not the block
        for part in (block.attn, block.mlp):
            fully_shard(part, mp_policy=_policy(param_dtype))
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def root_first(model, param_dtype=None, lr=1e-3):
    fully_shard(model, mp_policy=_policy(param_dtype))   # the root first, then the blocks
    for block in model.blocks:
        fully_shard(block, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def sgd(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block, mp_policy=_policy(param_dtype))
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def lr_hard_coded(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block, mp_policy=_policy(param_dtype))
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4)


def policy_on_blocks_only(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block, mp_policy=_policy(param_dtype))
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def model_cast(model, param_dtype=None, lr=1e-3):
    if param_dtype is not None:
        model = model.to(param_dtype)       # the weights cast, no MixedPrecisionPolicy
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def check(fn):
    return lambda: labs.check_port_to_fsdp2(fn)


WRONG = [
    Wrong(EX, "the root not wrapped", check(root_not_wrapped),
          ("the root is not wrapped", "gradients are never averaged")),
    Wrong(EX, "the blocks not wrapped", check(blocks_not_wrapped),
          ("0 of the 2 blocks are units", "1 all-gather per step instead of 5")),
    Wrong(EX, "the optimizer built before fully_shard", check(optimizer_first),
          ("the optimizer holds 26 parameters the model no longer uses", "built before fully_shard")),
    Wrong(EX, "no MixedPrecisionPolicy", check(no_policy),
          ("bf16: the blocks compute in torch.float32, but torch.bfloat16 was asked",)),
    Wrong(EX, "fully_shard on the ModuleList", check(module_list),
          ("fully_shard on model.blocks, the modulelist", "wrap each block")),
    Wrong(EX, "the policy on the root only", check(policy_on_root_only),
          ("do not all compute in the same dtype", "give every fully_shard call the same mp_policy")),
    Wrong(EX, "no reduce_dtype=torch.float32", check(no_reduce_dtype),
          ("reduce-scattered in bf16", "no reduce_dtype=torch.float32")),
    Wrong(EX, "reshard_after_forward=False on the blocks", check(kept_gathered),
          ("reshard_after_forward=false",)),
    Wrong(EX, "attention and MLP as units, not the blocks", check(per_layer),
          ("smaller than the blocks",)),
    Wrong(EX, "the root wrapped before the blocks", check(root_first),
          ("before the blocks",)),
    Wrong(EX, "SGD instead of AdamW", check(sgd), ("the optimizer is sgd", "adamw")),
    Wrong(EX, "the learning rate hard-coded", check(lr_hard_coded), ("lr", "0.0003")),
    Wrong(EX, "the policy on the blocks only", check(policy_on_blocks_only),
          ("same mp_policy",)),
    Wrong(EX, "the model cast to bf16 instead of a policy", check(model_cast),
          ("cast", "mixedprecisionpolicy")),
]
