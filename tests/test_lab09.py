"""Lab 09's checkers pass the reference solutions and name, in plain words, what is still wrong
in each broken training function of the lab (and in the half-fixed ones learners write on the way).

(Under CI=true, set by conftest, a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest
import torch
import torch.distributed as dist
from torch import nn

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs import lab09


def complaint(check, fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        check(fn)
    return str(info.value)


def hand_written(rank, world_size, steps, seed, rows):
    """Exercise 1's loop: the seed and the rows each rank takes are the bugs to fix."""
    torch.manual_seed(seed)
    model = labs.debug_net()
    optimizer = labs.debug_sgd(model.parameters())
    for step in range(steps):
        x, y = labs.debug_batch(step)
        n = len(x) // world_size
        mine = slice(0, n) if rows == "first" else slice(rank * n, (rank + 1) * n)
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def as_given_1(rank, world_size, steps):
    return hand_written(rank, world_size, steps, seed=rank, rows="first")


def seed_fixed_only(rank, world_size, steps):
    return hand_written(rank, world_size, steps, seed=0, rows="first")


def as_given_2(rank, world_size, steps):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            fsdp_mini.full_state_dict(model)
    return fsdp_mini.full_state_dict(model)


def fsdp_clipped(rank, world_size, steps, scale, torch_clip):
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        (nn.functional.mse_loss(model(x), y) * scale).backward()
        if torch_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), labs.MAX_NORM)
        else:
            fsdp_mini.clip_grad_norm_(model, labs.MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def as_given_3(rank, world_size, steps):
    return fsdp_clipped(rank, world_size, steps, 1 / world_size, torch_clip=True)


def clip_fixed_only(rank, world_size, steps):
    return fsdp_clipped(rank, world_size, steps, 1 / world_size, torch_clip=False)


SOLUTIONS = {"train_1": "09_seeds_and_data", "train_2": "09_hang", "train_3": "09_clipping"}
JUDGED = {**{fn: labs.load_solution(name, fn) for fn, name in SOLUTIONS.items()},
          "as_given_1": as_given_1, "seed_fixed_only": seed_fixed_only,
          "clip_fixed_only": clip_fixed_only}


@pytest.fixture(scope="module")
def runs():
    """Every function that runs to the end, in one launch (the checker launches one each; the
    notebook, run by CI, passes the reference solutions through the whole checks)."""
    out = fsdp_mini.launch(lab09._run, 2, list(JUDGED.values()), labs.DEBUG_STEPS, timeout=30)
    return {name: [by_rank[i] for by_rank in out] for i, name in enumerate(JUDGED)}


def judged(runs, name, clip=None) -> str:
    return str(lab09._judge(labs.CheckResult(name), runs[name], clip))


@pytest.mark.parametrize("fn, clip", [("train_1", None), ("train_2", None),
                                      ("train_3", labs.MAX_NORM)])
def test_the_reference_solutions_pass(runs, fn, clip):
    said = judged(runs, fn, clip)
    assert said.startswith(f"✔ {fn}: all checks passed") and "train like one process" in said


def test_a_seed_per_rank_is_named_before_anything_else(runs):
    said = judged(runs, "as_given_1")
    assert "before any step, rank 1's '0.weight' differs from rank 0's" in said
    assert "seed every rank the same" in said and "one-process" not in said


def test_every_rank_on_the_same_rows_is_named_once_the_seed_is_fixed(runs):
    said = judged(runs, "seed_fixed_only")
    assert "✔ every rank starts from the same weights (seed 0)" in said
    assert "every rank trained on the same rows (rank 0's)" in said
    assert "debug_batch(step, rank, world_size)" in said


def test_a_loss_divided_by_the_world_size_is_named_once_clipping_is_fixed(runs):
    said = judged(runs, "clip_fixed_only", labs.MAX_NORM)
    assert "the gradients are 2 times (N = 2) too small: the loss was divided by the world size" in said


def test_a_collective_on_rank_0_only_is_stopped_and_explained(monkeypatch):
    monkeypatch.setattr(lab09, "CHECK_TIMEOUT", 3)
    said = complaint(labs.check_no_hang, as_given_2)
    assert "timed out after 3 s" in said and "collective under `if rank == 0`" in said
    assert "check_collectives=True) names both sides" in said
    # where each rank waited, as a sentence: "rank 0 at `line` in as_given_2", never " (in f: ...)"
    assert "Where they waited: rank 0 at `" in said and "` in as_given_2" in said
    assert " (in " not in said and "at(" not in said


def test_torch_clipping_of_sharded_gradients_is_named():
    said = complaint(labs.check_clipping, as_given_3)
    assert "raised GradientsChangedError" in said and "fsdp_mini.clip_grad_norm_(model" in said
    assert "Where the ranks were: rank 0 at `optimizer.step()` in fsdp_clipped" in said


@pytest.mark.parametrize("replay, clip, words", [
    ({"world_size": 2, "scale": 2.0}, None, "2 times (N = 2) too large: the sum over ranks was not divided"),
    ({}, None, None),
    ({"clip": None}, labs.MAX_NORM, "the gradients were not clipped"),
    ({"world_size": 2, "rows": "first", "clip": labs.MAX_NORM}, labs.MAX_NORM, "the same rows"),
    ({"scale": 1.5}, None, "differ from one-process training by")])
def test_parity_names_the_mistake_whose_replay_gives_the_weights(replay, clip, words):
    """The judging alone, on weights a mistake gives (replayed in one process: no launch)."""
    result = labs.CheckResult("parity")
    lab09._judge_parity(result, labs.one_process(**replay), 2, clip)
    assert result.passed == (words is None), str(result)
    assert words is None or words in str(result)


def test_clipping_matters_at_the_lab_max_norm():
    """MAX_NORM clips some steps and not others: a missing clip changes the weights."""
    assert lab09.relative_difference(labs.one_process(clip=labs.MAX_NORM), labs.one_process()) > 1e-3


def test_a_stub_is_not_written_yet():
    def train_1(rank, world_size, steps):
        ...

    assert "not written yet" in complaint(labs.check_seeds_and_data, train_1)


def test_the_notebook_keeps_the_three_broken_functions_for_the_learner():
    nb = nbformat.read(Path(labs.__file__).parents[2] / "labs" / "09_debugging.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "torch.manual_seed(rank)                     # \"each rank its own seed\"" in text
    assert "if rank == 0:                           # log from one rank only" in text
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), labs.MAX_NORM)" in text
    assert "ranks.stop()" in text


def test_a_world_size_that_does_not_split_the_batch_is_refused_before_launching():
    with pytest.raises(ValueError, match="split the debug batch's 12 rows evenly"):
        labs.check_parity(lambda rank, world_size, steps: {}, world_size=5)


def test_weights_under_other_names_are_named():
    wrapped = {f"module.{k}": v for k, v in labs.one_process(steps=0).items()}
    said = str(lab09._judge(labs.CheckResult("names"), [{"before": wrapped, "after": wrapped}]))
    assert "returned weights named ['module.0.bias'" in said and "full_state_dict" in said
