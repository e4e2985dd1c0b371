"""Lab 00's "your turn" check cell: ``labs.check_mean_of_ranks`` runs an answer beside the
reference on 1 to 4 ranks and names the first difference. The wrong answers it must name are in
tests/wrong_answers/lab00.py (run by tests/test_wrong_answers.py)."""

from pathlib import Path

import nbformat
import pytest
import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs.lab00 import checks
from wrong_answers.lab00 import RIGHT, no_collective

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def learner(monkeypatch):
    """As on a learner's laptop: a failed check reports, it does not raise."""
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("FSDP_MINI_SOLUTIONS", raising=False)


def test_answers_written_otherwise_than_the_reference_pass():
    """Dividing before the sum, an async_op=True handle waited for, `from torch.distributed
    import all_reduce` on an int tensor: the same values, types and all-reduces."""
    for fn, result in zip(RIGHT, checks.JUDGES["00_mean_of_ranks"](list(RIGHT))):
        assert result.passed, (fn.__name__, str(result))
        assert result.facts["configurations"] == 4


def test_the_verdict_names_the_smallest_world_size_and_what_differs(learner):
    result = labs.check_mean_of_ranks(no_collective)
    said = str(result)
    assert not result.passed and result.checker == "check_mean_of_ranks"
    assert "at world size 1: rank 0's dist.all_reduce calls: yours 'no call', the reference " \
           "'SUM'" in said
    assert "without the other ranks' tensors" in said


def test_the_lab_world_size_is_checked_last_and_a_stub_is_not_run(learner):
    result = labs.check_mean_of_ranks(checks_reference(), world_size=5)
    assert result.passed and list(result.facts["records"])[-1] == {"world_size": 5}

    def mean_of_ranks(rank, world_size):
        ...
    stub = labs.check_mean_of_ranks(mean_of_ranks)
    assert not stub.passed and "not written yet" in str(stub) and "records" not in stub.facts


def checks_reference():
    return labs.load_solution("00_mean_of_ranks", "mean_of_ranks")


def test_in_ci_a_failed_check_raises(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(labs.CheckFailed, match="called no dist.all_reduce"):
        labs.check_mean_of_ranks(no_collective)


# -- the notebook's cells ------------------------------------------------------------------------

def _lab00_cells():
    """The exercise cell (the stub under @labs.exercise) and the check cell that follows it."""
    cells = nbformat.read(ROOT / "labs" / "00_setup.ipynb", as_version=4).cells
    stub = next(c.source for c in cells if c.cell_type == "code"
                and c.source.startswith('@labs.exercise("00_mean_of_ranks")'))
    check = next(c.source for c in cells
                 if c.cell_type == "code" and "check_mean_of_ranks(mean_of_ranks" in c.source)
    assert not any("<details>" in c.source for c in cells), "the solution is out of sight"
    return stub, check


def _namespace():
    cfg = labs.lab_config()
    return {"__name__": "__main__", "torch": torch, "dist": dist, "fsdp_mini": fsdp_mini,
            "labs": labs, "cfg": cfg}


def test_lab00_in_ci_the_solution_replaces_the_stub_and_passes_the_check_cell(monkeypatch):
    monkeypatch.setenv("CI", "true")
    stub, check = _lab00_cells()
    ns = _namespace()
    exec(stub, ns)
    assert ns["mean_of_ranks"].__code__.co_filename.endswith("00_mean_of_ranks.py")
    exec(check, ns)
    assert ns["mean_check"].passed, ns["mean_check"]
    assert "every rank returned the mean of the ranks, a float, from one all-reduce of the sum: " \
           "4 configurations, world size 1 / 2 / 3 / 4" in str(ns["mean_check"])


def test_lab00_a_stub_not_started_gets_a_friendly_line(learner):
    stub, check = _lab00_cells()
    ns = _namespace()
    exec(stub, ns)
    exec(check, ns)
    said = str(ns["mean_check"])
    assert "mean_of_ranks is not written yet" in said and "00_mean_of_ranks" in said
