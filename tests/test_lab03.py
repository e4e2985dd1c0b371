"""Lab 03's checkers pass the reference DDP and buckets; more on some of their verdicts.

The wrong answers a learner writes, each with the words its verdict must contain, are in
tests/wrong_answers/lab03.py. Answers that train to the end are judged together from one launch
(``lab03._check_many``, the code path of ``check_ddp`` and ``check_buckets``).
"""

import pytest
from wrong_answers.lab03 import (DDP_BATCH, AllAtTheEnd, Blocking, Buckets, Early, NoReset,
                                 PerParameter, WaitsAtOnce, average_gradient, wrap_ddp)

from fsdp_mini import labs
from fsdp_mini.labs.lab03 import checks as lab03


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    """Outside CI a failed check returns its result (in CI it raises, failing the notebook)."""
    monkeypatch.setenv("CI", "")


def _text(result):
    return "\n".join(msg + " " + hint for _ok, msg, hint in result.lines)


# -- exercise 1: wrap_ddp + average_gradient ----------------------------------------------------
# Note: the wrong answers, each with the words its verdict must contain, are in
# tests/wrong_answers/lab03.py; the tests here check more of some of those verdicts.

def stub(param, comm):
    ...


DDP_WRONG = ["not dividing", "averaging twice", "weights", "no broadcast", "hooked twice"]


@pytest.fixture(scope="module")
def ddp_judged():
    pairs = [(wrap_ddp, average_gradient)] + [DDP_BATCH[key] for key in DDP_WRONG]
    results = lab03._check_many(pairs, 2, 20, **lab03.DDP)
    return dict(zip(["reference", *DDP_WRONG], results))


def test_reference_ddp_passes_against_one_process_torch_ddp_and_the_formula(ddp_judged):
    result = ddp_judged["reference"]
    assert result.passed, result
    text = _text(result)
    for claim in ("SGD with momentum the weights match", "AdamW the weights match",
                  "the same as torch's DistributedDataParallel", "as the formula says"):
        assert claim in text, text
    psi = sum(p.numel() for p in lab03.make_model(lab03.TINY).parameters())
    assert result.facts["sent_per_step"] == [2 * (2 - 1) / 2 * 4 * psi] * lab03.CHECK_STEPS


ADAM_HINT = "Adam divides by the gradient's size, so it hides a wrong scale that SGD shows"


@pytest.mark.parametrize("mistake", ["not dividing", "averaging twice"])
def test_adam_hides_a_wrong_scale_that_sgd_shows(ddp_judged, mistake):
    hinted = [msg for _ok, msg, hint in ddp_judged[mistake].lines if hint == ADAM_HINT]
    assert len(hinted) == 1, ddp_judged[mistake]  # on SGD's line only
    assert hinted[0].startswith("after 2 steps of SGD with momentum the weights differ"), hinted


@pytest.mark.parametrize("mistake", ["weights", "no broadcast", "hooked twice"])
def test_the_adam_hint_is_only_for_a_wrong_scale(ddp_judged, mistake):
    assert ADAM_HINT not in _text(ddp_judged[mistake]), ddp_judged[mistake]


def test_a_stub_is_not_written_yet_without_starting_ranks():
    result = labs.check_ddp(wrap_ddp, stub)
    assert not result.passed and "not written yet: stub" in _text(result)


# -- exercise 2: buckets ------------------------------------------------------------------------

class Stub:
    def __init__(self, buckets, comm):
        ...

    def grad_ready(self, param):
        ...

    def backward_done(self):
        ...


@pytest.fixture(scope="module")
def buckets_judged():
    classes = [Buckets, AllAtTheEnd, Early, NoReset, Blocking, WaitsAtOnce, PerParameter]
    return dict(zip(classes, lab03._check_many(classes, 2, 20, **lab03.BUCKETS)))


def test_reference_buckets_pass_and_overlap_backward(buckets_judged):
    result = buckets_judged[Buckets]
    assert result.passed, result
    assert ("5 of 5 buckets per step were launched once full, with async_op=True, while backward "
            "was still running (overlap)") in _text(result), result


@pytest.mark.parametrize("cls", [AllAtTheEnd, Early, NoReset, Blocking, WaitsAtOnce,
                                 PerParameter],
                         ids=lambda c: c.__name__)
def test_no_tick_contradicts_a_launch_that_went_wrong(buckets_judged, cls):
    """A ✘ on when or how often the buckets went out comes with no ✔ on launching or overlap,
    and the ✔ on waiting speaks of backward_done, not of "before backward ended"."""
    result = buckets_judged[cls]
    ticks = [msg for ok, msg, _hint in result.lines if ok]
    assert not [m for m in ticks if "launched" in m or "overlap" in m], result
    assert "before backward ended" not in _text(result), result


def test_counters_not_reset_are_named_not_blamed_on_torch_cat(buckets_judged):
    """Right in step 1, nothing in step 2: the checker says so, step by step."""
    result = buckets_judged[NoReset]
    text = _text(result)
    assert "torch.cat" not in text and "2.5" not in text, text
    assert ("after the backward of step 2 (step 1 was right), the ranks hold different "
            "gradients") in text, text
    assert "in step 2 each rank sent 0 B" in text, text


class HalfWritten(Buckets):
    def backward_done(self):
        ...


@pytest.mark.parametrize("cls, names", [(Stub, "__init__, grad_ready and backward_done"),
                                        (HalfWritten, "backward_done")])
def test_every_unwritten_method_is_named_without_starting_ranks(cls, names):
    result = labs.check_buckets(cls)
    assert not result.passed and len(result.lines) == 1, result
    assert f"not written yet: {names} (still `...`)" in _text(result), result


def test_the_buckets_check_trains_the_labs_own_model_and_bucket_size():
    """With model="default" (a laptop's cfg.model) the check trains that GPT, in buckets of a
    quarter of its bytes: what the lab then trains the learner's buckets with."""
    result = labs.check_buckets(Buckets, world_size=2, model="default")
    assert result.passed, result
    psi = lab03.make_model(lab03.GPTConfig()).num_params()
    assert f"each rank sent 2(N-1)/N x 4Ψ = {4 * psi:,} B" in _text(result), result
