"""Lab 09's checks: each training function beside the reference on 1-4 ranks, compared on what
``fsdp_mini.debug.watch`` sees (the rows fed, each step's collectives, update and weights, what
rank 0 printed, what was returned). The reference solutions pass; a stub is "not written yet";
a divergence is reported at the smallest configuration with where it is right and wrong; a hang
names the ranks and where each waited. The registry of wrong answers is
tests/wrong_answers/lab09.py, run by tests/test_wrong_answers.py.

(Under CI=true, set by conftest, a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.debug.seen import rows_in_words, scale
from fsdp_mini.labs.lab09 import checks


@pytest.fixture
def learner(monkeypatch):
    """As on a learner's laptop: a failed check reports, it does not raise."""
    monkeypatch.setenv("CI", "false")


def train(rank, world_size, steps):
    """The notebook's parity function: fsdp, each rank its rows, no clipping."""
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def rows_of_two_ranks(rank, world_size, steps):
    """Right on 2 ranks only: each rank takes 6 rows, whatever the world size."""
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step)
        nn.functional.mse_loss(model(x[rank * 6:rank * 6 + 6]), y[rank * 6:rank * 6 + 6]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_mini.full_state_dict(model)


def logs_on_rank_0(rank, world_size, steps):
    """Exercise 2 as the notebook gives it: rank 0 alone gathers the weights: a hang."""
    torch.manual_seed(0)
    model, optimizer = fsdp_mini.parallelize(labs.debug_net(), "fsdp", optimizer=labs.debug_sgd)
    for step in range(steps):
        x, y = labs.debug_batch(step, rank, world_size)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"|w| {fsdp_mini.full_state_dict(model)['0.weight'].norm():.4f}")
    return fsdp_mini.full_state_dict(model)


@pytest.mark.parametrize("check, name, fn", [
    (labs.check_seeds_and_data, "09_seeds_and_data", "train_1"),
    (labs.check_no_hang, "09_hang", "train_2"),
    (labs.check_clipping, "09_clipping", "train_3")])
def test_the_reference_solutions_pass_on_1_to_4_ranks(check, name, fn):
    result = check(labs.load_solution(name, fn))
    assert result.passed and "world size 1 / 2 / 3 / 4" in str(result), str(result)
    assert result.checker == check.__name__ and result.facts["configurations"] >= 8


def test_parity_of_the_notebooks_function_keeps_its_error_for_the_notebook():
    result = labs.check_parity(train, 2)
    assert result.passed, str(result)
    assert 0 <= result.facts["parity_error"] < 1e-5
    clipped = labs.check_parity(labs.load_solution("09_clipping", "train_3"), 2,
                                clip=labs.MAX_NORM)
    assert clipped.passed and clipped.facts["parity_error"] < 1e-5, str(clipped)


def test_a_function_right_at_one_world_size_is_shown_at_another(learner):
    said = str(labs.check_parity(rows_of_two_ranks, 2))
    assert "at world size 1" in said and "rows 6-11 never" in said
    assert "right with world size 2, wrong with 1, 3, 4" in said or "right in" in said


def test_a_hang_names_the_ranks_and_where_each_waited(learner):
    result = labs.check_no_hang(logs_on_rank_0)
    said = str(result)
    assert "at world size 2" in said and "the ranks hung: rank 0 waited in" in said, said
    assert "(logs_on_rank_0, line" in said and "under `if rank == 0`" in said
    assert "the 5 larger configurations were not run" in said


def test_a_stub_is_not_written_yet(learner):
    def train_1(rank, world_size, steps):
        ...

    assert "not written yet" in str(labs.check_seeds_and_data(train_1))


def test_a_world_size_that_does_not_split_the_batch_is_refused_before_launching():
    with pytest.raises(ValueError, match="split the debug batch's 12 rows evenly"):
        labs.check_parity(lambda rank, world_size, steps: {}, world_size=5)


def test_the_configurations_come_from_the_lessons_invariants():
    plain, clipping = checks._configs(), checks._configs(clipping=True)
    assert {c["world_size"] for c in plain} == {1, 2, 3, 4}
    assert {c["optimizer"] for c in plain} == {"SGD+momentum", "AdamW"}
    assert {c["max_norm"] for c in clipping} == {checks.EVERY, labs.MAX_NORM, checks.NONE}
    assert checks.DEBUG_STEPS >= 4 and {c["world_size"] for c in checks._configs(6)} >= {6}


def test_clipping_matters_at_every_max_norm_of_the_check():
    """EVERY clips each step, MAX_NORM some, NONE none: one process shows the difference."""
    free = labs.one_process()
    assert labs.relative_difference(labs.one_process(clip=labs.MAX_NORM), free) > 1e-3
    assert labs.relative_difference(labs.one_process(clip=checks.NONE), free) < 1e-7


def test_rows_and_scales_in_words():
    assert rows_in_words(list(range(12)), 12) == "rows 0-11 once"
    assert rows_in_words(list(range(6)) * 2, 12) == "rows 0-5 twice, rows 6-11 never"
    assert rows_in_words([0, 1, 2, None], 3) == "rows 0-2 once, 1 row not of the step's batch"
    assert scale([(2, 2.0), (3, 3.0)]) == "N times" and scale([(2, 0.5), (4, 0.25)]) == "1/N of"
    assert scale([(2, 0.5), (3, 0.5)]) == "0.5x" and scale([(2, 1.0), (3, 1.0)]) == ""


def test_the_notebook_keeps_the_three_broken_functions_for_the_learner():
    nb = nbformat.read(Path(labs.__file__).parents[2] / "labs" / "09_debugging.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "torch.manual_seed(rank)                     # \"each rank its own seed\"" in text
    assert "if rank == 0:                           # log from one rank only" in text
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), labs.MAX_NORM)" in text
    assert "ranks.stop()" in text and "from fsdp_mini import debug, labs" in text
