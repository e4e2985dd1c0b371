"""Lab 09's checkers pass the reference solutions and name, in plain words, what is still wrong
in each broken training function of the lab (and in the half-fixed ones learners write on the way):
those wrong answers are in tests/wrong_answers/lab09.py, run by tests/test_wrong_answers.py.

(Under CI=true, set by conftest, a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs.lab09 import checks as lab09
from fsdp_mini.labs.lab09 import runs as lab09_runs


def complaint(check, fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        check(fn)
    return str(info.value)


SOLUTIONS = {"train_1": "09_seeds_and_data", "train_2": "09_hang", "train_3": "09_clipping"}
JUDGED = {fn: labs.load_solution(name, fn) for fn, name in SOLUTIONS.items()}


@pytest.fixture(scope="module")
def runs():
    """Every function that runs to the end, in one launch (the checker launches one each; the
    notebook, run by CI, passes the reference solutions through the whole checks)."""
    out = fsdp_mini.launch(lab09_runs.run_on_ranks, 2, list(JUDGED.values()), labs.DEBUG_STEPS, timeout=30)
    return {name: [by_rank[i] for by_rank in out] for i, name in enumerate(JUDGED)}


def judged(runs, name, clip=None) -> str:
    return str(lab09._judge(labs.CheckResult(name), runs[name], clip))


@pytest.mark.parametrize("fn, clip", [("train_1", None), ("train_2", None),
                                      ("train_3", labs.MAX_NORM)])
def test_the_reference_solutions_pass(runs, fn, clip):
    said = judged(runs, fn, clip)
    assert said.startswith(f"✔ {fn}: all checks passed") and "train like one process" in said


def test_the_reference_hang_fix_logs_the_whole_weight_on_three_ranks():
    """Exercise 2's check runs on 3 ranks, where rank 0's shard of '0.weight' is not all of it,
    and reads what rank 0 printed."""
    result = labs.check_no_hang(labs.load_solution("09_hang", "train_2"))
    assert result.passed, str(result)
    assert "(on 3 ranks)" in str(result) and "rank 0 alone logged |w| every step" in str(result)


def test_the_rows_each_rank_was_fed_are_recorded(runs):
    assert [r["rows"] for r in runs["train_1"]] == [[list(range(6))] * 3, [list(range(6, 12))] * 3]


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
