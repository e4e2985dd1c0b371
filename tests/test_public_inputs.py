"""Every public function checks its arguments by name before it does anything: a string is never
a flag or a number, None is not a count, a fraction is not a whole number; the error is a
TypeError or ValueError whose message names the function's argument (never an AttributeError
or a crash from deep inside). The building block is ``fsdp_mini.arguments``; this walks the
public API with values of the wrong kind."""

import os

import pytest
import torch
from torch import nn

import fsdp_mini
from fsdp_mini import arguments, labs

WRONG = {"a str": "1", "the str 'False'": "False", "None": None, "nan": float("nan"),
         "inf": float("inf"), "-1": -1, "True": True, "a list": [1], "bytes": b"x"}


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))


@pytest.fixture(scope="module")
def model():
    m, o = fsdp_mini.parallelize(net(), "fsdp", optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    m(torch.randn(2, 4)).sum().backward()
    return m, o


def refused(call, named: str) -> None:
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    assert named in str(caught.value), f"{named!r} not in: {caught.value}"


# -- the building block ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False])
def test_flag_takes_bools_only(value):
    assert arguments.flag("f(x)", value) is value


@pytest.mark.parametrize("value", ["False", "True", 0, 1, None, "", [True]])
def test_flag_refuses_what_is_not_a_bool(value):
    refused(lambda: arguments.flag("f(x)", value), "f(x) must be True or False")


def test_count_takes_whole_numbers_and_asks_what_a_fraction_means():
    assert arguments.count("n", 7e9) == 7_000_000_000 and arguments.count("n", 3) == 3
    with pytest.raises(ValueError, match=r"n must be a whole number, got 7\.5: did you mean 7\.5e9"):
        arguments.count("n", 7.5, scale_hint=1e9)
    for value in ("3", None, True, float("nan"), float("inf"), 2.5):
        refused(lambda: arguments.count("n", value), "n must be a whole number")
    refused(lambda: arguments.count("n", 0), ">= 1, got 0")
    refused(lambda: arguments.count("n", 9, at_most=8), "<= 8, got 9")


def test_number_refuses_strings_and_what_is_out_of_range():
    assert arguments.number("x", 2) == 2.0
    for value in ("0.4", None, True, [1]):
        with pytest.raises(TypeError, match="x must be a number"):
            arguments.number("x", value)
    for value in (float("nan"), float("inf"), 0, 1.5):
        with pytest.raises(ValueError, match=r"x must be a number > 0 and <= 1"):
            arguments.number("x", value, above=0, at_most=1)


def test_text_refuses_nul_and_what_is_not_a_str():
    assert arguments.text("t", "ok") == "ok"
    refused(lambda: arguments.text("t", "a\x00b"), "t holds a NUL character")
    refused(lambda: arguments.text("t", b"ok"), "t must be a str")
    refused(lambda: arguments.text("t", ""), "t must not be empty")


def test_choice_compares_type_and_value():
    assert arguments.choice("c", "a", ["a", "b"]) == "a"
    refused(lambda: arguments.choice("c", 1, ["1", "2"]), "c must be one of '1', '2', got 1")


# -- the public API ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(WRONG))
@pytest.mark.parametrize("argument", ["check_collectives", "ledger", "recorder", "device"])
def test_parallelize_names_its_keyword_arguments(kind, argument):
    value = WRONG[kind]
    if value is None and argument != "check_collectives" or \
            value is True and argument == "check_collectives":
        return  # valid: None is the default, True the debug mode
    if argument == "device" and isinstance(value, str) and value == "1":
        value = "no-such-device"
    module = net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    refused(lambda: fsdp_mini.parallelize(module, "ddp", **{argument: value}),
            f"parallelize({argument})")
    assert getattr(module, "fsdp_mini", None) is None        # nothing was done to the module
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


@pytest.mark.parametrize("strategy", [["fsdp"], 3, None, b"fsdp"])
def test_parallelize_names_a_strategy_that_is_not_a_name(strategy):
    refused(lambda: fsdp_mini.parallelize(net(), strategy), "strategy must be a strategy's name")


@pytest.mark.parametrize("kind", list(WRONG))
def test_checkpoint_functions_name_their_arguments(kind, model, tmp_path):
    m, o = model
    value = WRONG[kind]
    refused(lambda: fsdp_mini.save_checkpoint(value, o, tmp_path / "a"), "save_checkpoint(model)")
    refused(lambda: fsdp_mini.load_checkpoint(value, o, tmp_path / "a"), "load_checkpoint(model)")
    if value is not None:
        refused(lambda: fsdp_mini.save_checkpoint(m, value, tmp_path / "a"),
                "save_checkpoint(optimizer)")
        refused(lambda: fsdp_mini.load_checkpoint(m, value, tmp_path / "a"),
                "load_checkpoint(optimizer)")
        if value is not True:
            refused(lambda: fsdp_mini.save_checkpoint(m, o, tmp_path / "a", sharded=value),
                    "save_checkpoint(sharded)")
        refused(lambda: fsdp_mini.save_checkpoint(m, o, tmp_path / "a", step=value),
                "save_checkpoint(step)")
        refused(lambda: fsdp_mini.save_checkpoint(m, o, tmp_path / "a", format=value),
                "save_checkpoint(format")
    if not isinstance(value, str):
        refused(lambda: fsdp_mini.save_checkpoint(m, o, value), "save_checkpoint(path)")
        refused(lambda: fsdp_mini.load_checkpoint(m, o, value), "load_checkpoint(path)")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("kind", list(WRONG))
def test_clip_scaler_and_costs_name_their_arguments(kind, model):
    m, _ = model
    value = WRONG[kind]
    if kind != "inf":   # an infinite max_norm or norm_type is meaningful
        refused(lambda: fsdp_mini.clip_grad_norm_(m, value), "clip_grad_norm_(max_norm)")
        refused(lambda: fsdp_mini.clip_grad_norm_(m, 1.0, value), "clip_grad_norm_(norm_type)")
    if value is not True:
        refused(lambda: fsdp_mini.clip_grad_norm_(m, 1.0, error_if_nonfinite=value),
                "clip_grad_norm_(error_if_nonfinite)")
    for argument in ("init_scale", "growth_factor", "backoff_factor", "growth_interval",
                     "enabled"):
        if not (argument == "init_scale" and kind == "inf" or argument == "enabled" and
                value is True):
            refused(lambda: fsdp_mini.ShardedGradScaler(**{argument: value}),
                    f"ShardedGradScaler({argument})")
    if value is not None:
        refused(lambda: fsdp_mini.expected_costs(m, value), "expected_costs(optim_bytes)")
    refused(lambda: fsdp_mini.full_state_dict(value), "full_state_dict(model)")
    if value is not True:
        refused(lambda: fsdp_mini.Comm(check_collectives=value), "Comm(check_collectives)")


@pytest.mark.parametrize("field, value", [("world_size", "2"), ("world_size", 0),
                                          ("world_size", 2.5), ("world_size", True),
                                          ("world_size", None), ("steps", "3"), ("steps", 0),
                                          ("global_batch", -4), ("model", "huge"),
                                          ("model", None), ("backend", "mpi"), ("ci", "true"),
                                          ("gpus", -1)])
def test_lab_config_names_a_field_of_the_wrong_kind(field, value, capsys):
    refused(lambda: labs.lab_config(**{field: value}), f"lab_config({field})")
    assert "lab config:" not in capsys.readouterr().out      # nothing chosen, nothing printed
