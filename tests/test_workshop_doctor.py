"""``fsdp-mini doctor`` (issue 28, item 6): what would stop the labs, one line each with its fix.

It runs here, on CPU, and says plainly what it cannot check without GPUs; a GPU box, a missing
GPU, a small /dev/shm, a memlock limit, a taken port and JupyterLab's token are played with a
stand-in :class:`Probe` (what the checks read from the machine) and a small HTTP server that
answers /api/status as JupyterLab does.
"""

from __future__ import annotations

import argparse
import http.server
import re
import subprocess
import sys
import threading

import pytest

from fsdp_mini.jobs import doctor
from fsdp_mini.jobs.cli import main

GIB = 1024**3


class Box(doctor.Probe):
    """A healthy 4-GPU workshop box; the tests change one thing at a time."""

    def __init__(self, **changes):
        self.facts = dict(kit="0.1.0", torch="2.11.0+cu128", cuda="12.8", gpus=["NVIDIA L4"] * 4,
                          smi=["NVIDIA L4"] * 4, nccl=(True, "2.26.2"), gloo=True, shm=64 * GIB,
                          memlock=None, taken=(), http={})
        self.facts.update(changes)

    def kit_version(self): return self.facts["kit"]
    def torch_version(self): return self.facts["torch"]
    def torch_cuda(self): return self.facts["cuda"]
    def torch_gpus(self): return list(self.facts["gpus"])
    def nvidia_smi_gpus(self): return self.facts["smi"]
    def nccl(self): return self.facts["nccl"]
    def gloo(self): return self.facts["gloo"]
    def shm_bytes(self): return self.facts["shm"]
    def memlock(self): return self.facts["memlock"]
    def port_free(self, port): return port not in self.facts["taken"]

    def http_status(self, url, token, timeout=10.0):
        return self.facts["http"].get(token, "connection refused")


def run(probe, *args):
    parser = argparse.ArgumentParser()
    doctor.add_doctor_parser(parser.add_subparsers(dest="command"))
    return doctor.doctor_command(parser.parse_args(["doctor", *args]), probe)


def lines(capsys):
    out = capsys.readouterr().out.splitlines()
    return {line.split(":")[0].split(None, 1)[1]: line for line in out[:-1]}, out[-1]


def test_a_healthy_box_is_all_ok(capsys):
    code = run(Box(http={"t0k": 200}), "--gpus", "4", "--url", "http://localhost:8888/lab?token=t0k")
    found, summary = lines(capsys)
    assert code == 0, found
    assert set(found) == {"versions", "GPUs", "NCCL", "/dev/shm", "memlock", "ports", "JupyterLab"}
    assert all(line.startswith("ok ") for line in found.values()), found
    assert "4 × NVIDIA L4, each seen by torch: the labs run 4 NCCL ranks" in found["GPUs"]
    assert "NCCL 2.26.2" in found["NCCL"] and "torch 2.11.0+cu128" in found["versions"]
    assert summary == "fsdp-mini doctor: nothing wrong"


@pytest.mark.parametrize("changes, args, what, says", [
    (dict(gpus=["NVIDIA L4"] * 3), ["--gpus", "4"], "GPUs", "torch sees 3 of the 4 GPUs nvidia-smi lists"),
    (dict(gpus=["NVIDIA L4"] * 3, smi=["NVIDIA L4"] * 3), ["--gpus", "4"], "GPUs", "3 × NVIDIA L4, 4 expected"),
    (dict(gpus=[], cuda=None, torch="2.13.0+cpu"), [], "GPUs", "is a CPU build"),
    (dict(gpus=[]), [], "GPUs", "older than CUDA 12.8"),
    (dict(gpus=[], smi=None), ["--gpus", "4"], "GPUs", "--gpus all"),
    (dict(nccl=(False, None)), [], "NCCL", "has no NCCL"),
    (dict(shm=64 * 1024**2), [], "/dev/shm", "--ipc=host"),
    (dict(memlock=64 * 1024), [], "memlock", "--ulimit memlock=-1"),
    (dict(taken=(0,)), [], "ports", "no port can be opened on 127.0.0.1"),
    (dict(torch="2.7.1"), [], "versions", "the kit needs torch>=2.8"),
    (dict(http={"right": 200, "wrong": 403}), ["--url", "http://localhost:8888", "--token", "wrong"],
     "JupyterLab", "refuses the token"),
    (dict(), ["--url", "http://localhost:8888", "--token", "t"], "JupyterLab",
     "ssh -N -L 8888:localhost:8888 attendee@<address>"),
    (dict(http={None: 200}), ["--url", "http://localhost:8888"], "JupyterLab", "answers without a token"),
])
def test_each_problem_is_one_fail_line_naming_the_fix(capsys, monkeypatch, changes, args, what, says):
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)
    code = run(Box(**changes), *args)
    found, summary = lines(capsys)
    assert code == 1
    assert found[what].startswith(f"FAIL {what}: ") and says in found[what], found[what]
    assert "fix:" in found[what], found[what]
    assert [w for w, line in found.items() if line.startswith("FAIL")] == [what], found
    assert summary.startswith(f"fsdp-mini doctor: 1 problem ({what}): fix")


def test_what_only_matters_on_gpus_is_a_warning_on_a_cpu_machine(capsys):
    code = run(Box(gpus=[], smi=None, cuda=None, torch="2.13.0+cpu", nccl=(False, None),
                   memlock=8 * 1024**2, shm=512 * 1024**2, taken=(29400,)))
    found, summary = lines(capsys)
    assert code == 0, found
    assert found["GPUs"].startswith("skip GPUs: no GPU here")
    assert found["NCCL"].startswith("skip NCCL: cannot be checked without GPUs")
    assert found["memlock"].startswith("warn memlock: 8 MiB")
    assert found["/dev/shm"].startswith("warn /dev/shm: 512 MiB")
    assert found["ports"].startswith("warn ports: 29400 in use")
    assert "not checked here: GPUs, NCCL, JupyterLab" in summary


def test_the_token_comes_from_the_flag_the_url_or_the_environment(capsys, monkeypatch):
    box = Box(http={"env-token": 200})
    monkeypatch.setenv("JUPYTER_TOKEN", "env-token")
    assert run(box, "--url", "http://127.0.0.1:8888") == 0
    monkeypatch.delenv("JUPYTER_TOKEN")
    assert run(box, "--url", "http://127.0.0.1:8888/?token=env-token") == 0
    assert run(box, "--url", "http://127.0.0.1:8888", "--token", "env-token") == 0
    capsys.readouterr()
    assert run(Box(http={None: 403}), "--url", "http://127.0.0.1:8888") == 0
    found, _ = lines(capsys)
    assert found["JupyterLab"].startswith("warn JupyterLab:") and "403 without a token" in found["JupyterLab"]


class _Lab(http.server.BaseHTTPRequestHandler):
    """/api/status as JupyterLab answers it: 200 with the token, 403 without."""
    token = "a" * 48

    def do_GET(self):
        ok = self.path == "/api/status" and self.headers.get("Authorization") == f"token {self.token}"
        self.send_response(200 if ok else 403)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_a_real_server_through_the_real_probe(capsys):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Lab)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        probe = doctor.Probe()
        assert doctor.check_jupyter(probe, url + "/lab", _Lab.token).status == doctor.OK
        bad = doctor.check_jupyter(probe, url, "b" * 48)
        assert bad.status == doctor.FAIL and "refuses the token" in bad.message
    finally:
        server.shutdown()
        server.server_close()
    closed = doctor.check_jupyter(doctor.Probe(), url, _Lab.token)
    assert closed.status == doctor.FAIL and "connection refused" in closed.message, closed


def test_it_runs_here_on_cpu_and_says_what_it_cannot_check(capsys):
    """The real machine, through the fsdp-mini command: no GPU here."""
    code = main(["doctor"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 8, out
    assert all(re.match(r"(ok|warn|FAIL|skip) +\S", line) for line in out[:-1]), out
    if not any(line.startswith("ok   GPUs") for line in out):
        assert any(line.startswith("skip NCCL: cannot be checked without GPUs") for line in out)
    assert code == (1 if any(line.startswith("FAIL") for line in out) else 0)


@pytest.mark.parametrize("args, message", [
    (["--gpus", "-1"], "--gpus must be from 0 to 64, got -1"),
    (["--url", "localhost:8888"], "--url must start with http:// or https://")])
def test_bad_arguments_are_one_line_with_exit_status_2(capsys, args, message):
    assert main(["doctor", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fsdp-mini doctor: error: ") and message in err and err.count("\n") == 1


def test_doctor_explains_itself_with_help():
    proc = subprocess.run([sys.executable, "-m", "fsdp_mini.jobs.cli", "doctor", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: fsdp-mini doctor"), proc.stderr
    for flag in ("--gpus", "--url", "--token"):
        assert flag in proc.stdout


def test_the_doctor_is_split_by_concept_each_file_under_300_lines():
    """The house rule (files under 300 lines): the command, its checks, what they read."""
    from pathlib import Path
    jobs = Path(doctor.__file__).parent
    files = sorted(jobs.glob("doctor*.py"))
    assert [f.name for f in files] == ["doctor.py", "doctor_checks.py", "doctor_probe.py"]
    for f in files:
        assert len(f.read_text(encoding="utf-8").splitlines()) < 300, f.name
    checks = (jobs / "doctor_checks.py").read_text(encoding="utf-8")
    for reads in ("import subprocess", "import socket", "urllib.request", "import shutil"):
        assert reads not in checks, f"the checks read the machine only through the Probe: {reads}"
    assert doctor.Probe.__module__ == "fsdp_mini.jobs.doctor_probe"
    assert doctor.check_gpus.__module__ == "fsdp_mini.jobs.doctor_checks"
