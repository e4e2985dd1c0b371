"""The planner as a user calls it: GPU counts that 8 does not divide, hsdp's shard groups in a
node, strategies given as the command line gives them, and errors that name the flag to fix."""

from __future__ import annotations

import dataclasses
import inspect
import math
import subprocess
import sys

import pytest
import torch

from fsdp_mini.planner import hardware
from fsdp_mini.planner import plan as plan_module
from fsdp_mini.planner.budget import training_cost
from fsdp_mini.planner.plan import MAX_GPUS, MAX_MICRO_BATCHES, PLAN_STRATEGIES, plan
from fsdp_mini.planner.shapes import MAX_LAYERS, ModelShape
from fsdp_mini.planner.table import format_plan


def test_a_gpu_count_8_does_not_divide_plans_every_strategy():
    p = plan(params=7e9, gpus=12)
    assert list(p.strategies) == list(PLAN_STRATEGIES)
    # hsdp's groups: the largest divisor of 12 in a node of 8, 6 GPUs (16Ψ/6 kept per GPU)
    assert p.strategies["hsdp"].persistent_bytes == pytest.approx(16 * 7e9 / 6, rel=1e-3)
    assert list(plan(params=7e9, gpus=12, strategies=("fsdp", "ddp")).strategies) == ["fsdp",
                                                                                     "ddp"]


def test_hsdp_keeps_its_shard_groups_inside_a_node_of_the_size_given():
    p = plan(params=7e9, gpus=16, gpus_per_node=4, strategies=("hsdp", "fsdp"))
    given = plan(params=7e9, gpus=16, gpus_per_node=4, strategies=("hsdp",), shard_size=4)
    assert p.strategies["hsdp"].persistent_bytes == given.strategies["hsdp"].persistent_bytes
    assert p.strategies["hsdp"].comm_seconds_per_step == given.strategies["hsdp"].comm_seconds_per_step
    assert p.strategies["hsdp"].comm_seconds_per_step < p.strategies["fsdp"].comm_seconds_per_step


@pytest.mark.parametrize("given, names", [("fsdp", ["fsdp"]), ("ddp, fsdp", ["ddp", "fsdp"]),
                                          (["zero2"], ["zero2"])])
def test_strategies_are_read_from_a_string_as_the_command_line_reads_them(given, names):
    assert list(plan(params=1e9, gpus=8, strategies=given).strategies) == names


@pytest.mark.parametrize("kwargs, words", [
    ({"strategies": ("ddp",), "shard_size": 4}, "hsdp is not among the strategies"),
    ({"strategies": ""}, "no strategies given"),
    ({"gpus": 12, "shard_size": 5}, "shard_size 5 does not divide gpus 12"),
    ({"node_bandwidth_gbs": 0}, "node_bandwidth_gbs must be"),
    ({"latency_us": -1}, "latency_us must be a number of µs >= 0")])
def test_bad_input_is_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        plan(params=1e9, **{"gpus": 8, **kwargs})


@pytest.mark.parametrize("args, flag", [
    (["--node-bandwidth", "0"], "--node-bandwidth"), (["--train-tokens", "-5"], "--train-tokens"),
    (["--reserve-gb", "100"], "--reserve-gb"), (["--gpus-per-node", "0"], "--gpus-per-node"),
    (["--gpus", "12", "--shard-size", "5"], "--shard-size 5 does not divide --gpus 12"),
    (["--link-latency", "-1"], "--link-latency"), (["--micro-batches", "0"], "--micro-batches")])
def test_the_command_line_names_the_flag_to_fix(args, flag):
    proc = subprocess.run([sys.executable, "-m", "fsdp_mini.jobs.cli", "plan", "--params", "7e9",
                           *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert flag in proc.stderr and "_" not in proc.stderr.split("error:")[1], proc.stderr


# ---------------------------------------------------------------- every argument, checked by name
PARAMETERS = inspect.signature(plan).parameters
TYPES = {n: p.annotation if isinstance(p.annotation, str) else "" for n, p in PARAMETERS.items()}
FLAGS = [n for n, t in TYPES.items() if t == "bool"]
NUMBERS = [n for n, t in TYPES.items() if "int" in t or "float" in t]
COUNTS = [n for n, t in TYPES.items() if "int" in t] + ["params", "train_tokens"]
TINY = ModelShape(2, 32, 2, 64, 16)


def _refused(kwargs, name, errors=(TypeError, ValueError)) -> str:
    """plan(**kwargs)'s error, which must name the argument ``name`` first."""
    with pytest.raises(errors) as caught:
        plan(**kwargs)
    assert str(caught.value).startswith(f"plan: {name} "), str(caught.value)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.fixture
def no_work(monkeypatch):
    """plan() may check its arguments, but must not start to plan with a wrong one."""
    def work(*args, **kwargs):
        raise AssertionError("plan() started work before it had checked its arguments")
    for name in ("_tensors", "_activations", "memory", "collectives", "Layout"):
        monkeypatch.setattr(plan_module, name, work)


def test_the_lists_walked_below_are_plans_own():
    assert {"checkpointing", "offload", "prefetch", "no_sync"} <= set(FLAGS)
    assert {"efficiency", "bucket_mb", "tflops", "reserve_gb", "gpus", "seq"} <= set(NUMBERS)


@pytest.mark.parametrize("name", list(PARAMETERS))
def test_every_argument_of_plan_refuses_what_it_is_not_by_name_before_any_work(name, no_work):
    # Note: an object() is no bool, number, name, shape or list of names: every argument must
    # refuse it, naming itself; a new argument without a check fails here
    _refused({"model": "7b", name: object()}, name)


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("value", ["False", "True", "", 1, 0, None, 1.0])
def test_a_flag_is_true_or_false_never_a_truthy_string(name, value, no_work):
    message = _refused({"model": "7b", name: value}, name, TypeError)
    assert f"must be True or False, got {value!r}" in message


@pytest.mark.parametrize("name", FLAGS)
def test_flags_still_take_true_and_false(name):
    assert plan(model="7b", **{name: True}).strategies
    assert plan(model="7b", **{name: False}).strategies


@pytest.mark.parametrize("name", NUMBERS)
@pytest.mark.parametrize("value", ["1", "0.4", b"1", True, math.nan, math.inf, -math.inf, -1])
def test_a_number_is_a_real_finite_number_in_range_never_a_string(name, value, no_work):
    _refused({"model": "7b", name: value}, name)


@pytest.mark.parametrize("name", [n for n in NUMBERS if "None" not in TYPES[n]])
def test_a_number_without_a_default_of_none_refuses_none(name, no_work):
    _refused({"model": "7b", name: None}, name, TypeError)


@pytest.mark.parametrize("name", [n for n in COUNTS if n != "params"])
def test_a_count_refuses_a_fraction(name, no_work):
    # Note: hsdp needs the strategies to list it; gpus 2 (and a node of 2) so that 2.5 is near
    _refused({"model": "7b", "gpus": 2, "gpus_per_node": 2, name: 2.5}, name, ValueError)


def test_a_count_written_as_a_whole_float_is_that_count():
    assert plan(params=7e9, gpus=8.0, train_steps=1e3).as_dict() == \
        plan(params=7_000_000_000, gpus=8, train_steps=1000).as_dict()


@pytest.mark.parametrize("params, meant", [(7.5, "7.5e9"), (0.5, "0.5e9"), (13.2, "13.2e9")])
def test_a_fraction_of_a_parameter_count_asks_what_was_meant(params, meant, no_work):
    message = _refused({"params": params}, "params", ValueError)
    assert message.endswith(f"got {params!r}: did you mean {meant}?")


@pytest.mark.parametrize("kwargs, name, words", [
    ({"efficiency": 0}, "efficiency", "> 0 and <= 1"),
    ({"efficiency": 1.0000001}, "efficiency", "> 0 and <= 1"),
    ({"bucket_mb": 0}, "bucket_mb", "> 0"),
    ({"bucket_mb": math.inf}, "bucket_mb", "> 0"),
    ({"gpu": None}, "gpu", "must be a str, got None"),
    ({"gpu": 42}, "gpu", "must be a str, got 42 (an int)"),
    ({"gpu": "H999"}, "gpu", "unknown GPU 'H999'"),
    ({"gpu": ""}, "gpu", "must not be empty"),
    ({"tflops": 0}, "tflops", "> 0"),
    ({"reserve_gb": -0.5}, "reserve_gb", ">= 0"),
    ({"gpu_mem_gb": 40, "reserve_gb": 40}, "reserve_gb", "below the GPU's 40 GB"),
    ({"seq": 0}, "seq", ">= 1, got 0"),
    ({"micro_batch": 0}, "micro_batch", ">= 1, got 0"),
    ({"gpus": 0}, "gpus", ">= 1, got 0"),
    ({"gpus": MAX_GPUS + 1}, "gpus", f"<= {MAX_GPUS}"),
    ({"gpus_per_node": MAX_GPUS + 1}, "gpus_per_node", f"<= {MAX_GPUS}"),
    ({"micro_batches": MAX_MICRO_BATCHES + 1}, "micro_batches", f"<= {MAX_MICRO_BATCHES}"),
    ({"shard_size": 0, "strategies": ("ddp",)}, "shard_size", ">= 1, got 0"),  # not "hsdp's"
    ({"shard_size": -1}, "shard_size", ">= 1, got -1"),
    ({"strategies": None}, "strategies", "got None"),
    ({"strategies": 5}, "strategies", "got 5"),
    ({"strategies": ("fsdp", 3)}, "strategies", "got ('fsdp', 3)"),
    ({"strategies": ("fsdp", "fsdp")}, "strategies", "['fsdp'] more than once"),
    ({"strategies": "fsdp,zero3"}, "strategies", "['zero3']"),
    ({"precision": None}, "precision", "got None"),
    ({"precision": "fp16"}, "precision", "'fp32', 'bf16-mixed'"),
    ({"reduce_dtype": True}, "reduce_dtype", "got True (a bool)"),
    ({"reduce_dtype": torch.int8}, "reduce_dtype", "got torch.int8"),
    ({"model": 7}, "model", "got 7 (an int)"),
    ({"model": "9b"}, "model", "unknown model preset '9b'"),
    ({"train_tokens": 2.5}, "train_tokens", "did you mean 2.5e12?"),
    ({"train_tokens": 1e12, "price_per_gpu_hour": "3"}, "price_per_gpu_hour", "got '3'"),
    ({"price_per_gpu_hour": -1}, "price_per_gpu_hour", ">= 0"),  # before "needs a budget"
])
def test_each_range_is_checked_and_named(kwargs, name, words, no_work):
    assert words in _refused({"model": "7b", **kwargs}, name)


def test_arguments_that_only_mean_something_together_are_checked_after_each_alone(no_work):
    assert "not both" in _refused({"params": 7e9, "model": "7b"}, "give")
    assert "which params does not count" in _refused({"params": 7e9, "seq": 4096}, "seq")
    assert "hsdp is not among" in _refused({"model": "7b", "strategies": "ddp",
                                            "shard_size": 4}, "shard_size")


def test_what_is_right_still_plans():
    assert plan(model="7B", efficiency=1, reduce_dtype=torch.bfloat16, gpu="h200",
                reserve_gb=0).reduce_dtype == "bf16"
    assert list(plan(model="7b", strategies=["fsdp", "hsdp"], shard_size=8).strategies) == \
        ["fsdp", "hsdp"]


# ---------------------------------------------------------------- ModelShape, the presets lookup
SHAPE_FIELDS = [f.name for f in dataclasses.fields(ModelShape)]
SHAPE_COUNTS = [f.name for f in dataclasses.fields(ModelShape) if "int" in f.type]


@pytest.mark.parametrize("name", SHAPE_FIELDS)
def test_every_field_of_a_model_shape_is_checked_by_name(name):
    with pytest.raises((TypeError, ValueError), match=rf"^ModelShape: {name} "):
        dataclasses.replace(TINY, **{name: object()})


@pytest.mark.parametrize("name", SHAPE_COUNTS)
@pytest.mark.parametrize("value", [0, -1, 2.5, "2", True, math.nan])
def test_a_shapes_sizes_are_whole_numbers_from_1(name, value):
    with pytest.raises((TypeError, ValueError), match=rf"^ModelShape: {name} must be a whole"):
        dataclasses.replace(TINY, **{name: value})


def test_a_shape_of_whole_floats_holds_ints_and_its_limits_are_named():
    shape = ModelShape(2.0, 32.0, 2.0, 64.0, 16.0, ffn=128.0)
    assert shape == ModelShape(2, 32, 2, 64, 16, ffn=128)
    assert all(type(getattr(shape, n)) is int for n in ("n_layer", "d_model", "ffn"))
    with pytest.raises(ValueError, match=f"ModelShape: n_layer .* <= {MAX_LAYERS}"):
        dataclasses.replace(TINY, n_layer=MAX_LAYERS + 1)
    with pytest.raises(TypeError, match="ModelShape: tie_weights must be True or False"):
        dataclasses.replace(TINY, tie_weights="False")
    with pytest.raises(ValueError, match="ModelShape: style must be one of 'gpt', 'llama'"):
        dataclasses.replace(TINY, style="bert")
    with pytest.raises(ValueError, match="ModelShape.activation_bytes: moment must be one of"):
        TINY.activation_bytes(1, moment="later")
    with pytest.raises(TypeError, match="ModelShape.activation_bytes: checkpointing must be"):
        TINY.activation_bytes(1, checkpointing="False")


def test_the_gpu_presets_lookup_checks_its_name():
    assert hardware.gpu_named("h100") is hardware.GPUS["H100"]
    for bad, error in ((None, TypeError), (42, TypeError), ("H999", ValueError)):
        with pytest.raises(error, match="^gpu_named: name "):
            hardware.gpu_named(bad)
    with pytest.raises(TypeError, match="default_reserve_gb: gpu_mem_gb must be a number"):
        hardware.default_reserve_gb("80")
    with pytest.raises(ValueError, match="GPU.tflops: precision must be one of"):
        hardware.GPUS["H100"].tflops("fp16")


def test_the_budget_and_the_table_check_theirs():
    with pytest.raises(TypeError, match="training_cost: step_seconds must be a number"):
        training_cost("0.5", 65_536, 8, train_tokens=1e9)
    with pytest.raises(ValueError, match="training_cost needs a budget"):
        training_cost(0.5, 65_536, 8)
    with pytest.raises(TypeError, match="format_plan: p must be a Plan"):
        format_plan(None)
