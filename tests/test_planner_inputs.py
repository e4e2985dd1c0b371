"""The planner as a user calls it: GPU counts that 8 does not divide, hsdp's shard groups in a
node, strategies given as the command line gives them, and errors that name the flag to fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fsdp_mini.planner.plan import PLAN_STRATEGIES, plan


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
