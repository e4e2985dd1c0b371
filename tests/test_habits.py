"""Used like plain torch, habits included: unused and re-frozen parameters, model.zero_grad(),
a step without backward, units from a generator, gradient clipping, reading weights.

Each habit runs under every strategy at world sizes 2 and 3 (one launch each) and is compared
with the same loop on a plain model in one process (or with torch's DDP where torch defines the
behaviour). Every check here failed before the fault-probe fixes.
"""

import copy
import math
import re

import habit_workers as hw
import pytest
import torch
from helpers import assert_states_equal
from torch import nn

import fsdp_mini

TOL = 1e-5


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"ws{n}")
def runs(request):
    ws = request.param
    return ws, fsdp_mini.launch(hw.run_all, ws, timeout=60)


@pytest.fixture(scope="module")
def plain():
    return {"unused": hw.unused_parameters(0, 1, "plain"),
            "freeze": hw.freeze_after_parallelize(0, 1, "plain"),
            "freeze+model.zero_grad": hw.freeze_after_parallelize(0, 1, "plain", "model"),
            "clip2": hw.clipping(0, 1, "plain"),
            "clip_inf": hw.clipping(0, 1, "plain", norm_type=float("inf"), max_norm=0.02)}


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
def test_unused_parameters_keep_no_gradient_and_do_not_move(runs, plain, strategy):
    ws, results = runs
    res = results[0]["unused", strategy]
    assert_states_equal(res["state"], plain["unused"]["state"], TOL, f"{strategy} ws{ws}")
    initial = hw.Habits().state_dict()
    assert torch.equal(res["state"]["block.never"], initial["block.never"])  # weight decay too
    for step in range(len(res["grads_none"])):  # zero2: a GradientElsewhere stands for a used one
        # Note: under fsdp a rank whose shard holds no part of a parameter has an empty piece;
        # it gets an empty gradient when that rank used the parameter, so "is None" still says
        # "no gradient" on every rank.
        for r in range(ws):
            nones = results[r]["unused", strategy]["grads_none"][step]
            assert nones["block.never"], f"{strategy} rank {r} step {step}: never-used grad"
            assert nones["block.first_step_only.weight"] == (step > 0), (strategy, r, step)
            assert not nones["block.lin.weight"], (strategy, r, step)


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
@pytest.mark.parametrize("habit", ["freeze", "freeze+model.zero_grad"])
def test_freezing_after_parallelize_is_followed(runs, plain, strategy, habit):
    ws, results = runs
    assert_states_equal(results[0][habit, strategy], plain[habit], TOL,
                        f"{habit} {strategy} ws{ws}")


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
def test_step_without_backward_moves_nothing(runs, strategy):
    ws, results = runs
    before, after = results[0]["no_backward", strategy]
    for name in before:
        assert torch.equal(before[name], after[name]), f"{strategy}: {name} moved"


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
def test_parameter_used_on_some_ranks_is_averaged_like_torch_ddp(runs, strategy):
    ws, results = runs
    for rank in range(ws):
        assert_states_equal(results[rank]["rank0_only", strategy],
                            results[rank]["rank0_only", "torch"], TOL, f"{strategy} ws{ws}")


def test_units_given_as_a_generator(runs):
    ws, results = runs
    for rank in range(ws):
        assert results[rank]["generator"]["units"] == ["block", "root"]
    reference = hw.Habits()
    state = results[0]["generator"]["state"]
    assert list(state) == list(reference.state_dict())
    assert not torch.equal(state["block.lin.weight"], reference.block.lin.weight)  # trained


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
@pytest.mark.parametrize("norm", ["clip2", "clip_inf"])
def test_clip_grad_norm_is_global(runs, plain, strategy, norm):
    ws, results = runs
    for rank in range(ws):
        norms = results[rank][norm, strategy]["norms"]
        assert norms == pytest.approx(plain[norm]["norms"], rel=1e-5), (strategy, rank)
    assert plain[norm]["norms"][0] > 0.05  # the clip really scaled something
    assert_states_equal(results[0][norm, strategy]["state"], plain[norm]["state"], TOL,
                        f"{norm} {strategy} ws{ws}")


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
def test_torch_clip_on_sharded_gradients_is_refused(runs, strategy):
    ws, results = runs
    message = results[0]["torch_clip", strategy]
    if strategy in ("zero1", "zero2", "fsdp"):
        assert message.startswith("GradientsChangedError"), message
        assert "fsdp_mini.clip_grad_norm_(model, max_norm)" in message
    else:  # ddp: whole averaged gradients, torch's clip is right
        assert message == "no error"
    if strategy == "zero2":  # the stand-in names the parameter whose gradient is elsewhere
        assert re.search(r"the gradient of '[\w.]+' is not on this rank", message), message


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
def test_summon_full_params(runs, strategy):
    ws, results = runs
    for rank in range(ws):
        res = results[rank]["summon", strategy]
        ref = res["reference"]
        assert res["outside_norm_is_finite"]
        if strategy == "fsdp":
            assert len(res["outside_shape"]) == 1  # this rank's piece, outside forward
        for name, value in res["inside"].items():
            assert torch.equal(value, ref[name]), (strategy, rank, name)
        for name in ref:
            assert torch.equal(res["after_discard"][name], ref[name]), (strategy, name)
        assert torch.equal(res["after_writeback"]["head.weight"],
                           torch.full_like(ref["head.weight"], 3.0))
        assert torch.equal(res["after_writeback"]["head.bias"], ref["head.bias"])


@pytest.mark.parametrize("strategy", hw.STRATEGIES)
def test_ledger_counts_steps_by_itself(runs, strategy):
    ws, results = runs
    auto, manual = results[0]["ledger_auto", strategy], results[0]["ledger_manual", strategy]
    assert auto["first"] == 0 and auto["seen"] == [0, 1, 2], auto  # 0-based, as a loop counts
    assert manual["seen"] == [1, 2, 3], manual  # next_step() at each start: never counted twice
    for res in (auto, manual):
        for sent in res["sent"][1:]:  # auto's step 0 also holds the broadcasts of wrapping
            assert sent == pytest.approx(res["expected"], rel=1e-12), (strategy, res)
    assert manual["sent"][0] == pytest.approx(manual["expected"], rel=1e-12)


def test_mismatch_error_names_the_step_without_help(tmp_path):
    with pytest.raises(fsdp_mini.LaunchError) as info:
        fsdp_mini.launch(hw.mismatch_at_step_two, 2, timeout=30)
    assert "CollectiveMismatchError" in info.value.exc_type
    assert "collective mismatch at step 2" in str(info.value)  # the third step


# -- in this very process, as in a notebook kernel at world size 1 -----------------------------

def test_reading_fsdp_weights_outside_forward_is_safe():
    model = hw.Habits()
    model, opt = fsdp_mini.parallelize(model, "fsdp", optimizer=hw.ADAMW, units=[model.block])
    assert "Linear" in repr(model)  # printing before the first forward
    assert torch.isfinite(model.block.lin.weight.norm())
    x, y = hw.batch(0)
    for _ in range(2):
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
        norm = model.block.lin.weight.norm()  # used to read freed memory (a crash)
        assert math.isfinite(norm.item())
    with fsdp_mini.summon_full_params(model):
        whole = model.block.lin.weight.detach().clone()
    assert whole.shape == (6, 6)
    assert torch.equal(whole, fsdp_mini.full_state_dict(model)["block.lin.weight"])


def test_unfreezing_after_parallelize_is_refused():
    for strategy in hw.STRATEGIES:
        model = hw.Habits()
        model.head.requires_grad_(False)
        model, _ = fsdp_mini.parallelize(model, strategy, optimizer=hw.ADAMW,
                                         units=[model.block])
        model.head.requires_grad_(True)
        with pytest.raises(RuntimeError, match=r"'head.weight'.*frozen.*when parallelize ran"):
            model(*hw.batch(0))


@pytest.mark.parametrize("bad, match", [
    ({"bucket_mb": "2"}, "bucket_mb must be positive"),
    ({"bucket_mb": float("nan")}, "bucket_mb must be positive"),
    ({"optimizer": lambda params: None}, "returned a NoneType, not a torch.optim.Optimizer"),
    ({"units": nn.Linear(2, 2)}, "units must be an iterable of modules"),
])
def test_bad_options_are_refused_before_anything_changes(bad, match):
    model = hw.Habits()
    strategy = "fsdp" if "units" in bad else "zero2"
    with pytest.raises((TypeError, ValueError), match=match):
        fsdp_mini.parallelize(model, strategy, **bad)
    assert getattr(model, "fsdp_mini", None) is None
    assert type(model) is hw.Habits


def test_a_model_on_the_meta_device_is_materialised_or_clearly_refused():
    """Block.never has no reset_parameters() to initialise it: a clear error, before anything
    changes; with param_init_fn= the model is materialised (see tests/test_meta_init.py)."""
    with torch.device("meta"):
        model = hw.Habits()
    with pytest.raises(ValueError, match=r"'block' \(Block\).*reset_parameters.*param_init_fn"):
        fsdp_mini.parallelize(model, "fsdp", units=[model.block])

    def init(module):
        for p in module.parameters():
            if not p.is_meta:  # the root's turn: the unit's are meta stand-ins, skip them
                nn.init.normal_(p)

    model, _ = fsdp_mini.parallelize(model, "fsdp", units=[model.block], param_init_fn=init)
    state = fsdp_mini.full_state_dict(model)
    assert not any(v.is_meta for v in state.values())
    assert model(*hw.batch(0)).isfinite()


def test_zero2_gradients_reduce_scattered_away_are_stand_ins_that_explain_themselves():
    """In one process: a used parameter's p.grad names where its gradient went, an unused one
    keeps None; printing, deepcopy and zero_grad(set_to_none=False) work; two backwards without
    zero_grad accumulate like plain torch (the next forward drops the stand-ins)."""
    plain = hw.Habits()
    model, opt = fsdp_mini.parallelize(hw.Habits(), "zero2", optimizer=hw.ADAMW)
    x, y = hw.batch(0)
    model(x, y, 0).backward()
    grad = model.block.lin.weight.grad
    assert isinstance(grad, fsdp_mini.clip.GradientElsewhere) and grad.shape == (6, 6)
    assert model.block.never.grad is None
    assert "GradientElsewhere('block.lin.weight', shape=(6, 6)" in repr(grad)
    assert isinstance(copy.deepcopy(grad), fsdp_mini.clip.GradientElsewhere)
    with pytest.raises(fsdp_mini.GradientsChangedError, match="fsdp_mini.clip_grad_norm_"):
        grad.norm()
    model.zero_grad(set_to_none=False)
    assert model.block.lin.weight.grad is None
    for net in (plain, model):  # two backwards, no zero_grad between them
        for step in (0, 1):
            net(*hw.batch(step), step).backward()
    pieces = {id(p): p for p in opt.param_groups[0]["params"]}
    total = sum(p.grad.double().pow(2).sum() for p in pieces.values() if p.grad is not None)
    ref = sum(p.grad.double().pow(2).sum() for p in plain.parameters() if p.grad is not None)
    assert math.isclose(total.item(), ref.item(), rel_tol=1e-9)
