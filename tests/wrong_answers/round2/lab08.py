"""Fresh wrong answers for lab 08 (reshard), each one plausible learner mistake."""
import math

import torch

from wrong_answers.round2 import Case
from fsdp_mini import labs


def reshard_unsorted(old_shards, numel, new_world_size, new_rank):
    size = -(-numel // new_world_size)
    start = new_rank * size
    first = next(iter(old_shards.values()))
    out = {}
    for key in first:
        whole = torch.cat([s[key] for s in old_shards.values()])[:numel]   # in the order they came
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_keeps_old_padding(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    size = -(-numel // new_world_size)
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])           # old padding not dropped
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_floor_size(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    size = numel // new_world_size                                       # floor, not ceil
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])[:numel]
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_plus_one_ceil(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    size = numel // new_world_size + 1                                   # "ceil", one too many when it divides
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])[:numel]
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_no_new_padding(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    size = math.ceil(numel / new_world_size)
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])[:numel]
        out[key] = whole[start:start + size].clone()                     # short (or empty) at the end
    return out


def reshard_param_only(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    size = -(-numel // new_world_size)
    start = new_rank * size
    whole = torch.cat([old_shards[r]["param"] for r in ranks])[:numel]
    piece = whole[start:start + size]
    shard = torch.zeros(size, dtype=whole.dtype)
    shard[:piece.numel()] = piece
    out = {"param": shard}
    for key in old_shards[ranks[0]]:
        if key != "param":
            out[key] = torch.zeros(size, dtype=whole.dtype)              # moments restart from zero
    return out


def reshard_default_dtype(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    size = -(-numel // new_world_size)
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])[:numel]
        piece = whole[start:start + size]
        shard = torch.zeros(size)                                        # default float32
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_size_from_old_padded(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    total = sum(old_shards[r]["param"].numel() for r in ranks)           # the old padded length
    size = -(-total // new_world_size)
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])[:numel]
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_old_world_size(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    size = -(-numel // len(old_shards))                                  # the old N, not the new one
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])[:numel]
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_strip_each_old_shard(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    real = numel // len(ranks)                                           # "real elements per old shard"
    size = -(-numel // new_world_size)
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key][:real] for r in ranks])
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def reshard_zeroes_input_padding(old_shards, numel, new_world_size, new_rank):
    ranks = sorted(old_shards)
    old_size = old_shards[ranks[0]]["param"].numel()
    for i, r in enumerate(ranks):                                        # clean the old padding first,
        real = max(0, min(old_size, numel - i * old_size))               # in the caller's tensors
        for key in old_shards[r]:
            old_shards[r][key][real:] = 0
    size = -(-numel // new_world_size)
    start = new_rank * size
    out = {}
    for key in old_shards[ranks[0]]:
        whole = torch.cat([old_shards[r][key] for r in ranks])
        piece = whole[start:start + size]
        shard = torch.zeros(size, dtype=whole.dtype)
        shard[:piece.numel()] = piece
        out[key] = shard
    return out


def _check(fn):
    return lambda: labs.check_reshard(fn)


CASES = [
    Case("08_reshard", "concatenates the old shards in the order they came, not by rank", _check(reshard_unsorted)),
    Case("08_reshard", "does not drop the old padding before cutting (old NaNs end up in the new padding)",
         _check(reshard_keeps_old_padding)),
    Case("08_reshard", "new shard size numel // M (floor): the tail is lost when M does not divide numel",
         _check(reshard_floor_size)),
    Case("08_reshard", "new shard size numel // M + 1: one too many when M divides numel",
         _check(reshard_plus_one_ceil)),
    Case("08_reshard", "no new padding: the last shards are short or empty", _check(reshard_no_new_padding)),
    Case("08_reshard", "reshards only the parameter; Adam's moments are returned as zeros",
         _check(reshard_param_only)),
    Case("08_reshard", "new shards made with torch.zeros(size): float32 whatever the saved dtype",
         _check(reshard_default_dtype)),
    Case("08_reshard", "shard size from the old padded length instead of numel",
         _check(reshard_size_from_old_padded)),
    Case("08_reshard", "shard size from the old world size instead of the new one",
         _check(reshard_old_world_size)),
    Case("08_reshard", "drops padding by keeping numel // N_old elements of each old shard",
         _check(reshard_strip_each_old_shard)),
    Case("08_reshard", "zeroes the old padding in place, changing the caller's saved shards",
         _check(reshard_zeroes_input_padding)),
]
