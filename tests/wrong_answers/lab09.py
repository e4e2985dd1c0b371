"""Lab 09's wrong answers: each of the three broken training functions, half-fixed or fixed the
wrong way, as learners write them. Every one runs on the checker's own ranks (a launch each).

Not here: the weights averaged after the step instead of the gradients before it. Under the lab's
optimizer (SGD with momentum, linear in the gradient) that gives exactly the same weights, so no
check of the weights can tell it apart (under Adam it would differ)."""

import torch
import torch.distributed as dist
from torch import nn

import fsdp_mini
from fsdp_mini import labs

from . import Wrong

# ---- exercise 1: seeds and data (a hand-written loop, no parallelize) ----------------------


def hand_written(rank, world_size, steps, seed=0, rows="own", divide=True, reseed=None,
                 average="grads"):
    torch.manual_seed(seed)
    model = labs.debug_net()
    optimizer = labs.debug_sgd(model.parameters())
    if reseed is not None:
        torch.manual_seed(reseed(rank))        # "a seed for the data": after the model is built
    for step in range(steps):
        x, y = labs.debug_batch(step)
        n = len(x) // world_size
        if rows == "random":
            mine = torch.randperm(len(x))[:n]
        else:
            lo, hi = {"first": (0, n), "own": (rank * n, (rank + 1) * n),
                      "end+1": (rank * n, (rank + 1) * n + 1),
                      "end-1": (rank * n, (rank + 1) * n - 1)}[rows]
            mine = slice(lo, hi)
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        params = list(model.parameters())
        if average != "grads" and rank == 1:
            params = params[:-1]                # "the bias is tiny": rank 1 skips its all-reduce
        for p in params:
            dist.all_reduce(p.grad)
            if divide:
                p.grad /= world_size
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def e1_as_given(rank, world_size, steps):
    return hand_written(rank, world_size, steps, seed=rank, rows="first")


def e1_seed_fixed_only(rank, world_size, steps):
    return hand_written(rank, world_size, steps, rows="first")


def e1_rows_fixed_only(rank, world_size, steps):
    return hand_written(rank, world_size, steps, seed=rank)


def e1_same_random_rows(rank, world_size, steps):
    return hand_written(rank, world_size, steps, rows="random")


def e1_random_rows_per_rank(rank, world_size, steps):
    return hand_written(rank, world_size, steps, rows="random", reseed=lambda r: 100 + r)


def e1_slice_end_plus_one(rank, world_size, steps):
    return hand_written(rank, world_size, steps, rows="end+1")


def e1_slice_end_minus_one(rank, world_size, steps):
    return hand_written(rank, world_size, steps, rows="end-1")


def e1_no_divide(rank, world_size, steps):
    return hand_written(rank, world_size, steps, divide=False)


def e1_rank_1_skips_a_collective(rank, world_size, steps):
    return hand_written(rank, world_size, steps, average="all but rank 1's last")


# ---- exercise 2: the hang (fsdp, logging from rank 0) --------------------------------------


def logged(rank, world_size, steps, how="every rank gathers", skip_last_on_rank=None,
           returns="full"):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        if skip_last_on_rank == rank and step == steps - 1:
            break                               # one rank runs a step fewer
        x, y = labs.debug_batch(step, rank, world_size)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if how == "every rank gathers":
            weights = fsdp_mini.full_state_dict(model)
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
        elif how == "every rank prints":
            weights = fsdp_mini.full_state_dict(model)
            print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
        elif rank == 0 and how == "gather on rank 0":
            weights = fsdp_mini.full_state_dict(model)
            print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
        elif rank == 0 and how == "state_dict on rank 0":
            weights = model.state_dict()        # no collective: no hang... but a shard
            print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
        elif rank == 0 and how == "parameter on rank 0":
            w = next(model.parameters())
            print(f"step {step}: loss {loss.item():.4f}, |w| {w.detach().norm():.4f}")
    return fsdp_mini.full_state_dict(model) if returns == "full" else model.state_dict()


def e2_as_given(rank, world_size, steps):
    return logged(rank, world_size, steps, how="gather on rank 0")


def e2_state_dict_on_rank_0(rank, world_size, steps):
    return logged(rank, world_size, steps, how="state_dict on rank 0")


def e2_parameter_on_rank_0(rank, world_size, steps):
    return logged(rank, world_size, steps, how="parameter on rank 0")


def e2_logging_removed(rank, world_size, steps):
    return logged(rank, world_size, steps, how="none")


def e2_every_rank_prints(rank, world_size, steps):
    return logged(rank, world_size, steps, how="every rank prints")


def e2_returns_the_shard(rank, world_size, steps):
    return logged(rank, world_size, steps, returns="shard")


def e2_rank_1_a_step_fewer(rank, world_size, steps):
    return logged(rank, world_size, steps, skip_last_on_rank=1)


# ---- exercise 3: the loss and the clipping --------------------------------------------------


def clipped(rank, world_size, steps, scale=1.0, clip="fsdp", max_norm=None, when="after backward"):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    max_norm = labs.MAX_NORM if max_norm is None else max_norm(world_size)

    def clip_now():
        if clip == "fsdp":
            fsdp_mini.clip_grad_norm_(model, max_norm)
        elif clip == "torch":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        if when == "before backward":
            clip_now()
        (nn.functional.mse_loss(model(x), y) * scale(world_size)).backward()
        if when == "after backward":
            clip_now()
        optimizer.step()
        if when == "after step":
            clip_now()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def _one(n):
    return 1.0


def _over_n(n):
    return 1 / n


def _times_n(n):
    return float(n)


def _max_over_n(n):
    return labs.MAX_NORM / n


def e3_as_given(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_over_n, clip="torch")


def e3_clip_fixed_only(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_over_n)


def e3_loss_fixed_only(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_one, clip="torch")


def e3_max_norm_over_n(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_one, max_norm=_max_over_n)


def e3_max_norm_and_loss_over_n(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_over_n, max_norm=_max_over_n)


def e3_clipping_removed(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_one, clip=None)


def e3_clip_after_step(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_one, when="after step")


def e3_clip_before_backward(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_one, when="before backward")


def e3_loss_times_n(rank, world_size, steps):
    return clipped(rank, world_size, steps, scale=_times_n)


def one(check, fn):
    return lambda: check(fn)


E1, E2, E3 = "09_seeds_and_data", "09_hang", "09_clipping"
S, H, C = labs.check_seeds_and_data, labs.check_no_hang, labs.check_clipping

WRONG = [
    Wrong(E1, "as given: a seed per rank, every rank rank 0's rows", one(S, e1_as_given),
          ("before any step", "seed every rank the same")),
    Wrong(E1, "the seed fixed, every rank still on rank 0's rows", one(S, e1_seed_fixed_only),
          ("every rank trained on the same rows (rank 0's)",)),
    Wrong(E1, "the rows fixed, a seed per rank still", one(S, e1_rows_fixed_only),
          ("before any step", "seed every rank the same")),
    Wrong(E1, "random rows, the same draw on every rank", one(S, e1_same_random_rows),
          ("the same random rows on every rank",)),
    Wrong(E1, "random rows, each rank its own draw (seeds differ)",
          one(S, e1_random_rows_per_rank), ("each rank drew its own random rows",)),
    Wrong(E1, "slice end off by one (one row too many)", one(S, e1_slice_end_plus_one),
          ("more than once", "off by one")),
    Wrong(E1, "slice end off by one (one row too few)", one(S, e1_slice_end_minus_one),
          ("never seen", "off by one")),
    Wrong(E1, "the all-reduced gradient not divided by N", one(S, e1_no_divide),
          ("2 times (n = 2) too large",)),
    Wrong(E1, "rank 1 skips the all-reduce of one gradient", one(S, e1_rank_1_skips_a_collective),
          ("collectives do not match", "skipped")),
    Wrong(E2, "as given: full_state_dict on rank 0 only", one(H, e2_as_given),
          ("collective under `if rank == 0`", "where they waited: rank 0 at `")),
    Wrong(E2, "rank 0 logs model.state_dict() (its shard)", one(H, e2_state_dict_on_rank_0),
          ("its shard, not the whole weight",)),
    Wrong(E2, "rank 0 logs its parameter (a shard)", one(H, e2_parameter_on_rank_0),
          ("its shard, not the whole weight",)),
    Wrong(E2, "the logging removed", one(H, e2_logging_removed), ("must keep the logging",)),
    Wrong(E2, "every rank prints", one(H, e2_every_rank_prints), ("printed |w| too",)),
    Wrong(E2, "returns model.state_dict() (the shards)", one(H, e2_returns_the_shard),
          ("returned their shards",)),
    Wrong(E2, "rank 1 runs a step fewer", one(H, e2_rank_1_a_step_fewer),
          ("rank 1 returned while", "fewer steps")),
    Wrong(E3, "as given: loss / N, torch's clipping", one(C, e3_as_given),
          ("gradientschangederror", "fsdp_mini.clip_grad_norm_(model",
           "where the ranks were: rank 0 at `optimizer.step()`")),
    Wrong(E3, "the clipping fixed, the loss still / N", one(C, e3_clip_fixed_only),
          ("2 times (n = 2) too small: the loss was divided by the world size",)),
    Wrong(E3, "the loss fixed, torch's clipping still", one(C, e3_loss_fixed_only),
          ("gradientschangederror", "fsdp_mini.clip_grad_norm_(model")),
    Wrong(E3, "clip_grad_norm_(model, MAX_NORM / world_size)", one(C, e3_max_norm_over_n),
          ("max_norm / n", "global already", "too hard")),
    Wrong(E3, "max_norm / N and the loss / N", one(C, e3_max_norm_and_loss_over_n),
          ("max_norm / n", "loss divided by n")),
    Wrong(E3, "the clipping removed", one(C, e3_clipping_removed),
          ("the gradients were not clipped",)),
    Wrong(E3, "clipped after optimizer.step()", one(C, e3_clip_after_step),
          ("not clipped", "between backward() and optimizer.step()")),
    Wrong(E3, "clipped before backward", one(C, e3_clip_before_backward),
          ("not clipped", "between backward() and optimizer.step()")),
    Wrong(E3, "the loss multiplied by N", one(C, e3_loss_times_n),
          ("2 times (n = 2) too large",)),
]
