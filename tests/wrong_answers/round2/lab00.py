"""Lab 00 (setup): fresh wrong answers for the exercise 00_mean_of_ranks."""
import torch
import torch.distributed as dist

import fsdp_mini
from wrong_answers.round2 import Case
from fsdp_mini import labs

WORLD_SIZE, BACKEND = 2, "gloo"          # labs.lab_config() under CI: 2 gloo ranks


def check(fn):
    return labs.check_mean_of_ranks(fn, WORLD_SIZE, BACKEND)


# 1. the world size of the run, typed as a number
def mean_hardcoded_two(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    return t.item() / 2


# 2. MAX instead of SUM; max(0..N-1) / 2 happens to equal the mean at every N
def mean_max_halved(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() / 2


# 3. async all-reduce whose handle is never waited for
def mean_async_not_waited(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t, async_op=True)
    return t.item() / world_size


# 4. async all-reduce, value read before waiting on the handle
def mean_read_before_wait(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    work = dist.all_reduce(t, async_op=True)
    mean = t.item() / world_size
    work.wait()
    return mean


# 5. returns the tensor, not a Python float
def mean_returns_tensor(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    return t / world_size


# 6. copies the lab's first_collective: rank r contributes r + 1
def mean_rank_plus_one(rank, world_size):
    t = torch.tensor([float(rank + 1)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    return t.item() / world_size


# 7. closed form, no collective at all
def mean_closed_form(rank, world_size):
    return (world_size - 1) / 2


# 8. all_gather and average the list instead of all_reduce
def mean_via_all_gather(rank, world_size):
    device = fsdp_mini.rank_device()
    everyone = [torch.zeros(1, device=device) for _ in range(world_size)]
    dist.all_gather(everyone, torch.tensor([float(rank)], device=device))
    return sum(e.item() for e in everyone) / world_size


# 9. a second all-reduce (MAX) "to make sure every rank agrees" on the mean
def mean_extra_all_reduce(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    t /= world_size
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


# 10. only rank 0 turns the sum into the mean; the others return the sum
def mean_only_rank_0(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    if rank == 0:
        return t.item() / world_size
    return t.item()


# 11. divides by rank + 1 ("how many ranks up to me") instead of world_size
def mean_divides_by_rank(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    return t.item() / (rank + 1)


# 12. floor division
def mean_floor_division(rank, world_size):
    t = torch.tensor([float(rank)], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    return t.item() // world_size


# 13. tensor on the CPU, not rank_device() (breaks under NCCL only)
def mean_on_cpu(rank, world_size):
    t = torch.tensor([float(rank)], device="cpu")
    dist.all_reduce(t)
    return t.item() / world_size


# 14. integer tensor and integer mean
def mean_int_tensor(rank, world_size):
    t = torch.tensor([rank], device=fsdp_mini.rank_device())
    dist.all_reduce(t)
    return float(t.item() // world_size)


E = "00_mean_of_ranks"
CASES = [
    Case(E, "divides the sum by a hard-coded 2 instead of world_size", lambda: check(mean_hardcoded_two)),
    Case(E, "all-reduces with MAX and halves it (equals the mean of 0..N-1 by coincidence)", lambda: check(mean_max_halved)),
    Case(E, "all_reduce with async_op=True and the handle is never waited for", lambda: check(mean_async_not_waited)),
    Case(E, "reads the value before waiting on the async all_reduce handle", lambda: check(mean_read_before_wait)),
    Case(E, "returns a tensor instead of a Python float", lambda: check(mean_returns_tensor)),
    Case(E, "each rank contributes rank + 1 instead of rank", lambda: check(mean_rank_plus_one)),
    Case(E, "returns the closed form (N-1)/2 without any all_reduce", lambda: check(mean_closed_form)),
    Case(E, "uses all_gather and averages the list instead of all_reduce", lambda: check(mean_via_all_gather)),
    Case(E, "makes a second all_reduce (MAX) of the mean, one call too many", lambda: check(mean_extra_all_reduce)),
    Case(E, "only rank 0 divides by world_size; other ranks return the sum", lambda: check(mean_only_rank_0)),
    Case(E, "divides by rank + 1 instead of world_size", lambda: check(mean_divides_by_rank)),
    Case(E, "floor division (//) of the sum by world_size", lambda: check(mean_floor_division)),
    Case(E, "creates the tensor on the CPU instead of rank_device()", lambda: check(mean_on_cpu)),
    Case(E, "integer tensor of the rank, integer division of the sum", lambda: check(mean_int_tensor)),
]
