"""Lab 09's wrong answers: each of the three broken training functions, half-fixed or fixed the
wrong way, as learners write them; each exercise's answers judged in one batch (JUDGES).

The weights averaged after the step instead of the gradients before it give SGD + momentum's
weights exactly (it is linear in the gradient): the check's AdamW configurations tell them
apart."""

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
                      "fixed": (rank * 6, (rank + 1) * 6),
                      "end+1": (rank * n, (rank + 1) * n + 1),
                      "end-1": (rank * n, (rank + 1) * n - 1)}[rows]
            mine = slice(lo, hi)
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        params = list(model.parameters())
        if average == "weights":               # "average the models": after the step
            optimizer.step()
            optimizer.zero_grad()
            for p in params:
                dist.all_reduce(p.data)
                p.data /= world_size
            continue
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


def e1_rows_of_two_ranks(rank, world_size, steps):
    return hand_written(rank, world_size, steps, rows="fixed")


def e1_weights_averaged_after_the_step(rank, world_size, steps):
    return hand_written(rank, world_size, steps, average="weights")


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
        if how == "before the step":           # every rank gathers, rank 0 prints: too early
            weights = fsdp_mini.full_state_dict(model)
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}, |w| {weights['0.weight'].norm():.4f}")
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


def e2_logged_before_the_step(rank, world_size, steps):
    return logged(rank, world_size, steps, how="before the step")


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


E1, E2, E3 = "09_seeds_and_data", "09_hang", "09_clipping"

WRONG = [
    Wrong(E1, "as given: a seed per rank, every rank rank 0's rows", e1_as_given,
          ("rank 1's weights when step 1 began", 'right with world size 1', 'one seed on every rank')),
    Wrong(E1, "the seed fixed, every rank still on rank 0's rows", e1_seed_fixed_only,
          ('rows 0-5 twice, rows 6-11 never', 'every rank was fed the same rows')),
    Wrong(E1, "the rows fixed, a seed per rank still", e1_rows_fixed_only,
          ("rank 1's weights when step 1 began", 'one seed on every rank')),
    Wrong(E1, "random rows, the same draw on every rank", e1_same_random_rows,
          ('the rows the nets were fed in step 1', 'twice', 'never', 'every rank was fed the same rows')),
    Wrong(E1, "random rows, each rank its own draw (seeds differ)", e1_random_rows_per_rank,
          ('the rows the nets were fed in step 1', 'twice', 'never', 'not the batch once', 'one seed for all')),
    Wrong(E1, "slice end off by one (one row too many)", e1_slice_end_plus_one,
          ('row 6 twice', 'a slice end off by one')),
    Wrong(E1, "slice end off by one (one row too few)", e1_slice_end_minus_one,
          ('row 11 never', 'a slice end off by one')),
    Wrong(E1, "rows cut by a fixed count (6: right on 2 ranks only)", e1_rows_of_two_ranks,
          ('at world size 1', 'rows 6-11 never', 'n = len(x) // world_size')),
    Wrong(E1, "the all-reduced gradient not divided by N", e1_no_divide,
          ('what step 1 changed', '(2x)', "n times the reference's", 'not divided by world_size')),
    Wrong(E1, "the weights averaged after the step", e1_weights_averaged_after_the_step,
          ("what step 1 changed in rank 0's weights", "after optimizer.step() the ranks' weights differ", 'average the gradients before the step')),
    Wrong(E1, "rank 1 skips the all-reduce of one gradient", e1_rank_1_skips_a_collective,
          ('sigabrt', 'the same collectives in the same order')),
    Wrong(E2, "as given: full_state_dict on rank 0 only", e2_as_given,
          ('the ranks hung: rank 0 waited in', 'rank 1 waited', 'under `if rank == 0`')),
    Wrong(E2, "rank 0 logs model.state_dict() (its shard)", e2_state_dict_on_rank_0,
          ("the reference's 1 all_gather of 236 b is missing in yours", 'the gather to log')),
    Wrong(E2, "rank 0 logs its parameter (a shard)", e2_parameter_on_rank_0,
          ("the reference's 1 all_gather of 236 b is missing in yours", 'the gather to log')),
    Wrong(E2, "the logging removed", e2_logging_removed,
          ('the |w| rank 0 printed in line 1: the reference has', 'yours has none', 'keep the log')),
    Wrong(E2, "every rank prints", e2_every_rank_prints,
          ('the |w| rank 1 printed', 'which the reference does not', 'only rank 0 prints')),
    Wrong(E2, "returns model.state_dict() (the shards)", e2_returns_the_shard,
          ("shape (28,) float32, the reference's (7, 4)", "model.state_dict() is a rank's 1-d shard")),
    Wrong(E2, "the weights logged before the step", e2_logged_before_the_step,
          ('collectives in step 1: yours makes 1 all_gather', 'before optimizer.step() that the reference makes after it')),
    Wrong(E2, "rank 1 runs a step fewer", e2_rank_1_a_step_fewer,
          ('the ranks hung', 'rank 1 had returned after 3 steps', 'another number of steps')),
    Wrong(E3, "as given: loss / N, torch's clipping", e3_as_given,
          ('gradientschangederror', 'fsdp_mini.clip_grad_norm_(model, max_norm)')),
    Wrong(E3, "the clipping fixed, the loss still / N", e3_clip_fixed_only,
          ('what step 1 changed', "1/n of the reference's", 'the loss was divided by n')),
    Wrong(E3, "the loss fixed, torch's clipping still", e3_loss_fixed_only,
          ('gradientschangederror', "torch's clip_grad_norm_ sees this rank's shard only")),
    Wrong(E3, "clip_grad_norm_(model, MAX_NORM / world_size)", e3_max_norm_over_n,
          ('max norm 0.05', '(0.5x)', 'clipped n times too hard')),
    Wrong(E3, "max_norm / N and the loss / N", e3_max_norm_and_loss_over_n,
          ("1/n of the reference's: the loss was divided by n", 'clipped n times too hard')),
    Wrong(E3, "the clipping removed", e3_clipping_removed,
          ('(15.8x)', 'wrong where the reference clips', 'between backward() and step()')),
    Wrong(E3, "clipped after optimizer.step()", e3_clip_after_step,
          ('(15.8x)', 'wrong where the reference clips', 'between backward() and step()')),
    Wrong(E3, "clipped before backward", e3_clip_before_backward,
          ('(15.8x)', 'wrong where the reference clips', 'between backward() and step()')),
    Wrong(E3, "the loss multiplied by N", e3_loss_times_n,
          ("n times the reference's", 'where nothing is clipped')),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("09")
