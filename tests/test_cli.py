"""`fsdp-mini compare`: the table and the JSON report, as a user runs them."""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch


def _run(*args, timeout=240):
    exe = shutil.which("fsdp-mini", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "fsdp_mini.jobs.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "report.json"
    proc = _run("compare", "--world-size", "2", "--model", "tiny", "--steps", "5",
                "--global-batch", "4", "--json", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(path.read_text())


def test_json_has_the_documented_shape(report):
    _, rep = report
    assert rep["world_size"] == 2 and rep["params"] > 0
    assert list(rep["strategies"]) == ["single", "ddp", "zero1", "zero2", "fsdp"]
    for name, entry in rep["strategies"].items():
        assert set(entry["theory"]) == {"sent_bytes_per_step", "persistent_bytes"}
        assert [r["rank"] for r in entry["ranks"]] == ([0] if name == "single" else [0, 1])
        for r in entry["ranks"]:
            assert {"rank", "peak_bytes", "peak_by_category", "persistent_bytes",
                    "sent_bytes_per_step", "step_seconds", "final_loss"} <= set(r)
            assert r["peak_bytes"] >= r["persistent_bytes"] > 0
            assert r["step_seconds"] > 0


def test_measurements_match_theory_and_each_other(report):
    _, rep = report
    s = rep["strategies"]
    for name, entry in s.items():
        for r in entry["ranks"]:
            assert r["sent_bytes_per_step"] == pytest.approx(entry["theory"]["sent_bytes_per_step"])
            # AdamW's step counters (4 bytes per tensor) are the only state the formula omits
            assert 0 <= r["persistent_bytes"] - entry["theory"]["persistent_bytes"] < 1024, name
    state = {n: e["ranks"][0]["persistent_bytes"] for n, e in s.items()}
    assert state["ddp"] > state["zero1"] > state["zero2"] > state["fsdp"]
    global_loss = {n: sum(r["final_loss"] for r in e["ranks"]) / len(e["ranks"])
                   for n, e in s.items()}
    for name, loss in global_loss.items():
        assert loss == pytest.approx(global_loss["single"], rel=1e-5), name


def test_table_is_printed(report):
    out, _ = report
    assert "strategy" in out and "sent MiB/step" in out
    for name in ("single", "ddp", "zero1", "zero2", "fsdp"):
        assert any(line.startswith(name) for line in out.splitlines())


def test_bad_arguments_are_explained():
    proc = _run("compare", "--world-size", "3", "--global-batch", "8")
    assert proc.returncode != 0 and "not divisible" in proc.stderr
    proc = _run("compare", "--strategies", "ddp,zero3", "--world-size", "2")
    assert proc.returncode != 0 and "unknown strategies ['zero3']" in proc.stderr


# ---------------------------------------------------------------- bad input: one line, exit 2, no rank
def _main_in_process(args, monkeypatch, capsys):
    """Run `fsdp-mini compare ARGS` in this process, failing if it ever calls launch."""
    import fsdp_mini.launcher
    from fsdp_mini.jobs.cli import main

    def no_launch(*a, **k):
        raise AssertionError("launch was called: the bad input was not caught before any rank")
    monkeypatch.setattr(fsdp_mini.launcher, "launch", no_launch)
    start = time.monotonic()
    code = main(["compare", "--model", "tiny", *args])
    out, err = capsys.readouterr()
    return code, out, err, time.monotonic() - start


BAD_ARGUMENTS = [
    (["--world-size", "0"], "--world-size must be >= 1 and <= 512 (ranks on this machine), got 0"),
    (["--world-size", "-2"], "--world-size must be >= 1 and <= 512 (ranks on this machine), got -2"),
    (["--world-size", "100000"], "--world-size must be >= 1 and <= 512 (ranks on this machine), got 100000"),
    (["--timeout", "0"], "--timeout must be a number of seconds from 1 to 604800, got 0"),
    (["--timeout", "-1"], "--timeout must be a number of seconds from 1 to 604800, got -1"),
    (["--timeout", "nan"], "--timeout must be a number of seconds from 1 to 604800, got nan"),
    (["--timeout", "inf"], "--timeout must be a number of seconds from 1 to 604800, got inf"),
    (["--global-batch", "0"], "--global-batch must be >= 1, got 0"),
    (["--global-batch", "-4", "--world-size", "2"], "--global-batch must be >= 1, got -4"),
    (["--global-batch", "9", "--world-size", "2"],
     "--global-batch 9 is not divisible by --world-size 2; pick a multiple of 2"),
    (["--steps", "1"], "--steps must be at least 4 (warm-up, a timed and a memory-tracked step), got 1"),
    (["--strategies", ""], "strategies must name at least one of single, ddp, zero1, zero2, fsdp, got none"),
    (["--strategies", " , "], "strategies must name at least one of single, ddp, zero1, zero2, fsdp, got none"),
    (["--strategies", "ddp,fsdp,ddp"], "strategies name ['ddp'] more than once; name each strategy once"),
    (["--strategies", "ddp,zero3"], "unknown strategies ['zero3']; choose from single, ddp, zero1, zero2, fsdp, hsdp"),
    (["--shard-size", "3"], "--shard-size must divide --world-size 2, got 3; use one of [1, 2]"),
    (["--strategies", "ddp", "--shard-size", "2"], "--shard-size is hsdp's, but --strategies ddp has no hsdp; add hsdp to --strategies, or leave --shard-size out"),
    (["--json", ""], "--json needs the path of a file to write, e.g. --json report.json"),
    (["--strategies", "ddp,hsdp"], "hsdp needs shard_size (--shard-size S): the ranks that shard the model together, a divisor of the world size"),
]


@pytest.mark.parametrize("args, message", BAD_ARGUMENTS)
def test_bad_arguments_fail_in_one_line_before_any_rank(args, message, monkeypatch, capsys):
    code, out, err, seconds = _main_in_process(["--world-size", "2", *args], monkeypatch, capsys)
    assert (code, out, err) == (2, "", f"fsdp-mini compare: error: {message}\n")
    assert seconds < 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_nccl_without_gpus_is_one_line(monkeypatch, capsys):
    code, out, err, _ = _main_in_process(["--world-size", "2", "--backend", "nccl"], monkeypatch, capsys)
    assert (code, out) == (2, "")
    assert err.startswith('fsdp-mini compare: error: backend="nccl" needs GPUs, one per rank, and '
                          "no CUDA GPU is visible here") and err.count("\n") == 1
    assert "world_size <=" not in err  # names the missing GPUs only


def _json_targets(tmp_path):
    (tmp_path / "a_file").write_text("")
    targets = {"missing folder": (tmp_path / "nope" / "r.json", "the folder {} does not exist"),
               "a folder": (tmp_path, "is a folder; give the path of a file to write"),
               "below a file": (tmp_path / "a_file" / "r.json", "the folder {} is a file, not a folder")}
    if os.geteuid() != 0:  # root writes into read-only folders anyway
        (tmp_path / "ro").mkdir(mode=0o555)
        targets["read-only folder"] = (tmp_path / "ro" / "r.json", "cannot write in {}")
    return targets


def test_unwritable_json_path_fails_before_the_run(tmp_path, monkeypatch, capsys):
    for what, (path, expected) in _json_targets(tmp_path).items():
        code, out, err, seconds = _main_in_process(["--world-size", "2", "--json", str(path)],
                                                   monkeypatch, capsys)
        assert (code, out) == (2, ""), what
        assert err.startswith(f"fsdp-mini compare: error: --json {path}") and err.count("\n") == 1, err
        assert expected.format(os.path.dirname(path)) in err, (what, err)
        assert seconds < 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # probe removed


def test_bad_argument_from_the_shell_is_one_line_with_exit_status_2():
    start = time.monotonic()
    proc = _run("compare", "--world-size", "0", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "fsdp-mini compare: error: --world-size must be >= 1 and <= 512 (ranks on this machine), got 0\n"
    assert time.monotonic() - start < 30


def test_compare_config_checks_strategies_for_the_python_api_too():
    from fsdp_mini.jobs.compare import CompareConfig
    with pytest.raises(ValueError, match=r"strategies must name at least one"):
        CompareConfig(strategies=())
    with pytest.raises(ValueError, match=r"strategies name \['fsdp'\] more than once"):
        CompareConfig(strategies=("fsdp", "ddp", "fsdp"))
    with pytest.raises(TypeError, match=r"strategies must be a tuple of names .* got 'ddp'"):
        CompareConfig(strategies="ddp")
    with pytest.raises(ValueError, match=r"global_batch must be >= 1 \(sequences per step\), got 0"):
        CompareConfig(global_batch=0)
    with pytest.raises(TypeError, match=r"steps must be an int, got 8.0"):
        CompareConfig(steps=8.0)
    assert CompareConfig(strategies=["ddp", "fsdp"]).strategies == ("ddp", "fsdp")


@pytest.mark.parametrize("command", [[], ["compare"], ["render-labs"], ["plan"]])
def test_every_command_explains_itself_with_help(command):
    proc = _run(*command, "--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: fsdp-mini") and not proc.stderr, proc.stderr


# ---------------------------------------------------------------- compare: each flag alone first
@pytest.mark.parametrize("args, message", [
    (["--shard-size", "0"], "--shard-size must be a whole number of ranks >= 1, got 0"),
    (["--shard-size", "-1"], "--shard-size must be a whole number of ranks >= 1, got -1"),
    (["--shard-size", "2.5"], "--shard-size must be a whole number of ranks, got 2.5"),
    # Note: the 0 is what is wrong, not the missing hsdp
    (["--shard-size", "0", "--strategies", "ddp"],
     "--shard-size must be a whole number of ranks >= 1, got 0"),
    (["--world-size", "2.5"], "--world-size must be a whole number of ranks, got 2.5"),
    (["--steps", "4.5"], "--steps must be a whole number of steps, got 4.5"),
    (["--global-batch", "4.5"], "--global-batch must be a whole number of sequences, got 4.5"),
])
def test_compare_checks_each_flags_type_and_range_before_what_they_mean_together(
        args, message, monkeypatch, capsys):
    code, out, err, _ = _main_in_process(["--world-size", "2", *args], monkeypatch, capsys)
    assert (code, out, err) == (2, "", f"fsdp-mini compare: error: {message}\n")


@pytest.mark.parametrize("command, args, flag", [
    ("compare", ["--world-size", "two"], "--world-size"), ("compare", ["--timeout", "x"], "--timeout"),
    ("compare", ["--model", "big"], "--model"), ("plan", ["--params", "7e9", "--gpus", "x"], "--gpus"),
    ("plan", ["--params", "7e9", "--checkpointing=False"], "--checkpointing"),
    ("plan", ["--params", "7e9", "--offload=0"], "--offload"),
    ("plan", ["--params", "7e9", "--no-sync=None"], "--no-sync"),
    ("plan", ["--params", "7e9", "--prefetch=True"], "--prefetch")])
def test_what_argparse_itself_refuses_is_one_line_too(command, args, flag):
    proc = _run(command, *args, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith(f"fsdp-mini {command}: error: ") and proc.stderr.count("\n") == 1
    assert flag in proc.stderr


def test_compare_config_checks_each_field_before_what_they_mean_together():
    from fsdp_mini.jobs.compare import CompareConfig
    with pytest.raises(ValueError, match=r"^shard_size must be an int >= 1 .*got 0"):
        CompareConfig(strategies=("ddp",), shard_size=0)  # not "hsdp's"
    with pytest.raises(TypeError, match=r"^shard_size must be an int, got 2.0"):
        CompareConfig(strategies=("hsdp",), shard_size=2.0)
    with pytest.raises(ValueError, match=r"^shard_size is hsdp's, but strategies .* no hsdp"):
        CompareConfig(strategies=("ddp",), shard_size=2)
    for field, value, error in (("progress", "no", TypeError), ("lr", "1e-3", TypeError),
                                ("bucket_mb", math.nan, ValueError),
                                ("model", "big", ValueError),
                                ("link_latency_us", "5", TypeError)):
        with pytest.raises(error, match=f"^{field} must be"):
            CompareConfig(**{field: value})
    assert CompareConfig(strategies=("hsdp",), shard_size=2).shard_size == 2


# ---------------------------------------------------------------- plan: plan() checks, the CLI names the flag
def _plan_parser():
    from fsdp_mini.jobs.cli import _parser
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["plan"]


def _plan_in_process(args, capsys):
    from fsdp_mini.jobs.cli import main
    try:
        code = main(["plan", *args])
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def _base(flag: str) -> list[str]:
    """What else a flag needs to plan: a model (a shape for the shape's own flags)."""
    shape = {"--layers": "2", "--hidden": "64", "--heads": "2", "--vocab": "100"}
    if flag in shape or flag in ("--kv-heads", "--ffn"):
        return [x for f, v in shape.items() if f != flag for x in (f, v)]
    return [] if flag == "--params" else ["--model", "7b"]


NUMBER_FLAGS = [a.option_strings[0] for a in _plan_parser()._actions
                if a.type is not None and a.type.__name__ == "number"]


def test_the_walk_covers_plans_number_flags():
    assert {"--params", "--gpus", "--micro-batch", "--efficiency", "--seq", "--layers",
            "--train-steps", "--price-per-gpu-hour"} <= set(NUMBER_FLAGS)


@pytest.mark.parametrize("flag", NUMBER_FLAGS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "-1", "abc"])
def test_every_number_flag_of_plan_refuses_a_bad_number_in_one_line_naming_it(flag, value, capsys):
    code, out, err = _plan_in_process([*_base(flag), f"{flag}={value}"], capsys)
    assert (code, out) == (2, ""), err
    assert err.startswith("fsdp-mini plan: error: ") and err.count("\n") == 1, err
    message = err.split("error: ", 1)[1]
    assert flag in message and "_" not in message and "plan: " not in message, err


@pytest.mark.parametrize("args, message", [
    (["--params", "7.5"],
     "--params must be a whole number of parameters, got 7.5: did you mean 7.5e9?"),
    (["--params", "0.5"],
     "--params must be a whole number of parameters, got 0.5: did you mean 0.5e9?"),
    (["--params", "1e400"], "--params must be a whole number of parameters, got inf"),
    (["--params", "nan"], "--params must be a whole number of parameters, got nan"),
    (["--params", "7e9", "--gpus", "2.5"], "--gpus must be a whole number of GPUs, got 2.5"),
    (["--params", "7e9", "--micro-batch", "0"], "--micro-batch must be a whole number >= 1, got 0"),
    (["--model", "7b", "--train-tokens", "2.5"],
     "--train-tokens must be a whole number of tokens, got 2.5: did you mean 2.5e12?"),
    (["--model", "7b", "--strategies", "ddp,ddp"],
     "--strategies names ['ddp'] more than once; name each strategy once"),
    (["--layers", "2.5", "--hidden", "64", "--heads", "2", "--vocab", "100"],
     "--layers must be a whole number, got 2.5"),
    (["--layers", "2", "--hidden", "64", "--heads", "3", "--vocab", "100"],
     "--hidden 64 is not divisible by --heads 3"),
])
def test_plan_flags_are_named_with_what_they_got_and_what_they_want(args, message, capsys):
    assert _plan_in_process(args, capsys) == (2, "", f"fsdp-mini plan: error: {message}\n")


def test_the_plan_command_leaves_the_checks_to_plan_and_names_its_flags(monkeypatch, capsys):
    import inspect

    import fsdp_mini
    from fsdp_mini.jobs import plan_cli
    seen = {}

    def checking_plan(**kwargs):
        seen.update(kwargs)
        raise ValueError("plan: gpus_per_node 3 is not gpus 0's nor shard_size's (n_layer)")
    monkeypatch.setattr(plan_cli, "plan", checking_plan)
    code, out, err = _plan_in_process(["--model", "7b", "--gpus", "0", "--efficiency", "7"],
                                      capsys)
    # Note: the CLI did not refuse --gpus 0 itself: plan() had it, as given
    assert seen["gpus"] == 0 and seen["efficiency"] == 7
    assert set(seen) <= set(inspect.signature(fsdp_mini.plan).parameters)
    assert (code, out) == (2, "")
    assert err == ("fsdp-mini plan: error: --gpus-per-node 3 is not --gpus 0's nor "
                   "--shard-size's (--layers)\n")
    dests = {a.dest for a in _plan_parser()._actions}
    assert set(plan_cli.FLAGS.values()) | set(plan_cli.SHAPE_FLAGS.values()) <= dests
