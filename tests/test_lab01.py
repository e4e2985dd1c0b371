"""Lab 01's helpers and checker, and lab 00's "your turn" check cell: the reference solutions
pass, and each typical mistake is recognised and named in plain words."""

import re
from pathlib import Path

import nbformat
import pytest
import torch

from fsdp_mini import labs
from fsdp_mini.labs import CheckFailed
from fsdp_mini.models import GPTConfig, make_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def learner(monkeypatch):
    """As on a learner's laptop: a failed check reports, it does not raise."""
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("FSDP_MINI_SOLUTIONS", raising=False)


def per_param(sgd, momentum, adam, activations=1.0, scale=1.0):
    """A predictor with the given bytes per parameter for each optimizer."""
    table = {"sgd": sgd, "momentum": momentum, "adam": adam}
    return lambda n, a, optimizer="adam": (table[optimizer] * n + activations * a) * scale


def wrong_lines(result):
    return [msg for ok, msg, _ in result.lines if not ok]


# -- the helpers ------------------------------------------------------------------------------

def test_measure_step_counts_the_model_state_of_a_steady_step():
    cfg = GPTConfig.tiny()
    n = make_model(cfg).num_params()
    mem = labs.measure_step(cfg, 2, optimizer="adam")
    assert [s.label for s in mem.snapshots] == list(labs.lab01.PHASES)
    start = mem.snapshots[0].by_category
    assert start["params"] == 4 * n and start["grads"] == 0
    assert 8 * n <= start["optimizer_state"] <= 8.01 * n   # made by the warm-up step
    assert mem.peak_by_category["grads"] == 4 * n
    assert mem.snapshots[1].by_category["activations"] > 0


def test_fine_marks_follow_every_block_and_every_gradient():
    cfg = GPTConfig.tiny()
    model = make_model(cfg)
    mem = labs.measure_step(cfg, 1, optimizer="sgd", fine=True)
    fine = [s.label for s in mem.snapshots if s.label.startswith("· ")]
    assert len(fine) == cfg.n_layer + len(list(model.parameters()))
    assert labs.draw_timeline(mem).axes  # a matplotlib Figure
    assert "optimizer" in labs.snapshot_table(mem.snapshots).splitlines()[0]


def test_bad_input_is_refused_in_words():
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        labs.make_optimizer("rmsprop", [torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match="seq_len <= block_size"):
        labs.measure_step(GPTConfig.tiny(), 1, seq_len=999)


# -- the checker ------------------------------------------------------------------------------

def test_the_reference_solution_passes_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = labs.check_peak_predictor(labs.load_solution("01_predict_peak", "predict_peak"))
    assert result.passed, str(result)
    assert "predicted" in str(result) and len(result.facts["cases"]) == 3
    for case in result.facts["cases"]:
        assert case["predicted"] >= case["peak"]  # the planner's sum bounds the real peak


@pytest.mark.parametrize("fn, named", [
    (per_param(8, 8, 8), "you left out the optimizer state"),
    (per_param(8, 12, 12), "you counted one moment for Adam; it keeps two"),
    (per_param(8, 8, 16), "you left out the momentum buffer"),
    (per_param(4, 8, 12), "you left out the gradients"),
    (per_param(4, 6, 8), "you used 2 bytes per value (fp16/bf16 thinking)"),
    (per_param(64, 96, 128), "you counted bits, not bytes"),
    (per_param(16, 16, 16), "you counted Adam's state for every optimizer"),
    (per_param(12, 16, 20), "one 4-byte copy per parameter too many"),
    (per_param(8, 12, 16, activations=2), "you counted the activations twice"),
    (per_param(8, 12, 16, activations=0), "you left out the activations"),
    (per_param(8, 12, 16, scale=1e-6), "you returned MB, not bytes"),
    (per_param(8, 12, 16, scale=2 ** -30), "you returned GiB, not bytes"),
    (per_param(9, 12, 17), "model state with sgd: your formula gives 9 B per parameter"),
], ids=["no-optimizer-state", "one-adam-moment", "no-momentum", "no-grads", "fp16", "bits",
        "ignores-optimizer", "extra-copy", "activations-twice", "no-activations", "MB", "GiB",
        "unnamed"])
def test_each_mistake_is_named(learner, fn, named):
    result = labs.check_peak_predictor(fn)
    assert not result.passed
    wrong = wrong_lines(result)
    assert any(named in line for line in wrong), str(result)
    if "returned" in named:  # one units mistake, one line: not also "left out the activations"
        assert len(wrong) == 1, str(result)


def test_an_exception_in_the_learners_code_is_one_line(learner):
    def predict_peak(n_params, activation_bytes, optimizer="adam"):
        return {"adam": 16}[optimizer] * n_params + activation_bytes  # forgot sgd and momentum
    result = labs.check_peak_predictor(predict_peak)
    assert wrong_lines(result) == ["predict_peak(27840, 0, 'sgd') raised KeyError: 'sgd'"]


def test_a_result_that_is_not_a_number_is_named(learner):
    result = labs.check_peak_predictor(lambda n, a, optimizer="adam": "lots")
    assert wrong_lines(result) == ["predict_peak(27840, 0, 'sgd') returned 'lots' (str)"]


def test_a_stub_not_started_gets_a_friendly_line(learner):
    def predict_peak(n_params, activation_bytes, optimizer="adam"):
        ...   # your code here
    result = labs.check_peak_predictor(predict_peak)
    assert wrong_lines(result) == [
        "predict_peak is not written yet: write its body in the cell above"]


def test_in_ci_a_failed_check_raises_with_the_words(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(CheckFailed, match="you left out the optimizer state"):
        labs.check_peak_predictor(per_param(8, 8, 8))


# -- lab 00's "your turn" (checked by an assert cell in the notebook) --------------------------

def _lab00_your_turn():
    """The folded solution (markdown) and the check cell that follows the stub."""
    cells = nbformat.read(ROOT / "labs" / "00_setup.ipynb", as_version=4).cells
    folded = next(c.source for c in cells if "<details>" in c.source)
    solution = re.search(r"```python\n(.*?)```", folded, re.DOTALL).group(1)
    check = next(c.source for c in cells
                 if c.cell_type == "code" and "not_written_yet(mean_of_ranks)" in c.source)
    return solution, check


def _namespace():
    import torch.distributed as dist

    import fsdp_mini
    cfg = labs.lab_config()
    return {"__name__": "__main__", "torch": torch, "dist": dist, "fsdp_mini": fsdp_mini,
            "labs": labs, "cfg": cfg}


def test_lab00_folded_solution_passes_the_check_cell(capsys):
    solution, check = _lab00_your_turn()
    ns = _namespace()
    exec(solution, ns)
    exec(check, ns)
    assert "✔ right: every rank holds the mean" in capsys.readouterr().out


def test_lab00_check_cell_names_a_missing_division():
    solution, check = _lab00_your_turn()
    ns = _namespace()
    exec(solution.replace("t.item() / world_size", "t.item()"), ns)
    with pytest.raises(AssertionError, match="divide it by world_size"):
        exec(check, ns)
