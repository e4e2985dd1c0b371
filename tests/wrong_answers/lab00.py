"""Lab 00's wrong answers to ``mean_of_ranks``, and the words ``labs.check_mean_of_ranks`` must
use. The finished ones are judged from one launch per world size (``lab00._check_means``, the code
path of ``check_mean_of_ranks``, each judged alone); the ones that hang get a launch each.
"""

from functools import cache

import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs.lab00 import checks as lab00
from wrong_answers import Wrong


def _mine(rank):
    return torch.tensor([float(rank)], device=fsdp_mini.rank_device())


def no_division(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    return t.item()


def returns_a_tensor(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    return t / world_size


def reduces_a_clone(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t.clone())          # the copy is summed; t is not
    return t.item() / world_size


def reduces_a_new_tensor(rank, world_size):
    t = _mine(rank)
    total = torch.tensor([t.item()])    # a new tensor with the same number
    dist.all_reduce(total)
    return t.item() / world_size        # ... but the old one is read


def no_collective(rank, world_size):
    return sum(range(world_size)) / world_size   # right number, no rank's tensor used


def own_rank(rank, world_size):
    return float(rank)


def max_op(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() / world_size


def reads_before(rank, world_size):
    t = _mine(rank)
    value = t.item()                       # read before the all-reduce
    dist.all_reduce(t)
    return value / world_size


def rank_plus_one(rank, world_size):
    t = torch.tensor([float(rank + 1)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    return t.item() / world_size


def floor_division(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    return t.item() // world_size


def minus_one(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    return t.item() / (world_size - 1)


def hardcoded_two(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    return t.item() / 2                    # the world size of the CI, written as a number


def never_waits(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t, async_op=True)      # the handle is dropped
    return t.item() / world_size


def rank_0_skips(rank, world_size):
    t = _mine(rank)
    if rank != 0:
        dist.all_reduce(t)
    return t.item() / world_size


BATCH = (no_division, returns_a_tensor, reduces_a_clone, reduces_a_new_tensor, no_collective,
         own_rank, max_op, reads_before, rank_plus_one, floor_division, minus_one, hardcoded_two,
         never_waits)


@cache
def _judged():
    return dict(zip(BATCH, lab00._check_means(list(BATCH), 2, "gloo")))


def batched(fn):
    return lambda: _judged()[fn].finish()


EX = "00_mean_of_ranks"
WRONG = [
    Wrong(EX, "returns the sum (no /N)", batched(no_division), ("divide it by world_size",)),
    Wrong(EX, "returns a tensor, not a float", batched(returns_a_tensor),
          ("python float, not a tensor", "t.item()")),
    Wrong(EX, "all-reduces t.clone(), returns t", batched(reduces_a_clone),
          ("works in place on the tensor you pass", "the copy", "was reduced")),
    Wrong(EX, "all-reduces a new tensor, returns the old one", batched(reduces_a_new_tensor),
          ("works in place on the tensor you pass", "the copy", "was reduced")),
    Wrong(EX, "the mean from world_size alone, no collective", batched(no_collective),
          ("called no dist.all_reduce", "without the other ranks' tensors")),
    Wrong(EX, "returns its own rank, no collective", batched(own_rank),
          ("called no dist.all_reduce",)),
    Wrong(EX, "ReduceOp.MAX", batched(max_op), ("max", "the mean needs the sum")),
    Wrong(EX, "reads t.item() before the all-reduce", batched(reads_before),
          ("before the all-reduce",)),
    Wrong(EX, "rank + 1 in the tensor", batched(rank_plus_one), ("rank + 1",)),
    Wrong(EX, "floor division", batched(floor_division), ("floor division",)),
    Wrong(EX, "divides by world_size - 1", batched(minus_one), ("world_size - 1",)),
    Wrong(EX, "divides by 2, the world size written as a number", batched(hardcoded_two),
          ("right on 2 ranks, wrong on 3", "world size written as a number")),
    Wrong(EX, "async_op=True, never waited", batched(never_waits),
          ("async_op=true", "never waited")),
    Wrong(EX, "rank 0 skips the all-reduce (hang)",
          lambda: labs.check_mean_of_ranks(rank_0_skips, 2, "gloo", timeout=5),
          ("the ranks did not finish", "every rank must call dist.all_reduce")),
]
