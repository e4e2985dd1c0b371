"""Lab 04's checkers pass the reference ZeRO-1 and ZeRO-2 and compare an answer with them over
world sizes 1-4, nets, optimizers and steps; the notebook and the comparison view.

The wrong answers a checker must name are in tests/wrong_answers/lab04.py (judged in one batch
per exercise through ``lab04.JUDGES``).
"""

from pathlib import Path

import nbformat
import pytest
import torch
from wrong_answers.lab04 import NoAverage, Z2IntoASliceOfFlatGrad

from fsdp_mini import labs
from fsdp_mini.labs.lab04 import checks as lab04
from fsdp_mini.models import GPTConfig, make_model
from fsdp_mini.telemetry import load_events
from fsdp_mini.telemetry.runstate import Runs

Zero1 = labs.load_solution("04_zero1", "MyZero1")
Zero2 = labs.load_solution("04_zero2", "MyZero2")


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    """Outside CI a failed check returns its result (in CI it raises, failing the notebook)."""
    monkeypatch.setenv("CI", "")


@pytest.fixture(scope="module")
def judged():
    one = lab04.JUDGES["04_zero1"]([Zero1, NoAverage])
    two = lab04.JUDGES["04_zero2"]([Zero2, Z2IntoASliceOfFlatGrad])
    return {"zero1": one[0], "zero2": two[0], "no average": one[1], "view": two[1]}


def _own(result, optimizer):
    """The lab's own run (2 ranks, the tiny GPT): rank 0's record."""
    return next(mine for cfg, (mine, _) in result.facts["records"].items()
                if cfg["net"] == "tiny" and cfg["optimizer"] == optimizer)


def test_the_reference_solutions_pass_everywhere_with_the_formulas_bytes_and_memory(judged):
    psi = make_model(GPTConfig.tiny()).num_params()   # 27,840: a multiple of 2, no padding
    for name, grad_op, grads in (("zero1", "all_reduce", 4 * psi), ("zero2", "reduce_scatter",
                                                                      4 * psi // 2)):
        result = judged[name]
        assert result.passed, result
        assert "20 configurations, world size 1 / 2 / 3 / 4" in str(result), result
        ledger = _own(result, "SGD+momentum").get("ledger", step=lab04.STEPS)
        assert sorted(ledger) == sorted([(grad_op, 4 * psi, "world"), ("all_gather", 4 * psi,
                                                                        "world")])
        alive = _own(result, "AdamW").get("alive", step=lab04.STEPS)   # after the update
        assert alive["grads"] == grads and alive["params"] == 4 * psi    # ZeRO-1: the whole one
        assert abs(alive["optimizer_state"] - 8 * psi // 2) <= 16        # Adam: Ψ/N elements


def test_a_wrong_scale_is_found_at_the_smallest_world_size_that_shows_it(judged):
    (line,) = [msg for ok, msg, _ in judged["no average"].lines if not ok]
    assert line.startswith("at world size 2, net 'mlp', optimizer 'SGD+momentum', dtype 'float32': "
                           "the gradient "
                           "shard rank 0's optimizer got in step 1"), line
    assert "(2x)" in line and "right with world size 1, wrong with 2, 3, 4" in line


def test_a_view_of_the_flat_gradient_is_zero2s_mistake(judged):
    text = str(judged["view"])
    assert "'left self.shard.grad a view of flat_grad': yours True, the reference False" in text
    assert "a view keeps the whole buffer alive" in text


def test_a_stub_is_not_written_yet_without_starting_ranks():
    class Stub(labs.ZeroScaffold):
        def my_slice(self):
            """doc"""
            ...  # noqa: PIE790  (a stub, as in the notebook)

    result = labs.check_zero1(Stub)
    assert not result.passed and len(result.lines) == 1, result
    assert "not written yet: my_slice, reduce_gradients, after_step" in str(result)


def test_the_comparison_view_shows_the_tables_model_state_and_the_activations(tmp_path, monkeypatch):
    """The view reads telemetry samples taken at phase marks: the scaffold marks forward_done and
    its flat gradient (a comm buffer), and the kit's zero1 is sampled after its after_step."""
    monkeypatch.setenv("FSDP_MINI_EVENTS_DIR", str(tmp_path))
    measured = labs.measure_strategies(0, 1, ["zero1", Zero1, Zero2], 2, "tiny", 2)
    runs = Runs()
    runs.add(load_events(str(tmp_path)))
    for name, m in measured.items():
        run = runs.runs[name]
        points = run.memory_points(0, run.completed_steps())
        assert run.persistent(0) == m["state"], name   # the view's figure is the table's
        assert m["state"] == pytest.approx(m["expected"]["persistent_bytes"], abs=1024), name
        assert max(p["by_category"]["activations"] for p in points) == m["activations"], name
    flattened = [p for p in runs.runs["my_zero2"].memory_points(0, [2])
                 if p["label"] == "my_zero2/grads_flattened"]
    padded_bytes = 4 * runs.runs["my_zero2"].params
    assert flattened and flattened[0]["by_category"]["comm_buffers"] >= padded_bytes


def test_the_notebook_says_which_exercise_fell_back_and_why_times_are_not_compared():
    nb = nbformat.read(Path(labs.__file__).parents[2] / "labs" / "04_zero.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "zero1_check.passed" in text and "zero2_check.passed" in text
    assert "differences are mostly noise" in text and "self.shard.grad = the elements" in text
    assert "20 configurations" in text


def test_the_checkers_data_splits_over_any_world_size_the_lab_runs_at():
    from fsdp_mini.labs.common.checking import batch, rows_for
    assert [rows_for(n) for n in (1, 2, 3, 4, 6, 8, 16)] == [12, 12, 12, 12, 12, 24, 48]
    whole = batch(0, 0, 1, rows_for(8))[0]
    assert torch.equal(torch.cat([batch(0, r, 8, rows_for(8))[0] for r in range(8)]), whole)
