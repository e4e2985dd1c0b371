"""Lab 04's checkers pass the reference solutions; the notebook and the comparison view.

The wrong answers a checker must name are in tests/wrong_answers/lab04.py (run by
tests/test_wrong_answers.py). (Under CI=true, set by conftest, a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest
import torch

from fsdp_mini import labs
from fsdp_mini.telemetry import load_events
from fsdp_mini.telemetry.runstate import Runs

Zero1 = labs.load_solution("04_zero1", "MyZero1")
Zero2 = labs.load_solution("04_zero2", "MyZero2")


def complaint(check, cls) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        check(cls)
    return str(info.value)


def test_the_reference_solutions_pass_with_the_formulas_figures():
    one, two = labs.check_zero1(Zero1), labs.check_zero2(Zero2)
    assert one.passed and two.passed
    padded = 60  # 59 parameters, padded to a multiple of 2
    assert one.facts["sent"] == {"all_reduce": 4 * padded, "all_gather": 4 * padded / 2}
    assert two.facts["sent"] == {"reduce_scatter": 4 * padded / 2, "all_gather": 4 * padded / 2}
    assert one.facts["memory"]["grads"] == 4 * padded            # ZeRO-1: the whole gradient
    assert two.facts["memory"]["grads"] == 4 * padded / 2        # ZeRO-2: this rank's shard
    assert abs(two.facts["memory"]["optimizer_state"] - 8 * padded / 2) <= 16


def test_a_stub_is_not_written_yet():
    class Stub(labs.ZeroScaffold):
        def my_slice(self):
            """doc"""
            ...  # noqa: PIE790  (a stub, as in the notebook)

    assert "not written yet: my_slice, reduce_gradients, after_step" in complaint(labs.check_zero1, Stub)


def test_who_ran_names_each_exercise_that_fell_back():
    assert labs.who_ran(True, True) == "my_zero1 and my_zero2 ran your code."
    only_1 = labs.who_ran(False, True)
    assert "my_zero1 ran the reference solution" in only_1
    assert "my_zero2 ran your reduce_gradients, on the reference MyZero1's" in only_1
    only_2 = labs.who_ran(True, False)
    assert only_2.startswith("my_zero1 ran your code; my_zero2 ran the reference solution of "
                             "exercise 2")
    both = labs.who_ran(False, False)
    assert "my_zero1 ran the reference solution" in both and "my_zero2 ran the reference" in both


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
    assert "labs.who_ran(zero1_check.passed, zero2_check.passed)" in text
    assert "differences are mostly noise" in text and "self.shard.grad = the elements" in text


def test_the_checkers_data_splits_over_any_world_size_the_lab_runs_at():
    from fsdp_mini.labs.common.checking import batch, rows_for
    assert [rows_for(n) for n in (1, 2, 3, 4, 6, 8, 16)] == [12, 12, 12, 12, 12, 24, 48]
    whole = batch(0, 0, 1, rows_for(8))[0]
    assert torch.equal(torch.cat([batch(0, r, 8, rows_for(8))[0] for r in range(8)]), whole)
