"""Lab 00's wrong answers to ``mean_of_ranks``, and the words ``labs.check_mean_of_ranks`` must
use. All are judged together by ``JUDGES["00_mean_of_ranks"]`` (the code path of the checker, one
launch per world size; an answer that raises or hangs ends its own launch).
"""

import torch
import torch.distributed as dist
from torch.distributed import all_reduce

import fsdp_mini
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


def only_rank_0_returns(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    return t.item() / world_size if rank == 0 else None


def reduces_twice(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    dist.all_reduce(t)                     # the sum of the sums: N times too much
    return t.item() / world_size


def product_op(rank, world_size):
    t = _mine(rank) + 1
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    return t.item() / world_size


def integer_tensor_floor(rank, world_size):
    t = torch.tensor([rank])               # an int64 tensor: the sum is an int
    dist.all_reduce(t)
    return float(t.item() // world_size)


def returns_a_list(rank, world_size):
    t = _mine(rank)
    dist.all_reduce(t)
    return (t / world_size).tolist()


# Answers written otherwise than the reference, that the check must pass (tests/test_lab00.py)
def divides_first(rank, world_size):
    t = torch.tensor([rank / world_size])      # the mean of the shares is the mean
    dist.all_reduce(t)
    return t.item()


def waits_for_its_handle(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t, async_op=True).wait()
    return t.item() / world_size


def imported_by_name(rank, world_size):
    t = torch.tensor([rank])                   # an int tensor, divided with /
    all_reduce(t)
    return t.item() / world_size


RIGHT = (divides_first, waits_for_its_handle, imported_by_name)

EX = "00_mean_of_ranks"
WRONG = [
    Wrong(EX, "returns the sum (no /N)", no_division,
          ("at world size 2", "yours 1, the reference 0.5", "right with world size 1",
           "returned the sum: divide by world_size")),
    Wrong(EX, "returns a tensor, not a float", returns_a_tensor,
          ("yours 'tensor', the reference 'float'", "python float, not a tensor", "t.item()")),
    Wrong(EX, "all-reduces t.clone(), returns t", reduces_a_clone,
          ("yours 0, the reference 0.5", "works in place on the tensor you pass", "the copy",
           "was reduced")),
    Wrong(EX, "all-reduces a new tensor, returns the old one", reduces_a_new_tensor,
          ("yours 0, the reference 0.5", "works in place on the tensor you pass", "the copy",
           "was reduced")),
    Wrong(EX, "the mean from world_size alone, no collective", no_collective,
          ("yours 'no call', the reference 'sum'", "called no dist.all_reduce",
           "without the other ranks' tensors")),
    Wrong(EX, "returns its own rank, no collective", own_rank,
          ("yours 'no call', the reference 'sum'", "called no dist.all_reduce")),
    Wrong(EX, "ReduceOp.MAX", max_op,
          ("yours 'max', the reference 'sum'", "the mean needs one all-reduce of the sum")),
    Wrong(EX, "reads t.item() before the all-reduce", reads_before,
          ("yours 0, the reference 0.5", "before the all-reduce")),
    Wrong(EX, "rank + 1 in the tensor", rank_plus_one,
          ("yours 1, the reference 0", "the mean +1", "rank + 1 in the tensor")),
    Wrong(EX, "floor division", floor_division,
          ("right with world size 1, 3, wrong with 2, 4", "floor division")),
    Wrong(EX, "divides by world_size - 1", minus_one,
          ("at world size 1", "zerodivisionerror", "world_size - 1",
           "divides their sum by n, world_size itself")),
    Wrong(EX, "divides by 2, the world size written as a number", hardcoded_two,
          ("right with world size 1, 2, wrong with 3, 4", "divided the sum by 2 whatever the "
           "world size", "written as a number")),
    Wrong(EX, "async_op=True, never waited", never_waits,
          ("yours 'sum (async_op=true, never waited)'", "was never waited for",
           "handle.wait()")),
    Wrong(EX, "rank 0 skips the all-reduce (hang)", rank_0_skips,
          ("yours 'no call'", "the ranks hung at a larger world size",
           "every rank must make the same dist.all_reduce calls")),
    Wrong(EX, "only rank 0 returns the mean", only_rank_0_returns,
          ("at world size 2", "yours 'nonetype', the reference 'float'",
           "rank 1 returned none")),
    Wrong(EX, "all-reduces twice", reduces_twice,
          ("yours 'sum, sum', the reference 'sum'", "one all-reduce of the sum")),
    Wrong(EX, "ReduceOp.PRODUCT of rank + 1", product_op,
          ("yours 'product', the reference 'sum'", "the mean needs one all-reduce of the sum")),
    Wrong(EX, "an int tensor and //", integer_tensor_floor,
          ("right with world size 1, 3, wrong with 2, 4", "floor division")),
    Wrong(EX, "returns a list", returns_a_list,
          ("yours 'list', the reference 'float'", "python float, not a list")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("00")
