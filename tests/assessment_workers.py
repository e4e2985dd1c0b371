"""Rank functions for tests/test_assessment.py (importable, so spawned ranks find them)."""

import torch

import fsdp_mini
from fsdp_mini import labs


def log_on_rank_0(rank, world_size, steps):
    """The fixed function, but rank 0 alone gathers the weights to log them: a hang."""
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.job_net(), "fsdp", optimizer=labs.job_sgd)
    for step in range(steps):
        x, y = labs.job_batch(step)
        n = len(x) // world_size
        mine = torch.randperm(len(x))[rank * n:(rank + 1) * n]
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            fsdp_mini.full_state_dict(model)
    return fsdp_mini.full_state_dict(model)
