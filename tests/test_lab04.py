"""Lab 04's checkers pass the reference solutions and name each typical ZeRO mistake in words.

Wrong answers are small subclasses of the reference solutions: each changes one method the way a
learner might get it wrong. (Under CI=true, set by conftest, a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest
import torch

from fsdp_mini import labs
from fsdp_mini.labs import lab04
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


def test_every_rank_updating_the_whole_buffer_saves_no_memory():
    class Whole(Zero1):
        def my_slice(self):
            return 0, self.flat.numel()

    said = complaint(labs.check_zero1, Whole)
    assert "every rank owns the whole buffer" in said and "not Ψ/N: no memory saved" in said


def test_wrong_offsets_name_the_rank_and_whose_slice_it_takes():
    class Swapped(Zero1):
        def my_slice(self):
            size = self.flat.numel() // self.comm.world_size
            r = self.comm.world_size - 1 - self.comm.rank
            return r * size, (r + 1) * size

    assert "rank 0 would update elements [30, 60), which are rank 1's slice" in \
        complaint(labs.check_zero1, Swapped)


def test_padding_not_handled_leaves_elements_to_no_rank():
    class NoPadding(Zero1):
        def my_slice(self):
            size = sum(p.numel() for p in self.module.parameters()) // self.comm.world_size
            return self.comm.rank * size, (self.comm.rank + 1) * size

    said = complaint(labs.check_zero1, NoPadding)
    assert "padding: with Ψ = 59 elements on 2 ranks" in said and "belong to no rank" in said


def test_forgetting_to_average_makes_gradients_n_times_too_large():
    class NoAverage(Zero1):
        def reduce_gradients(self, flat_grad):
            self.comm.all_reduce(flat_grad, label="grads")
            start, stop = self.my_slice()
            self.shard.grad = flat_grad[start:stop]

    said = complaint(labs.check_zero1, NoAverage)
    assert "gradients 2x too large" in said and "divide the sum over ranks by the world size" in said
    assert "✔ AdamW" in said and "AdamW hides it" in said  # and why AdamW alone would not see it


def test_forgetting_the_all_gather_names_the_rank_and_parameter_that_drift():
    class NoGather(Zero1):
        def after_step(self):
            self.mark("params", "not gathered")

    said = complaint(labs.check_zero1, NoGather)
    assert "after step 1, rank 1's '" in said and "the ranks drift apart" in said
    assert "no all-gather of the parameters" in said


def test_a_collective_skipped_by_one_rank_is_named_not_a_hang():
    class OnlyRankZeroGathers(Zero1):
        def after_step(self):
            if self.comm.rank == 0:
                start, stop = self.my_slice()
                self.comm.all_gather(self.flat, self.flat[start:stop], label="params")

    said = complaint(labs.check_zero1, OnlyRankZeroGathers)
    assert "CollectiveMismatchError" in said and "rank 0 issues all_gather 'params'" in said


def test_an_error_in_a_rank_is_one_line_with_the_learners_line():
    class Raises(Zero1):
        def reduce_gradients(self, flat_grad):
            raise ValueError("learner's bug")

    said = complaint(labs.check_zero1, Raises)
    assert 'raised ValueError: learner\'s bug (in reduce_gradients: `raise ValueError' in said
    assert "Traceback" not in said


def test_zero2_reduce_scatter_without_averaging():
    class NoAverage(Zero2):
        def reduce_gradients(self, flat_grad):
            mine = torch.empty_like(self.shard)
            self.comm.reduce_scatter(mine, flat_grad, label="grads")
            self.shard.grad = mine

    assert "gradients 2x too large" in complaint(labs.check_zero2, NoAverage)


def test_zero2_that_all_reduces_and_keeps_the_whole_gradient():
    class AllReduce(Zero2):
        def reduce_gradients(self, flat_grad):
            self.comm.all_reduce(flat_grad, label="grads")
            flat_grad /= self.comm.world_size
            start, stop = self.my_slice()
            self.shard.grad = flat_grad[start:stop]   # a view: the whole buffer stays alive

    said = complaint(labs.check_zero2, AllReduce)
    assert "1.50x the ZeRO-2 formula: the gradients were all-reduced (2Ψ)" in said
    assert "gradients kept after the step: 240 B per rank" in said


def test_zero1_keeping_a_copy_of_its_slice_is_told_to_keep_the_whole_gradient():
    class Copy(Zero1):  # less memory, but that is ZeRO-2's saving: ZeRO-1 keeps the whole average
        def reduce_gradients(self, flat_grad):
            self.comm.all_reduce(flat_grad, label="grads")
            flat_grad /= self.comm.world_size
            start, stop = self.my_slice()
            self.shard.grad = flat_grad[start:stop].clone()

    said = complaint(labs.check_zero1, Copy)
    assert ("gradients kept after the step: 120 B per rank, this rank's slice only, but ZeRO-1 "
            "keeps the whole averaged gradient, 4Ψ = 240 B: self.shard.grad is a copy" in said)
    assert "keeping only a slice is ZeRO-2's saving" in said and "a view of your slice" in said
    assert "but the formula says" not in said  # the cause, not only a total that differs


def test_zero1_that_reduce_scatters_is_told_that_is_zero2():
    result = labs.CheckResult("ZeRO-1")
    run = {"padded": 60, "element_size": 4, "sent": {"reduce_scatter": 120.0, "all_gather": 120.0},
           "memory": {"params": 240, "grads": 120, "optimizer_state": 244},
           "expected": {"persistent_bytes": 712.0}}
    lab04._judge_memory(result, run, stage=1, n=2)
    assert "you reduce-scatter into a new shard: that is ZeRO-2, the next exercise" in str(result)
    assert not result.passed


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
