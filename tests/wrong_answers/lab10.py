"""Lab 10's wrong answers: ``port_to_fsdp2`` (fsdp_mini's units with torch's ``fully_shard``)
ported the way a learner gets it wrong; judged in one batch (JUDGES)."""

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


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


def other_betas(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:              # "the betas of the paper I read": trains almost alike
        fully_shard(block, mp_policy=_policy(param_dtype))
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))


def weight_decay_off(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block, mp_policy=_policy(param_dtype))
    fully_shard(model, mp_policy=_policy(param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)


WRONG = [
    Wrong(EX, "the root not wrapped", root_not_wrapped,
          ("the fsdp units: yours 'blocks.0, blocks.1'", 'fully_shard(model) is missing')),
    Wrong(EX, "the blocks not wrapped", blocks_not_wrapped,
          ("the fsdp units: yours 'the root', the reference 'the root, blocks.0, blocks.1'", 'each block a unit')),
    Wrong(EX, "the optimizer built before fully_shard", optimizer_first,
          ('yours "0 of its 26 parameters are the model\'s"', 'build the optimizer after it')),
    Wrong(EX, "no MixedPrecisionPolicy", no_policy,
          ("['param_dtype']: yours 'torch.float32', the reference 'torch.bfloat16'", "right with dtype 'fp32', wrong with 'bf16'")),
    Wrong(EX, "fully_shard on the ModuleList", module_list,
          ('containers that do not implement forward', 'wraps the modulelist')),
    Wrong(EX, "the policy on the root only", policy_on_root_only,
          ("'the root'['reduce_dtype']: yours 'torch.bfloat16'", 'reduce the gradients in fp32')),
    Wrong(EX, "no reduce_dtype=torch.float32", no_reduce_dtype,
          ("['reduce_dtype']: yours 'torch.bfloat16', the reference 'torch.float32'", 'reduce the gradients in fp32')),
    Wrong(EX, "reshard_after_forward=False on the blocks", kept_gathered,
          ("['reshard_after_forward']: yours false", 'reshard_after_forward=true')),
    Wrong(EX, "attention and MLP as units, not the blocks", per_layer,
          ('blocks.0.attn, blocks.0.mlp', 'smaller units than the blocks')),
    Wrong(EX, "the root wrapped before the blocks", root_first,
          ("the fsdp units: yours 'the root'", 'the blocks first')),
    Wrong(EX, "SGD instead of AdamW", sgd,
          ("the optimizer: yours 'sgd', the reference 'adamw'",)),
    Wrong(EX, "the learning rate hard-coded", lr_hard_coded,
          ("['lr']: yours 0.0003, the reference 0.001",)),
    Wrong(EX, "the policy on the blocks only", policy_on_blocks_only,
          ("'the root'['param_dtype']: yours 'torch.float32'", 'the same mp_policy on every fully_shard call')),
    Wrong(EX, "the model cast to bf16 instead of a policy", model_cast,
          ("['reduce_dtype']: yours 'torch.bfloat16'", 'reduce the gradients in fp32')),
    Wrong(EX, "AdamW with other betas", other_betas,
          ("['betas']: yours (0.9, 0.95), the reference (0.9, 0.999)",)),
    Wrong(EX, "AdamW without its weight decay", weight_decay_off,
          ("['weight_decay']: yours 0, the reference 0.01",)),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("10")
