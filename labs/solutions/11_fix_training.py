"""Assessment, task 3, reference solution: the team's training function, fixed in three places.

1. One seed on every rank: parallelize broadcasts rank 0's weights, so a seed per rank did not
   break the weights, but it gave every rank its own shuffle: the ranks' rows overlapped.
2. Each micro-batch's loss divided by the number of micro-batches: their gradients add up.
3. fsdp_mini.clip_grad_norm_: under fsdp each rank holds a shard of the gradient, so the norm is
   summed over the ranks (torch's clip would clip by one rank's shard).
"""

import torch
from torch import nn

import fsdp_mini
from fsdp_mini import labs


def train_job(rank, world_size, steps):
    torch.manual_seed(0)                                   # fixed: the same shuffle on every rank
    model, optimizer = fsdp_mini.parallelize(labs.job_net(), "fsdp", optimizer=labs.job_sgd)
    micro_batches = labs.JOB_MICRO_BATCHES
    for step in range(steps):
        x, y = labs.job_batch(step)                        # the step's whole batch: 24 rows
        order = torch.randperm(len(x))                     # shuffled, the same way on every rank
        n = len(x) // world_size
        mine = order[rank * n:(rank + 1) * n]              # this rank's rows
        for xm, ym in zip(x[mine].chunk(micro_batches), y[mine].chunk(micro_batches)):
            loss = nn.functional.mse_loss(model(xm), ym) / micro_batches   # fixed: averaged
            loss.backward()
        fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM)  # fixed: the global norm
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)
