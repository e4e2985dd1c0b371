"""Lab 01's helpers and checker: the reference solution passes; the checker compares an answer
with the reference and names the first difference. The wrong answers it must name are in
tests/wrong_answers/. (Lab 00's check cell: tests/test_lab00.py.)"""

import itertools
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
    assert [s.label for s in mem.snapshots] == list(labs.lab01.runs.PHASES)
    start = mem.snapshots[0].by_category
    assert start["params"] == 4 * n and start["grads"] == 0
    assert 8 * n <= start["optimizer_state"] <= 8.01 * n   # made by the warm-up step
    assert mem.peak_by_category["grads"] == 4 * n
    assert mem.snapshots[1].by_category["activations"] > 0


@pytest.mark.parametrize("config", [GPTConfig.tiny(), GPTConfig()], ids=["tiny", "default"])
def test_the_phase_labels_of_a_fine_timeline_do_not_overlap(config):
    """backward, step and zero_grad mark neighbouring bars: their labels go on rows of their own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = labs.draw_timeline(labs.measure_step(config, 1, optimizer="sgd", fine=True))
    FigureCanvasAgg(fig).draw()
    labels = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in labels] == list(labs.lab01.runs.PHASES)
    boxes = [t.get_window_extent() for t in labels]
    assert not [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]


def test_fine_marks_follow_every_block_and_every_gradient():
    cfg = GPTConfig.tiny()
    model = make_model(cfg)
    mem = labs.measure_step(cfg, 1, optimizer="sgd", fine=True)
    fine = [s.label for s in mem.snapshots if s.label.startswith("· ")]
    assert len(fine) == cfg.n_layer + len(list(model.parameters()))
    assert labs.draw_timeline(mem).axes  # a matplotlib Figure
    assert "optimizer" in labs.snapshot_table(mem.snapshots).splitlines()[0]


def test_the_peak_is_placed_in_its_phase_and_the_steps_temporaries_are_named():
    """The default GPT peaks in Adam's step: there the catch-all holds the step's temporaries
    (the activations are freed), and the readout says so; the tiny GPT peaks in backward."""
    big = labs.measure_step(GPTConfig(), 2, optimizer="adam")
    assert labs.peak_phase(big) == "step"
    named = labs.at_peak_named(big)
    assert named["temporaries of optimizer.step()"] == big.at_peak["activations"] > 0
    assert "activations" not in named and named["grads"] == big.peak_by_category["grads"]
    small = labs.measure_step(GPTConfig.tiny(), 4, optimizer="adam", fine=True)
    assert labs.peak_phase(small) == "backward"
    assert "activations and backward's temporaries" in labs.at_peak_named(small)


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
    assert "48 configurations" in str(result)
    (case,) = result.facts["cases"]
    assert case["predicted"] >= case["peak"]  # the planner's sum bounds the real peak
    assert f"{case['what']}: your bound" in str(result) and "above the measured peak" in str(result)
    assert "the true peak is lower: the gradients appear while backward frees" in str(result)


def test_the_first_difference_is_at_the_smallest_configuration_with_both_values(learner):
    result = labs.check_peak_predictor(per_param(8, 12, 20))   # Adam with a master copy
    (line,) = wrong_lines(result)
    assert line.startswith("at n params 1, activation bytes 0, optimizer 'adam': ")
    assert "yours 20, the reference 16" in line and "right with optimizer 'momentum', 'sgd'" in line


def test_the_hint_measures_each_optimizers_bytes_per_parameter(learner):
    result = labs.check_peak_predictor(per_param(9, 12, 13))
    (hint,) = [h for ok, _, h in result.lines if not ok]
    assert "1 B too many with sgd, right with momentum, 3 B short with adam" in hint


def test_a_wrong_unit_is_named_by_its_factor(learner):
    result = labs.check_peak_predictor(per_param(8, 12, 16, scale=2 ** -20))
    assert "MiB, not bytes" in str(result)


def test_the_notebook_calls_it_an_upper_bound_and_its_stub_is_not_written_yet(learner):
    """The prose, the stub's docstring and the checker say one thing: an upper bound."""
    cells = nbformat.read(ROOT / "labs" / "01_memory.ipynb", as_version=4).cells
    stub = next(c.source for c in cells if c.source.startswith('@labs.exercise("01_predict_peak")'))
    ns = {"labs": labs}
    exec(stub, ns)
    assert "upper bound" in ns["predict_peak"].__doc__
    assert labs.not_written_yet(ns["predict_peak"])
    prose = next(c.source for c in cells if "## 5. Your turn" in c.source)
    assert "**upper bound**" in prose and "true peak is lower" in prose


def test_an_exception_in_the_learners_code_is_one_line(learner):
    def predict_peak(n_params, activation_bytes, optimizer="adam"):
        return {"adam": 16}[optimizer] * n_params + activation_bytes  # forgot sgd and momentum
    result = labs.check_peak_predictor(predict_peak)
    (line,) = wrong_lines(result)
    assert "your code raised KeyError: 'sgd'" in line and "in predict_peak" in line


def test_a_result_that_is_not_a_number_is_named(learner):
    result = labs.check_peak_predictor(lambda n, a, optimizer="adam": "lots")
    (line,) = wrong_lines(result)
    assert "yours 'lots', the reference 8" in line
    assert "return the number of bytes" in str(result)


def test_a_stub_not_started_gets_a_friendly_line(learner):
    def predict_peak(n_params, activation_bytes, optimizer="adam"):
        ...   # your code here
    result = labs.check_peak_predictor(predict_peak)
    assert wrong_lines(result) == [
        "predict_peak is not written yet: write its body in the cell above"]


def test_in_ci_a_failed_check_raises_with_the_words(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(CheckFailed, match="4 B short with momentum, 8 B short with adam"):
        labs.check_peak_predictor(per_param(8, 8, 8))


def test_lab_config_names_the_processes_that_will_run(learner, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert labs.lab_config().world_size == 4
    assert "4 CPU processes with gloo)" in capsys.readouterr().out
    cfg = labs.lab_config(world_size=2, model="tiny")
    said = capsys.readouterr().out
    assert (cfg.world_size, cfg.model) == (2, "tiny")
    assert "2 ranks" in said and "2 CPU processes with gloo; changed by you: world_size, model" in said
    assert "4 CPU" not in said
