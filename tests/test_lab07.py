"""Lab 07's checker: the reference cheapest_fit passes, and each typical mistake is named in
plain words (ignoring activations, forgetting Adam's state, ddp where it cannot fit, fp32 only,
no checkpointing, fitting by persistent bytes, plan's default 80 GB, a budget read in GiB, the
smallest peak taken for the cheapest): those wrong answers are in tests/wrong_answers/lab07.py,
run by tests/test_wrong_answers.py; here, the lines per budget, ties, and answers of the wrong form."""

from pathlib import Path

import nbformat
import pytest
from wrong_answers.lab07 import FITS, variant

from fsdp_mini import labs
from fsdp_mini.labs import CheckFailed

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
    said = str(result)
    assert "70b on 4 GPUs of 80 GB, micro-batch 1: nothing fits, rightly" in said
    assert "7b on 4 GPUs of 48 GB, micro-batch 1: zero2, bf16-mixed, with checkpointing" in said
    assert len(result.facts["answers"]) == len(labs.BUDGETS)


MEM = "gpu_mem_gb * 1e9"

def test_per_budget_lines_say_what_does_not_fit_and_what_costs_more(learner):
    said = str(labs.check_cheapest_fit(variant((FITS, "if"))))       # always ddp, bf16
    assert ("7b on 2 GPUs of 94 GB, micro-batch 1: ddp, bf16-mixed, no checkpointing does not "
            "fit: its planned peak is 115.3 GB > 94 GB") in said
    said = str(labs.check_cheapest_fit(
        variant(('PRECISIONS = ("fp32", "bf16-mixed")', 'PRECISIONS = ("fp32",)'))))
    assert ("7b on 4 GPUs of 48 GB, micro-batch 1: fsdp, fp32, with checkpointing fits, but "
            "its step takes") in said and "; zero2, bf16-mixed, with checkpointing fits too and " \
        "takes 0.58 s (" in said
    said = str(labs.check_cheapest_fit(variant(("return best", "return None"))))
    assert "7b on 2 GPUs of 94 GB, micro-batch 1: you found nothing, but zero2" in said
    said = str(labs.check_cheapest_fit(variant((FITS, f"if s.peak_bytes <= {MEM} and"))))
    assert ("7b on 4 GPUs of 48 GB, micro-batch 1: fsdp, bf16-mixed, no checkpointing does not "
            "fit: its planned peak 45.9 GB leaves less than the reserve (3.4 GB) of the 48 GB "
            "free") in said


def test_a_budget_read_in_gib_is_named_on_its_line(learner):
    said = str(labs.check_cheapest_fit(variant((FITS, "if s.peak_bytes <= gpu_mem_gb * 2**30 and"))))
    assert ("you compared with GiB (2^30 B); the budget is in GB (10^9 B): your answers fit "
            "gpu_mem_gb x 2^30 bytes") in said, said


def test_a_slower_answer_says_both_step_times(learner):
    """On 2 GPUs of 94 GB the fastest that fits is zero2 without checkpointing: fsdp fits too
    but waits for its all-gathers; checkpointing recomputes the forward."""
    def answers(strategy, checkpointing):
        ref = labs.load_solution("07_cheapest_fit", "cheapest_fit")

        def cheapest_fit(model, gpus, gpu_mem_gb, micro_batch=1):
            if (gpus, gpu_mem_gb) == (2, 94):
                return {"strategy": strategy, "precision": "bf16-mixed",
                        "checkpointing": checkpointing}
            return ref(model, gpus, gpu_mem_gb, micro_batch)
        return wrong_lines(labs.check_cheapest_fit(cheapest_fit))
    for strategy, checkpointing in (("fsdp", False), ("zero2", True)):
        wrong = answers(strategy, checkpointing)
        ck = "with checkpointing" if checkpointing else "no checkpointing"
        assert len(wrong) == 1 and wrong[0].startswith(
            f"7b on 2 GPUs of 94 GB, micro-batch 1: {strategy}, bf16-mixed, {ck} fits, but its "
            f"step takes"), wrong
        assert "; zero2, bf16-mixed, no checkpointing fits too and takes 0.43 s" in wrong[0]


def test_a_mistake_no_known_one_explains_gets_per_budget_lines_only(learner):
    result = labs.check_cheapest_fit(
        lambda model, gpus, gb, mb=1: {"strategy": "fsdp", "precision": "bf16-mixed",
                                        "checkpointing": True})
    wrong = wrong_lines(result)
    assert wrong and all(" GB, micro-batch " in line for line in wrong), str(result)


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
    wrong = wrong_lines(labs.check_cheapest_fit(cheapest_fit))
    assert wrong == ["cheapest_fit('1.3b' shape, 2, 16, 4) raised KeyError: 'precision'"]

    def cheapest_fit(model, gpus, gpu_mem_gb, micro_batch=1):
        ...   # your code here
    assert wrong_lines(labs.check_cheapest_fit(cheapest_fit)) == [
        "cheapest_fit is not written yet: write its body in the cell above"]


def test_in_ci_a_failed_check_raises_with_the_words(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(CheckFailed, match="you did not consider bf16-mixed"):
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
