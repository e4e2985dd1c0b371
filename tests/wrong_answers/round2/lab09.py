"""Fresh wrong answers for lab 09 (debugging): seeds and data, the hang, the clipping."""
import torch
import torch.distributed as dist
from torch import nn

import fsdp_mini
from wrong_answers.round2 import Case
from fsdp_mini import labs


# ---------------------------------------------------------------- exercise 1: seeds and data

def train_1_div2(rank, world_size, steps):
    torch.manual_seed(0)
    model = labs.debug_net()
    optimizer = labs.debug_sgd(model.parameters())
    for step in range(steps):
        x, y = labs.debug_batch(step)
        n = len(x) // world_size
        x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= 2                          # two ranks
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_1_six_rows(rank, world_size, steps):
    torch.manual_seed(0)
    model = labs.debug_net()
    optimizer = labs.debug_sgd(model.parameters())
    for step in range(steps):
        x, y = labs.debug_batch(step)
        n = 6                                    # 12 rows over 2 ranks
        x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_1_overlap(rank, world_size, steps):
    torch.manual_seed(0)
    model = labs.debug_net()
    optimizer = labs.debug_sgd(model.parameters())
    for step in range(steps):
        x, y = labs.debug_batch(step)
        n = len(x) // world_size
        x, y = x[rank:rank + n], y[rank:rank + n]   # offset by the rank
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_1_no_seed(rank, world_size, steps):
    # removed the per-rank seed: every fresh process starts from torch's same default seed
    model = labs.debug_net()
    optimizer = labs.debug_sgd(model.parameters())
    for step in range(steps):
        x, y = labs.debug_batch(step)
        n = len(x) // world_size
        x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_1_steps_from_1(rank, world_size, steps):
    torch.manual_seed(0)
    model = labs.debug_net()
    optimizer = labs.debug_sgd(model.parameters())
    for step in range(1, steps + 1):             # steps 1..steps
        x, y = labs.debug_batch(step)
        n = len(x) // world_size
        x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


# ---------------------------------------------------------------- exercise 2: the hang

def train_2_all_print(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd,
                                             check_collectives=True)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        weights = fsdp_mini.full_state_dict(model)   # every rank calls it, and every rank prints
        print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
    return fsdp_mini.full_state_dict(model)


def train_2_shard_norm(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd,
                                             check_collectives=True)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:                            # no collective: read the weight directly
            w = model[0].weight.detach()
            print(f"step {step}: loss {loss.item():.4f}, |w| {w.norm():.4f}")
    return fsdp_mini.full_state_dict(model)


def train_2_sum_of_norms(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd,
                                             check_collectives=True)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        norm = model[0].weight.detach().norm().reshape(1).clone()   # this rank's piece
        dist.all_reduce(norm)                                       # every rank: no hang
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}, |w| {norm.item():.4f}")
    return fsdp_mini.full_state_dict(model)


def train_2_before_step(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd,
                                             check_collectives=True)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        weights = fsdp_mini.full_state_dict(model)   # logged before the update
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_2_last_rank(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd,
                                             check_collectives=True)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        weights = fsdp_mini.full_state_dict(model)
        if rank == world_size - 1:               # log from one rank only
            print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
    return fsdp_mini.full_state_dict(model)


def train_2_no_log(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd,
                                             check_collectives=True)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        # logging removed: it was what hung
    return fsdp_mini.full_state_dict(model)


# ---------------------------------------------------------------- exercise 3: the clipping

def train_3_loss_div_n(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y) / world_size   # kept
        loss.backward()
        fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_3_sum_loss(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y, reduction="sum")   # no division at all
        loss.backward()
        fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_3_clip_after_step(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM)
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_3_inf_norm(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM, norm_type=float("inf"))   # "max" norm
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def train_3_share_of_limit(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM / world_size)   # each rank's share
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


E1, E2, E3 = "09_seeds_and_data", "09_hang", "09_clipping"
CASES = [
    Case(E1, "averages the gradients by a hard-coded 2",
         lambda: labs.check_seeds_and_data(train_1_div2)),
    Case(E1, "takes a hard-coded 6 rows per rank",
         lambda: labs.check_seeds_and_data(train_1_six_rows)),
    Case(E1, "rows start at the rank, not rank * n: overlapping rows",
         lambda: labs.check_seeds_and_data(train_1_overlap)),
    Case(E1, "no seed at all: ranks agree only by torch's default seed, not seed 0",
         lambda: labs.check_seeds_and_data(train_1_no_seed)),
    Case(E1, "steps counted from 1: trains on batches 1..steps instead of 0..steps-1",
         lambda: labs.check_seeds_and_data(train_1_steps_from_1)),
    Case(E2, "every rank gathers and every rank prints the norm",
         lambda: labs.check_no_hang(train_2_all_print)),
    Case(E2, "rank 0 prints the norm of its own shard of the weight, no gather",
         lambda: labs.check_no_hang(train_2_shard_norm)),
    Case(E2, "all-reduces the shards' norms: sum of norms, not root of summed squares",
         lambda: labs.check_no_hang(train_2_sum_of_norms)),
    Case(E2, "logs the weights before optimizer.step(): one step stale",
         lambda: labs.check_no_hang(train_2_before_step)),
    Case(E2, "the last rank prints instead of rank 0",
         lambda: labs.check_no_hang(train_2_last_rank)),
    Case(E2, "removes the logging altogether",
         lambda: labs.check_no_hang(train_2_no_log)),
    Case(E3, "keeps the loss divided by world_size (clip fixed)",
         lambda: labs.check_clipping(train_3_loss_div_n)),
    Case(E3, "sum-reduced loss instead of the mean",
         lambda: labs.check_clipping(train_3_sum_loss)),
    Case(E3, "clips after optimizer.step(): clipping has no effect",
         lambda: labs.check_clipping(train_3_clip_after_step)),
    Case(E3, "clips by the infinity norm instead of the 2-norm",
         lambda: labs.check_clipping(train_3_inf_norm)),
    Case(E3, "clips at MAX_NORM / world_size",
         lambda: labs.check_clipping(train_3_share_of_limit)),
]
