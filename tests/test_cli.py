"""`fsdp-mini compare`: the table and the JSON report, as a user runs them."""

import json
import os
import shutil
import subprocess
import sys

import pytest


def _run(*args, timeout=240):
    exe = shutil.which("fsdp-mini", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "fsdp_mini.cli"]
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
