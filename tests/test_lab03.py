"""Lab 03's checkers pass the reference DDP and buckets and compare an answer with them over
world sizes 1-4, nets, optimizers and steps; more on some of their verdicts.

The wrong answers a learner writes, each with the words its verdict must contain, are in
tests/wrong_answers/lab03.py (judged in one batch per exercise through ``lab03.JUDGES``).
"""

import pytest
from wrong_answers.lab03 import (AllAtTheEnd, Buckets, NoReset, average_gradient, not_divided,
                                 wrap_ddp, wrapper)

from fsdp_mini import labs
from fsdp_mini.labs.lab03 import checks as lab03
from fsdp_mini.models import GPTConfig, make_model


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    """Outside CI a failed check returns its result (in CI it raises, failing the notebook)."""
    monkeypatch.setenv("CI", "")


def _text(result):
    return "\n".join(msg + " " + hint for _ok, msg, hint in result.lines)


@pytest.fixture(scope="module")
def ddp_judged():
    pairs = [(wrap_ddp, average_gradient), (wrapper(not_divided), not_divided)]
    return dict(zip(["reference", "not dividing"], lab03.JUDGES["03_ddp_hooks"](pairs)))


def test_reference_ddp_passes_in_every_configuration(ddp_judged):
    result = ddp_judged["reference"]
    assert result.passed, result
    assert "18 configurations, world size 1 / 2 / 3 / 4" in _text(result), result
    sizes = {c["world_size"] for c in result.facts["records"]}
    nets = {c["net"] for c in result.facts["records"]}
    assert sizes == {1, 2, 3, 4} and nets == {"mlp", "twins", "tiny"}


def test_the_labs_own_run_gives_the_bytes_each_rank_sent():
    result = labs.check_ddp(wrap_ddp, average_gradient, world_size=2)
    assert result.passed, result
    psi = make_model(GPTConfig.tiny()).num_params()
    assert result.facts["sent_per_step"] == [2 * (2 - 1) / 2 * 4 * psi] * lab03.STEPS


def test_a_wrong_scale_is_found_at_the_smallest_world_size_that_shows_it(ddp_judged):
    (line,) = [msg for ok, msg, _ in ddp_judged["not dividing"].lines if not ok]
    assert line.startswith("at world size 2, net 'mlp', optimizer 'SGD+momentum': rank 0's "
                           "gradient in step 1 '0.weight'"), line
    assert "(2x)" in line and "right with world size 1, wrong with 2, 3, 4" in line


def test_a_stub_is_not_written_yet_without_starting_ranks():
    def stub(param, comm):
        ...
    result = labs.check_ddp(wrap_ddp, stub)
    assert not result.passed and "not written yet: stub" in _text(result)


class Stub:
    def __init__(self, buckets, comm):
        ...

    def grad_ready(self, param):
        ...

    def backward_done(self):
        ...


class HalfWritten(Buckets):
    def backward_done(self):
        ...


@pytest.fixture(scope="module")
def buckets_judged():
    classes = [Buckets, AllAtTheEnd, NoReset]
    return dict(zip(classes, lab03.JUDGES["03_buckets"](classes)))


def test_reference_buckets_pass_and_say_what_was_compared(buckets_judged):
    result = buckets_judged[Buckets]
    assert result.passed, result
    assert "launched once full while backward runs" in _text(result), result


def test_a_step_that_differs_only_after_the_first_is_named_as_such(buckets_judged):
    text = _text(buckets_judged[NoReset])
    assert "bucket all-reduces in step 2" in text and "right in the first step" in text, text


@pytest.mark.parametrize("cls, names", [(Stub, "__init__, grad_ready, backward_done"),
                                        (HalfWritten, "backward_done")])
def test_every_unwritten_method_is_named_without_starting_ranks(cls, names):
    result = labs.check_buckets(cls)
    assert not result.passed and len(result.lines) == 1, result
    assert f"not written yet: {names} (still `...`)" in _text(result), result


def test_the_buckets_check_trains_the_labs_own_model_and_bucket_size():
    """With model="default" (a laptop's cfg.model) the check's last configurations train that
    GPT, in buckets of a quarter of its bytes: what the lab then trains the buckets with."""
    result = labs.check_buckets(Buckets, world_size=2, model="default")
    assert result.passed, result
    psi = make_model(GPTConfig()).num_params()
    own = [c for c in result.facts["records"] if c["net"] == "default"]
    assert own and all(c["bucket_bytes"] == round(psi / 2**20 * 2**20) for c in own), own
    assert result.facts["sent_per_step"] == [2 * (2 - 1) / 2 * 4 * psi] * lab03.STEPS
