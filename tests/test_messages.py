"""Bad input gets one clear error, fast, naming what was wrong and how to fix it: the planner's
sequence length, nccl without GPUs, clipping orders that are no norm, torchrun with no process,
a damaged event file (its name and line)."""

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.telemetry import EventTail, load_events

EXE = Path(sys.executable).parent / "fsdp-mini"
CMD = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "fsdp_mini.jobs.cli"]


def _cli(*args) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = subprocess.run(CMD + list(args), capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 30
    return proc


@pytest.mark.parametrize("args, message", [
    (["--model", "7b", "--seq", "0"], "--seq must be a whole number >= 1, got 0"),
    (["--layers", "2", "--hidden", "64", "--heads", "2", "--vocab", "100", "--seq", "-3"],
     "--seq must be a whole number >= 1, got -3"),
    (["--params", "7e9", "--seq", "4096"], "--seq sets the sequence length of the activations, "
                                           "which --params does not count"),
    (["--model", "7b", "--shard-size", "0"], "--shard-size must be a whole number >= 1, got 0"),
])
def test_plan_refuses_sizes_that_are_no_sizes(args, message):
    proc = _cli("plan", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"fsdp-mini plan: error: {message}" + proc.stderr.split(message, 1)[1]
    assert proc.stderr.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with GPUs")
def test_compare_with_nccl_and_no_gpu_names_the_missing_gpus_only():
    proc = _cli("compare", "--backend", "nccl", "--world-size", "2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no CUDA GPU is visible here (this torch is a CPU build)" in proc.stderr
    assert 'Use backend="gloo"' in proc.stderr and "world_size <=" not in proc.stderr


@pytest.mark.parametrize("norm_type", [0, 0.0, -1, math.nan, "two", True])
def test_clip_refuses_orders_that_are_no_norm_before_any_work(norm_type):
    model, _ = fsdp_mini.parallelize(torch.nn.Linear(3, 2), "fsdp")
    model(torch.randn(4, 3)).sum().backward()
    with pytest.raises(ValueError, match=r"clip_grad_norm_\(norm_type\) must be a number > 0 or float\('inf'\)"):
        fsdp_mini.clip_grad_norm_(model, 1.0, norm_type=norm_type)
    with pytest.raises(ValueError, match=r"clip_grad_norm_\(max_norm\) must be a number >= 0"):
        fsdp_mini.clip_grad_norm_(model, -1.0)
    assert fsdp_mini.clip_grad_norm_(model, 1.0, norm_type=float("inf")) >= 0  # still fine


def test_torchrun_refuses_no_process_and_a_missing_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    for nproc in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"nproc must be a whole number >= 1.*got {nproc!r}"):
            labs.torchrun(script, nproc=nproc)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        labs.torchrun(script, nproc=1, timeout=0)
    with pytest.raises(FileNotFoundError, match="no script .*nothere.py"):
        labs.torchrun(tmp_path / "nothere.py", nproc=1)


def test_a_damaged_event_file_is_named_with_its_line(tmp_path):
    good = json.dumps({"kind": "step", "rank": 0})
    file = tmp_path / "events_rank0.jsonl"
    file.write_text(f"{good}\n{good}\n{{\"kind\": \"st\n{good}\n")
    for source in (str(file), str(tmp_path)):
        with pytest.raises(ValueError, match=rf"{file}, line 3: not a JSON event"):
            load_events(source)
    file.write_text(f"{good}\n[1, 2]\n")
    with pytest.raises(ValueError, match=rf"{file}, line 2: an event is a JSON object"):
        load_events(str(file))
    with pytest.raises(FileNotFoundError, match="no events at"):
        load_events(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no events_rank"):
        load_events(str(tmp_path / "empty"))


def test_the_live_tail_counts_lines_across_reads(tmp_path):
    file = tmp_path / "events_rank1.jsonl"
    tail = EventTail(str(tmp_path))
    file.write_text('{"a": 1}\n{"a": 2}\n{"a"')  # the third line is still being written
    assert [e["a"] for e in tail.read()] == [1, 2]
    with open(file, "a") as f:
        f.write(': 3}\n{"a": 4}\nnot json\n')
    with pytest.raises(ValueError, match=rf"{file}, line 5: not a JSON event"):
        tail.read()
