"""Lab 07's checker: cheapest_fit beside the reference on 96 budgets and the lab's own (ties on
one GPU, budgets where nothing fits, the presets by name); the first budget where the choice
differs, both choices with their planned peak and step, and what the differing budgets share.
The wrong answers are in tests/wrong_answers/lab07.py, run by tests/test_wrong_answers.py."""

from pathlib import Path

import nbformat
import pytest
from wrong_answers.lab07 import COST, FITS, variant

from fsdp_mini import labs
from fsdp_mini.labs import CheckFailed
from fsdp_mini.labs.lab07 import checks as lab07

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def learner(monkeypatch):
    """As on a learner's laptop: a failed check reports, it does not raise."""
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("FSDP_MINI_SOLUTIONS", raising=False)


def wrong_lines(result):
    return [msg for ok, msg, _ in result.lines if not ok]


def test_the_reference_solution_passes_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = labs.check_cheapest_fit(labs.load_solution("07_cheapest_fit", "cheapest_fit"))
    assert result.passed, str(result)
    assert "107 configurations" in str(result)
    answers = result.facts["answers"]
    assert len(answers) == len(labs.BUDGETS) and answers[5] is None      # 70b on 4 GPUs
    assert answers[3] == {"strategy": "zero2", "precision": "bf16-mixed", "checkpointing": True}


def test_the_budgets_hold_ties_nothing_fits_and_the_presets_by_name():
    budgets = lab07.configs()
    assert {c["gpus"] for c in budgets} >= {1, 2, 8, 64} and len(budgets) == 107
    assert sum("(by name)" in c["model"] for c in budgets) == 5
    assert budgets[-1]["_given"] == "70b"           # the name, as the lab calls it later


def test_a_wrong_choice_says_both_decisions_and_their_costs(learner):
    (line,) = wrong_lines(labs.check_cheapest_fit(variant(
        ('PRECISIONS = ("fp32", "bf16-mixed")', 'PRECISIONS = ("fp32",)'))))
    assert line.startswith("at model '1.3b', gpus 1, gpu mem gb 48, micro batch 1: cheapest_fit "
                           "chose ddp, fp32, no checkpointing: planned peak 23.5 GB + 3.4 GB "
                           "reserve <= 48 GB, a step of 0.603 s")
    assert "; the reference ddp, bf16-mixed, no checkpointing: planned peak 22.3 GB" in line


def test_a_choice_that_does_not_fit_is_told_what_it_would_fit(learner):
    result = labs.check_cheapest_fit(variant((FITS, "if s.peak_bytes <= gpu_mem_gb * 1e9 and")))
    (line,) = wrong_lines(result)
    assert "planned peak 22.3 GB + 2.2 GB reserve > 24 GB (does not fit)" in line
    assert "the reference: nothing fits" in line
    assert "it fits the GPU's whole memory: the reserve" in str(result)


def test_a_tie_lost_the_other_way_is_named(learner):
    said = str(labs.check_cheapest_fit(variant(
        (COST, "cost = (s.step_seconds, not checkpointing, -STRATEGIES.index(strategy))"))))
    assert "cheapest_fit chose fsdp, bf16-mixed, no checkpointing" in said
    assert "costs exactly as much as the reference's: at equal step_seconds no checkpointing" in said


@pytest.mark.parametrize("answer, words", [
    (("fsdp", "bf16-mixed", True),
     "return a dict with the keys strategy, precision, checkpointing"),
    ({"strategy": "FSDP", "precision": "bf16-mixed", "checkpointing": True},
     "strategy one of ddp, zero1, zero2, fsdp"),
])
def test_an_answer_of_the_wrong_form_is_one_line(learner, answer, words):
    wrong = wrong_lines(labs.check_cheapest_fit(lambda *a: answer))
    assert len(wrong) == 1 and words in wrong[0], wrong


def test_an_exception_is_one_line_and_a_stub_gets_a_friendly_line(learner):
    def cheapest_fit(model, gpus, gpu_mem_gb, micro_batch=1):
        raise KeyError("precision")
    (line,) = wrong_lines(labs.check_cheapest_fit(cheapest_fit))
    assert line.startswith("at model '1.3b', gpus 1, gpu mem gb 24, micro batch 1: your code "
                           "raised KeyError: 'precision'")

    def cheapest_fit(model, gpus, gpu_mem_gb, micro_batch=1):  # noqa: F811
        ...   # your code here
    assert wrong_lines(labs.check_cheapest_fit(cheapest_fit)) == [
        "cheapest_fit is not written yet: write its body in the cell above"]


def test_in_ci_a_failed_check_raises_with_the_words(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(CheckFailed, match="you never chose bf16-mixed"):
        labs.check_cheapest_fit(variant(('PRECISIONS = ("fp32", "bf16-mixed")',
                                         'PRECISIONS = ("fp32",)')))


def test_the_notebook_stub_is_not_written_yet_and_ci_uses_the_solution(monkeypatch):
    cells = nbformat.read(ROOT / "labs" / "07_bigger.ipynb", as_version=4).cells
    stub = next(c.source for c in cells if c.source.startswith('@labs.exercise("07_cheapest_fit")'))
    monkeypatch.setenv("CI", "false")
    ns = {"labs": labs}
    exec(stub, ns)
    assert labs.not_written_yet(ns["cheapest_fit"])
    monkeypatch.setenv("CI", "true")
    exec(stub, ns)
    assert ns["cheapest_fit"].__code__.co_filename.endswith("07_cheapest_fit.py")
    text = "\n".join(c.source for c in cells)
    assert "assert error <= 0.10" in text              # the planner checked on the learner's run
    assert 'labs.yours_or_reference(check, "07_cheapest_fit", cheapest_fit)' in text
