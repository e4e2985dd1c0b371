"""The scripts take no input for what it is not (issue 26): docker/multinode/torchrun.sh and
slurm.sbatch, slides/build.py --compare-json, docker/entrypoint.sh.

Each bad input must give one line on stderr naming the input, what it holds and what it should
hold, exit status 2, and must stop before the command behind the script starts: ``torchrun``,
``srun`` and ``jupyter`` are stand-ins on PATH that record their arguments (and, for some, their
environment), so a bad input leaves no record, and a good one leaves the expected arguments.
Nothing here starts a real torchrun, srun or JupyterLab; every test takes seconds.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MULTINODE = ROOT / "docker" / "multinode"
TORCHRUN_SH = MULTINODE / "torchrun.sh"
SLURM_SBATCH = MULTINODE / "slurm.sbatch"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
sys.path.insert(0, str(ROOT / "slides"))

import build  # noqa: E402
import compare_report  # noqa: E402
import kit_run  # noqa: E402

# A stand-in: its arguments, one a line, in $RECORD/<name>.args; the variables the scripts pass on
# in $RECORD/<name>.env; then exit 0 (nothing is started).
STANDIN = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD/{name}.args"
env | grep -E '^(RDZV_|NNODES=|GPUS_PER_NODE=|MAX_RESTARTS=|NCCL_|GLOO_|OMP_NUM_THREADS=|\
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=|SRUN_CPUS_PER_TASK=)' | sort > "$RECORD/{name}.env"
"""
SCONTROL = """#!/bin/sh
printf '%s' "$FAKE_HOSTS"
"""
NVIDIA_SMI = """#!/bin/sh
i=0
while [ "$i" -lt "$FAKE_GPUS" ]; do echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; i=$((i + 1)); done
"""


@pytest.fixture
def standins(tmp_path):
    """(bin folder to put first on PATH, record folder) with torchrun, srun, jupyter,
    scontrol and nvidia-smi stand-ins."""
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    for name in ("torchrun", "srun", "jupyter"):
        (bin_dir / name).write_text(STANDIN.format(name=name))
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir, record


def _base_env(bin_dir: Path, record: Path, home: Path) -> dict:
    """A clean environment (none of the scripts' variables inherited) with the stand-ins first."""
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(home),
            "RECORD": str(record), "FAKE_GPUS": "0"}


def _run(cmd: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=30)


def _refused(done: subprocess.CompletedProcess, record: Path, *expected: str) -> str:
    """Exit status 2, nothing on stdout, one line on stderr holding every ``expected``, and no
    stand-in called."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", done.stdout
    assert done.stderr.endswith("\n") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    for text in expected:
        assert text in done.stderr, (text, done.stderr)
    assert sorted(p.name for p in record.iterdir()) == [], "a stand-in was started"
    return done.stderr


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


# -- docker/multinode/torchrun.sh ---------------------------------------------------------------

def _torchrun_env(standins, tmp_path, **extra) -> dict:
    bin_dir, record = standins
    env = _base_env(bin_dir, record, tmp_path)
    env.update(RDZV_HOST="127.0.0.1", RDZV_ID="test-job", NNODES="2", GPUS_PER_NODE="2")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _torchrun_argv(nnodes="2", gpus="2", endpoint="127.0.0.1:29400", restarts="3",
                   local=None, ckpt="checkpoints/test-job") -> list[str]:
    return ["--nnodes", nnodes, "--nproc-per-node", gpus, "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "test-job", "--max-restarts", restarts,
            *(["--local-addr", local] if local else []),
            str(MULTINODE / "train.py"), "--shard-size", gpus, "--checkpoint", ckpt,
            "--steps", "3"]


NNODES_WANT = "give a number of nodes (2) or a range MIN:MAX (1:4)"
GPUS_WANT = "give a whole number of 1 or more (the ranks on this node, one per GPU"
PORT_WANT = "give a TCP port from 1 to 65535"
HOST_WANT = "give a host name (node-a), an IPv4 address (10.0.0.1) or an IPv6 one"
NO_PORT = "give the address alone, without a port"

TORCHRUN_SH_REFUSES = [
    # the issue's cases
    ("NNODES", "4:2", ["NNODES is '4:2': in a range MIN:MAX, MIN must not exceed MAX",
                       "did you mean 2:4?"]),
    ("GPUS_PER_NODE", "two", [f"GPUS_PER_NODE is 'two': {GPUS_WANT}"]),
    ("GPUS_PER_NODE", "0", [f"GPUS_PER_NODE is '0': {GPUS_WANT}"]),
    # more like them
    *[("NNODES", v, [f"NNODES is '{v}': {NNODES_WANT}"])
      for v in ("0", "a:b", "-1", "1.5", "", "two", " 2", "2:", ":4", "0:4", "2:0", "1:2:3",
                "9999999999")],
    *[("GPUS_PER_NODE", v, [f"GPUS_PER_NODE is '{v}': {GPUS_WANT}"])
      for v in ("-1", "1.5", "", "auto", "2 ", "gpu")],
    *[("MAX_RESTARTS", v, [f"MAX_RESTARTS is '{v}': give 0 or more"])
      for v in ("-1", "x", "", "1e3", "2.0")],
    *[("RDZV_PORT", v, [f"RDZV_PORT is '{v}': {PORT_WANT}"])
      for v in ("0", "65536", "http", "", "-5", "29400.0", "99999999999")],
    *[("RDZV_HOST", v, [f"RDZV_HOST is '{v}': {NO_PORT}"])
      for v in ("10.0.0.1:29400", "node-a:", "[fd00::1]:29400")],
    *[("RDZV_HOST", v, [f"RDZV_HOST is '{v}': {HOST_WANT}"])
      for v in ("node a", "-x", "http://node-a", "node/a")],
    *[("RDZV_ID", v, [f"RDZV_ID is '{v}': give letters, digits"])
      for v in ("a/b", "..", "-x", "my run", ".hidden")],
    ("CKPT_DIR", "", ["CKPT_DIR is '': give a folder every node sees"]),
    ("CKPT_DIR", "-ckpt", ["CKPT_DIR is '-ckpt': give a folder every node sees"]),
    ("CKPT_DIR", "a\nb", ["CKPT_DIR is $'a\\nb': give a folder every node sees"]),
    ("LOCAL_ADDR", "", ["LOCAL_ADDR is '': give this node's address"]),
    ("LOCAL_ADDR", "10.0.0.2:1234", [f"LOCAL_ADDR is '10.0.0.2:1234': {NO_PORT}"]),
    *[("OMP_NUM_THREADS", v, [f"OMP_NUM_THREADS is '{v}': give a whole number of 1 or more"])
      for v in ("0", "many", "")],
    *[("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", v,
       [f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE is '{v}': give 1"]) for v in ("yes", "2", "")],
    ("NCCL_SOCKET_IFNAME", "eth0 eth1", ["NCCL_SOCKET_IFNAME is 'eth0 eth1': give network"]),
    ("NCCL_SOCKET_IFNAME", "^docker0,lo", ["GLOO_SOCKET_IFNAME is unset and NCCL_SOCKET_IFNAME "
                                           "is '^docker0,lo', which excludes interfaces"]),
    ("GLOO_SOCKET_IFNAME", "^lo", ["GLOO_SOCKET_IFNAME is '^lo': give network interfaces"]),
]


@pytest.mark.parametrize("name,value,expected", TORCHRUN_SH_REFUSES,
                         ids=[f"{n}={v!r}" for n, v, _ in TORCHRUN_SH_REFUSES])
def test_torchrun_sh_refuses_a_bad_variable_before_torchrun(standins, tmp_path, name, value,
                                                            expected):
    env = _torchrun_env(standins, tmp_path, **{name: value})
    done = _run([str(TORCHRUN_SH), "--steps", "3"], env, tmp_path)
    line = _refused(done, standins[1], *expected)
    assert line.startswith(f"torchrun.sh: {name} is ") or line.startswith("torchrun.sh: GLOO")


@pytest.mark.parametrize("extra,expected", [
    ({"RDZV_HOST": None}, "torchrun.sh: set RDZV_HOST to an address of one node that every node "
                          "reaches\n"),
    ({"RDZV_HOST": ""}, "torchrun.sh: set RDZV_HOST to an address of one node that every node "
                        "reaches\n"),
    ({"RDZV_HOST": None, "MASTER_ADDR": "10.0.0.1"}, "reaches (not MASTER_ADDR: that is for a "
                                                     "static launch, this script meets in a "
                                                     "rendezvous)\n"),
    ({"RDZV_ID": None}, "torchrun.sh: set RDZV_ID to an id of this job"),
])
def test_torchrun_sh_says_which_required_variable_is_missing(standins, tmp_path, extra, expected):
    done = _run([str(TORCHRUN_SH), "--steps", "3"], _torchrun_env(standins, tmp_path, **extra),
                tmp_path)
    _refused(done, standins[1], expected)


@pytest.mark.skipif(not Path("/sys/class/net/lo").exists(), reason="no /sys/class/net here")
@pytest.mark.parametrize("extra,expected", [
    ({"GLOO_SOCKET_IFNAME": "nosuchif0"},
     "GLOO_SOCKET_IFNAME is 'nosuchif0': this node has no interface 'nosuchif0'"),
    ({"GLOO_SOCKET_IFNAME": "lo,nosuchif0"}, "this node has no interface 'nosuchif0'"),
    # Note: NCCL takes a prefix (lo matches lo, "l" would too); gloo the whole name
    ({"NCCL_SOCKET_IFNAME": "nosuchif"},
     "GLOO_SOCKET_IFNAME is 'nosuchif' (from NCCL_SOCKET_IFNAME): this node has no interface"),
])
def test_torchrun_sh_refuses_a_gloo_interface_this_node_lacks(standins, tmp_path, extra,
                                                              expected):
    done = _run([str(TORCHRUN_SH), "--steps", "3"], _torchrun_env(standins, tmp_path, **extra),
                tmp_path)
    line = _refused(done, standins[1], expected)
    assert re.search(r"\(it has: [^)]*\blo\b", line), line  # the names it does have


@pytest.mark.parametrize("extra,argv", [
    ({}, _torchrun_argv()),
    ({"NNODES": "1:4"}, _torchrun_argv(nnodes="1:4")),
    ({"NNODES": "3:3"}, _torchrun_argv(nnodes="3:3")),
    ({"NNODES": "02:010"}, _torchrun_argv(nnodes="2:10")),  # Note: leading zeros are decimal
    ({"NNODES": None}, _torchrun_argv(nnodes="2")),
    ({"GPUS_PER_NODE": "08"}, _torchrun_argv(gpus="8")),
    ({"MAX_RESTARTS": "0"}, _torchrun_argv(restarts="0")),
    ({"RDZV_PORT": "65535"}, _torchrun_argv(endpoint="127.0.0.1:65535")),
    ({"RDZV_HOST": "node-a.cluster.local"}, _torchrun_argv(endpoint="node-a.cluster.local:29400")),
    ({"RDZV_HOST": "fd00::1"}, _torchrun_argv(endpoint="fd00::1:29400")),
    ({"RDZV_HOST": "[fd00::1]"}, _torchrun_argv(endpoint="[fd00::1]:29400")),
    ({"LOCAL_ADDR": "10.0.0.2"}, _torchrun_argv(local="10.0.0.2")),
    ({"CKPT_DIR": "/shared/my ckpt"}, _torchrun_argv(ckpt="/shared/my ckpt")),
    ({"GPUS_PER_NODE": None, "FAKE_GPUS": "3"}, _torchrun_argv(gpus="3")),  # nvidia-smi's count
    ({"GPUS_PER_NODE": None}, _torchrun_argv(gpus="2")),  # no GPU: 2 CPU ranks
], ids=lambda x: json.dumps(x) if isinstance(x, dict) else None)
def test_torchrun_sh_passes_good_variables_to_torchrun(standins, tmp_path, extra, argv):
    env = _torchrun_env(standins, tmp_path, **extra)
    done = _run([str(TORCHRUN_SH), "--steps", "3"], env, tmp_path)
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr)
    assert _lines(standins[1] / "torchrun.args") == argv


@pytest.mark.parametrize("extra,expected_env", [
    ({}, ["OMP_NUM_THREADS=1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]),
    ({"NCCL_SOCKET_IFNAME": "lo"}, ["GLOO_SOCKET_IFNAME=lo", "NCCL_SOCKET_IFNAME=lo"]),
    ({"NCCL_SOCKET_IFNAME": "=lo"}, ["GLOO_SOCKET_IFNAME=lo", "NCCL_SOCKET_IFNAME==lo"]),
    ({"NCCL_SOCKET_IFNAME": "^docker0", "GLOO_SOCKET_IFNAME": "lo"},
     ["GLOO_SOCKET_IFNAME=lo", "NCCL_SOCKET_IFNAME=^docker0"]),
    ({"OMP_NUM_THREADS": "4", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"},
     ["OMP_NUM_THREADS=4", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0"]),
], ids=lambda x: json.dumps(x) if isinstance(x, dict) else None)
def test_torchrun_sh_passes_good_interfaces_and_settings_on(standins, tmp_path, extra,
                                                            expected_env):
    if any("lo" in v for v in extra.values()) and not Path("/sys/class/net/lo").exists():
        pytest.skip("no /sys/class/net/lo here")
    done = _run([str(TORCHRUN_SH), "--steps", "3"], _torchrun_env(standins, tmp_path, **extra),
                tmp_path)
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr)
    env = _lines(standins[1] / "torchrun.env")
    assert all(e in env for e in expected_env), env
    assert _lines(standins[1] / "torchrun.args") == _torchrun_argv()


# -- docker/multinode/slurm.sbatch ---------------------------------------------------------------

def _slurm_env(standins, tmp_path, **extra) -> dict:
    bin_dir, record = standins
    env = _base_env(bin_dir, record, tmp_path)
    env.update(SLURM_JOB_ID="7001234", SLURM_JOB_NODELIST="node-a,node-b",
               SLURM_JOB_NUM_NODES="2", SLURM_GPUS_PER_NODE="a100:4", SLURM_CPUS_PER_TASK="16",
               SLURM_SUBMIT_DIR=str(ROOT), FAKE_HOSTS="node-a\nnode-b\n")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


SLURM_REFUSES = [
    ({"SLURM_JOB_ID": "abc"}, "slurm.sbatch: SLURM_JOB_ID is 'abc': SLURM's job id is a whole"),
    ({"SLURM_JOB_ID": "12.5"}, "slurm.sbatch: SLURM_JOB_ID is '12.5'"),
    ({"SLURM_JOB_NUM_NODES": "0"}, "slurm.sbatch: SLURM_JOB_NUM_NODES is '0': SLURM's node count"),
    ({"SLURM_JOB_NUM_NODES": "two"}, "slurm.sbatch: SLURM_JOB_NUM_NODES is 'two'"),
    ({"SLURM_JOB_NUM_NODES": None}, "slurm.sbatch: SLURM_JOB_NUM_NODES is ''"),
    ({"SLURM_JOB_NODELIST": ""}, "slurm.sbatch: SLURM_JOB_NODELIST is empty"),
    ({"FAKE_HOSTS": ""}, "slurm.sbatch: SLURM_JOB_NODELIST is 'node-a,node-b': scontrol show "
                         "hostnames gives no host for it"),
    ({"SLURM_GPUS_PER_NODE": "a100:0"}, "slurm.sbatch: SLURM_GPUS_PER_NODE is 'a100:0': "
                                        "slurm.sbatch reads one count of GPUs of 1 or more"),
    ({"SLURM_GPUS_PER_NODE": "a100:4,v100:2"}, "SLURM_GPUS_PER_NODE is 'a100:4,v100:2'"),
    ({"SLURM_GPUS_PER_NODE": "gpu:many"}, "SLURM_GPUS_PER_NODE is 'gpu:many'"),
    ({"SLURM_CPUS_PER_TASK": "0"}, "slurm.sbatch: SLURM_CPUS_PER_TASK is '0'"),
    ({"SLURM_SUBMIT_DIR": "/nonexistent"}, "slurm.sbatch: SLURM_SUBMIT_DIR is '/nonexistent': "
                                          "it holds no docker/multinode/torchrun.sh"),
    # torchrun.sh's own checks, run once before srun
    ({"RDZV_PORT": "70000"}, f"torchrun.sh: RDZV_PORT is '70000': {PORT_WANT}"),
    ({"RDZV_PORT": ""}, f"torchrun.sh: RDZV_PORT is '': {PORT_WANT}"),
    ({"GPUS_PER_NODE": "two"}, f"torchrun.sh: GPUS_PER_NODE is 'two': {GPUS_WANT}"),
    ({"GPUS_PER_NODE": ""}, f"torchrun.sh: GPUS_PER_NODE is '': {GPUS_WANT}"),
    ({"MAX_RESTARTS": "x"}, "torchrun.sh: MAX_RESTARTS is 'x': give 0 or more"),
    ({"CKPT_DIR": "-c"}, "torchrun.sh: CKPT_DIR is '-c'"),
]


@pytest.mark.parametrize("extra,expected", SLURM_REFUSES,
                         ids=[json.dumps(e) for e, _ in SLURM_REFUSES])
def test_slurm_sbatch_refuses_a_bad_variable_before_srun(standins, tmp_path, extra, expected):
    done = _run(["bash", str(SLURM_SBATCH), "--steps", "3"],
                _slurm_env(standins, tmp_path, **extra), tmp_path)
    _refused(done, standins[1], expected)


@pytest.mark.parametrize("extra,gpus,port", [
    ({}, "4", "29634"),                                # a100:4; 29400 + 7001234 % 1000
    ({"SLURM_GPUS_PER_NODE": "8"}, "8", "29634"),
    ({"SLURM_GPUS_PER_NODE": "gpu:a100:2"}, "2", "29634"),
    ({"GPUS_PER_NODE": "3"}, "3", "29634"),            # the user's, over SLURM's
    ({"RDZV_PORT": "31000"}, "4", "31000"),
    ({"SLURM_JOB_ID": "7000001"}, "4", "29401"),
])
def test_slurm_sbatch_passes_good_variables_to_srun(standins, tmp_path, extra, gpus, port):
    env = _slurm_env(standins, tmp_path, **extra)
    done = _run(["bash", str(SLURM_SBATCH), "--steps", "3"], env, tmp_path)
    record = standins[1]
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr)
    assert _lines(record / "srun.args") == ["--nodes", "2", "--ntasks-per-node=1",
                                            "--kill-on-bad-exit=1", str(TORCHRUN_SH),
                                            "--steps", "3"]
    assert _lines(record / "srun.env") == [
        f"GPUS_PER_NODE={gpus}", "NNODES=2", "RDZV_HOST=node-a", f"RDZV_ID={env['SLURM_JOB_ID']}",
        f"RDZV_PORT={port}", "SRUN_CPUS_PER_TASK=16"]
    # Note: the checks before srun run torchrun.sh, which stops before torchrun
    assert not (record / "torchrun.args").exists()
    assert f"rendezvous {env['SLURM_JOB_ID']} on node-a:{port}; {gpus} GPUs per node" in done.stdout


# -- slides/build.py --compare-json --------------------------------------------------------------

def _report(world_size: int = 2) -> dict:
    """A report as `fsdp-mini compare --json` writes it, with made-up numbers."""
    def rank(i, scale):
        return {"rank": i, "peak_bytes": 9_000_000 * scale,
                "peak_by_category": {"params": 4_000_000 * scale, "gathered_params": 0,
                                     "grads": 2_000_000, "optimizer_state": 2_000_000,
                                     "comm_buffers": 0, "activations": 1_000_000},
                "persistent_bytes": 8_000_000 * scale, "sent_bytes_per_step": 2_000_000.0,
                "step_seconds": 0.05, "final_loss": 4.1, "losses": [4.2, 4.1]}
    strategies = {}
    for n, name in enumerate(kit_run.STRATEGIES):
        ranks = [rank(0, 1)] if name == "single" else [rank(i, 1 + n) for i in range(world_size)]
        strategies[name] = {"theory": {"persistent_bytes": 8_000_000, "sent_bytes_per_step": 2e6},
                            "ranks": ranks}
    return {"world_size": world_size, "params": 1_000_000, "strategies": strategies,
            "link": None, "run": {"backend": "nccl", "device": "NVIDIA H200", "torch": "2.13.0",
                                  "model": "default", "steps": 8, "global_batch": 8}}


def _ddp_rank0(report: dict) -> dict:
    return report["strategies"]["ddp"]["ranks"][0]


def _set(report, path: list, value):
    target = report
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return report


def _delete(report, path: list):
    target = report
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return report


D0 = ["strategies", "ddp", "ranks", 0]
COMPARE_JSON_REFUSES = [
    # (what the file holds: a report changed, or raw text) -> what the message must say
    ("not json", "not JSON: Expecting value at line 1 column 1"),
    ('{"world_size": 2,', "not JSON: Expecting property name enclosed in double quotes at line 1 "
                          "column 18"),
    ("{\n  \"world_size\": 2\n  \"params\": 1\n}", "not JSON: Expecting ',' delimiter at line 3 "
                                                   "column 3"),
    ("", "not JSON: Expecting value at line 1 column 1"),
    ("[]", "an array (a list) where an object is expected"),
    ('[{"world_size": 2}]', "an array (a list) where an object is expected"),
    ("3", "a number where an object is expected"),
    ("null", "null where an object is expected"),
    ('"report"', "a string where an object is expected"),
    ("true", "a boolean where an object is expected"),
    (lambda r: _delete(r, ["world_size"]), "field world_size is missing"),
    (lambda r: _set(r, ["world_size"], "4"),
     'field world_size must be a whole number >= 2 (the ranks it was measured on'),
    (lambda r: _set(r, ["world_size"], True), "field world_size must be a whole number >= 2"),
    (lambda r: _set(r, ["world_size"], 1.5), "got 1.5 (a number)"),
    (lambda r: _set(r, ["world_size"], 0), "field world_size must be a whole number >= 2"),
    (lambda r: _set(r, ["world_size"], 1), "record it with --world-size 2 or more), got 1"),
    (lambda r: _set(r, ["world_size"], -2), "got -2 (a number)"),
    (lambda r: _set(r, ["world_size"], None), "got null"),
    (lambda r: _set(r, ["world_size"], math.nan), "got NaN (a number)"),
    (lambda r: _set(r, ["world_size"], 4), "field strategies.ddp.ranks holds 2 rank(s), but "
                                           "world_size is 4: it should hold 4"),
    (lambda r: _delete(r, ["params"]), "field params is missing"),
    (lambda r: _set(r, ["params"], "1M"), 'field params must be a whole number >= 1'),
    (lambda r: _delete(r, ["strategies"]), "field strategies is missing"),
    (lambda r: _set(r, ["strategies"], []), "field strategies must be an object"),
    (lambda r: _delete(r, ["strategies", "fsdp"]), "fsdp missing (record it without "
                                                   "--strategies)"),
    (lambda r: _set(r, ["strategies", "ddp"], 3), "field strategies.ddp must be an object"),
    (lambda r: _delete(r, ["strategies", "ddp", "theory"]),
     "field strategies.ddp.theory is missing"),
    (lambda r: _set(r, ["strategies", "zero1", "theory", "sent_bytes_per_step"], "2e6"),
     'field strategies.zero1.theory.sent_bytes_per_step must be a number >= 0'),
    (lambda r: _set(r, ["strategies", "ddp", "ranks"], []),
     "field strategies.ddp.ranks holds 0 rank(s)"),
    (lambda r: _set(r, ["strategies", "ddp", "ranks"], {"0": {}}),
     "field strategies.ddp.ranks must be an array"),
    (lambda r: _set(r, D0, "rank 0"), "field strategies.ddp.ranks[0] must be an object"),
    (lambda r: _set(r, D0 + ["peak_bytes"], "12"),
     'field strategies.ddp.ranks[0].peak_bytes must be a number >= 0 (bytes at the rank\'s '
     'peak), got "12" (a string)'),
    (lambda r: _set(r, D0 + ["peak_bytes"], -1), "peak_bytes must be a number >= 0"),
    (lambda r: _set(r, D0 + ["peak_bytes"], math.inf), "got Infinity (a number)"),
    (lambda r: _set(r, D0 + ["peak_bytes"], 10 ** 30), "peak_bytes must be a number >= 0"),
    (lambda r: _delete(r, D0 + ["step_seconds"]),
     "field strategies.ddp.ranks[0].step_seconds is missing"),
    (lambda r: _set(r, D0 + ["final_loss"], None),
     "field strategies.ddp.ranks[0].final_loss must be a number"),
    (lambda r: _set(r, D0 + ["peak_by_category"], [1, 2]),
     "field strategies.ddp.ranks[0].peak_by_category must be an object"),
    (lambda r: _set(r, D0 + ["peak_by_category", "activations"], "x"),
     "field strategies.ddp.ranks[0].peak_by_category.activations must be a number >= 0"),
    (lambda r: _set(r, D0 + ["sent_bytes_per_step"], 0),
     "field strategies.ddp.ranks[0].sent_bytes_per_step is 0; the decks divide by it"),
    (lambda r: _set(r, ["strategies", "fsdp", "ranks", 0, "persistent_bytes"], 0),
     "field strategies.fsdp.ranks[0].persistent_bytes is 0; the decks divide by it"),
    (lambda r: _set(r, ["run"], "cpu"), "field run must be an object (device, backend, torch) "
                                        "or null"),
    (lambda r: _set(r, ["run", "device"], 5), "field run.device must be a string"),
]


def _write_case(tmp_path: Path, case) -> str:
    """The case's file in tmp_path, as the relative path a user would type there."""
    text = case if isinstance(case, str) else json.dumps(case(_report()))
    (tmp_path / "gpu.json").write_text(text)
    return "gpu.json"


@pytest.fixture
def nothing_runs(monkeypatch):
    """A bad report must stop the build before npm, a run of the kit, or any output."""
    def refuse(*args, **kwargs):
        raise AssertionError("the build went on past a bad --compare-json")
    for name in ("ensure_reveal",):
        monkeypatch.setattr(build, name, refuse)
    for name in ("run_compare", "run_telemetry", "measure"):
        monkeypatch.setattr(kit_run, name, refuse)


@pytest.mark.parametrize("case,expected", COMPARE_JSON_REFUSES,
                         ids=[str(i) for i in range(len(COMPARE_JSON_REFUSES))])
def test_build_refuses_a_bad_compare_json_in_one_line(tmp_path, monkeypatch, capsys,
                                                      nothing_runs, case, expected):
    monkeypatch.chdir(tmp_path)
    path = _write_case(tmp_path, case)
    code = build.main(["--compare-json", path, "--out", "out", "--no-pdf"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith(f"slides: error: --compare-json {path}: "), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert expected in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make,expected", [
    (lambda p: None, "--compare-json gpu.json: cannot be read: No such file or directory"),
    (lambda p: (p / "gpu.json").mkdir(), "--compare-json gpu.json: cannot be read: Is a directory"),
    (lambda p: (p / "gpu.json").write_bytes(b"\xff\xfe{}"),
     "--compare-json gpu.json: not JSON: not UTF-8 text (byte 0 is 0xff)"),
    (lambda p: (p / "gpu.json").write_text("[" * 100_000 + "]" * 100_000),
     "--compare-json gpu.json: not a report: its JSON is nested too deeply"),
])
def test_build_refuses_a_compare_json_that_is_no_text_file(tmp_path, monkeypatch, capsys,
                                                           nothing_runs, make, expected):
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    code = build.main(["--compare-json", "gpu.json", "--out", "out", "--no-pdf"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), (code, out, err)
    assert err.startswith(f"slides: error: {expected}") and err.count("\n") == 1, err


def test_build_refuses_an_empty_compare_json_path(tmp_path, monkeypatch, capsys, nothing_runs):
    monkeypatch.chdir(tmp_path)
    code = build.main(["--compare-json", "", "--out", "out", "--no-pdf"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("slides: error: --compare-json '': give the path"), err


def test_build_py_as_a_command_prints_no_traceback(tmp_path):
    """The script itself, as a user runs it: a JSON list, one line, exit status 2."""
    (tmp_path / "gpu.json").write_text("[1, 2]")
    done = subprocess.run([sys.executable, str(ROOT / "slides" / "build.py"), "--compare-json",
                           "gpu.json", "--out", "out", "--no-pdf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr == ("slides: error: --compare-json gpu.json: an array (a list) where an "
                           "object is expected: the report `fsdp-mini compare --json FILE` "
                           "writes (world_size, params, strategies, run)\n"), done.stderr
    assert not (tmp_path / "out").exists()


def _leaves(report: dict):
    """The path of every field the build reads (the whole report but link, and run's other
    fields)."""
    yield ["world_size"]
    yield ["params"]
    for name, entry in report["strategies"].items():
        for key in entry["theory"]:
            yield ["strategies", name, "theory", key]
        for i, rank in enumerate(entry["ranks"]):
            for key in compare_report.RANK_FIELDS:
                yield ["strategies", name, "ranks", i, key]
            for key in rank["peak_by_category"]:
                yield ["strategies", name, "ranks", i, "peak_by_category", key]
    for key in compare_report.RUN_FIELDS:
        yield ["run", key]


def _dotted(path: list) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def test_every_field_the_build_reads_is_checked_for_its_type(tmp_path):
    """Each field, made the wrong type of JSON, is refused naming that field (a string where a
    number is read; a number where a string is)."""
    paths = list(_leaves(_report()))
    assert len(paths) > 100
    for path in paths:
        wrong = 5 if path[0] == "run" else "5"
        file = tmp_path / "gpu.json"
        file.write_text(json.dumps(_set(_report(), path, wrong)))
        with pytest.raises(kit_run.ReportError) as info:
            kit_run.read_report(str(file))
        assert f"--compare-json {file}: field {_dotted(path)} must be" in str(info.value), (
            path, str(info.value))


def test_a_good_report_is_read_whole_and_builds_its_numbers_and_figures(tmp_path):
    """What the checks let through is what the build can use: the numbers, the caption, the
    figures; a whole world_size written 2.0 is the count 2; run may be null; a category of
    memory left out counts as none (as the figures take it)."""
    from fsdp_mini import plots
    report = _report()
    report["world_size"] = 2.0
    del report["strategies"]["fsdp"]["ranks"][0]["peak_by_category"]["activations"]
    file = tmp_path / "gpu.json"
    file.write_text(json.dumps(report))
    read = kit_run.read_report(str(file))
    assert read["world_size"] == 2 and type(read["world_size"]) is int
    numbers = kit_run.report_numbers(read)
    assert numbers["world_size"] == "2" and numbers["ratio.activations_fsdp_ddp"] == "0.00×"
    # Note: no path of this machine on a slide (issue 28): the source named by what made it
    assert kit_run.describe(read, str(file)) == ("recorded with fsdp-mini compare --json: 2 ranks, "
                                                 "NVIDIA H200/nccl, torch 2.13.0")
    for draw in (plots.report_memory, plots.report_traffic):
        draw(read)
    report = _report()
    report["run"] = None
    del report["link"]
    file.write_text(json.dumps(report))
    read = kit_run.read_report(str(file))
    assert kit_run.describe(read, str(file)) == ("recorded with fsdp-mini compare --json: 2 ranks, "
                                                 "?/?, torch ?")
    assert kit_run.report_numbers(read)["fsdp.state"]


def test_the_made_up_report_is_shaped_as_compare_writes_it():
    """The tests' report has the fields of `fsdp-mini compare --json` (gather_report,
    RankResult), so that the checks above are checks of the real shape."""
    from dataclasses import fields

    from fsdp_mini.jobs.compare import RankResult, gather_report
    report = _report()
    assert set(report) == set(gather_report([], 2, 1))
    assert set(_ddp_rank0(report)) == {f.name for f in fields(RankResult)}
    assert set(report["strategies"]) == set(kit_run.STRATEGIES)


# -- docker/entrypoint.sh ------------------------------------------------------------------------

def _lab_env(standins, tmp_path, work: Path, **extra) -> dict:
    bin_dir, record = standins
    env = _base_env(bin_dir, record, tmp_path)
    env.update(FSDP_MINI_WORK=str(work), **extra)
    return env


@pytest.fixture
def work(tmp_path) -> Path:
    """The learners' folder, not empty (so the entrypoint copies no labs)."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "notes.md").write_text("mine\n")
    return folder


SECRET = "s3cr3tXYZ"
BAD_TOKENS = [
    (" ", "JUPYTER_TOKEN is only whitespace"),
    ("   ", "JUPYTER_TOKEN is only whitespace"),
    ("\t", "JUPYTER_TOKEN is only whitespace"),
    ("\n", "JUPYTER_TOKEN is only whitespace"),
    (f" {SECRET}", "JUPYTER_TOKEN starts or ends with whitespace"),
    (f"{SECRET} ", "JUPYTER_TOKEN starts or ends with whitespace"),
    (f"{SECRET}\n", "JUPYTER_TOKEN holds a control character"),
    (f"{SECRET[:4]}\n{SECRET[4:]}", "JUPYTER_TOKEN holds a control character"),
    (f"{SECRET[:4]}\t{SECRET[4:]}", "JUPYTER_TOKEN holds a control character"),
    (f"{SECRET}\x1b[0m", "JUPYTER_TOKEN holds a control character"),
    (f"{SECRET}\x7f", "JUPYTER_TOKEN holds a control character"),
]


@pytest.mark.parametrize("token,expected", BAD_TOKENS, ids=[repr(t) for t, _ in BAD_TOKENS])
def test_entrypoint_refuses_a_token_no_one_can_type(standins, tmp_path, token, expected):
    folder = tmp_path / "not-yet"  # Note: refused before anything: the folder is not made
    done = _run(["sh", str(ENTRYPOINT)], _lab_env(standins, tmp_path, folder,
                                                  JUPYTER_TOKEN=token), tmp_path)
    line = _refused(done, standins[1], f"fsdp-mini-lab: error: {expected}",
                    "e.g. -e JUPYTER_TOKEN=$(openssl rand -hex 24)")
    assert SECRET[:4] not in line and SECRET[4:] not in line, "the message shows the token"
    assert not folder.exists()


@pytest.mark.parametrize("port", ["0", "65536", "abc", "", "88 88", "-1", "8888.0", "123456"])
def test_entrypoint_refuses_a_bad_port(standins, tmp_path, port):
    folder = tmp_path / "not-yet"
    done = _run(["sh", str(ENTRYPOINT)], _lab_env(standins, tmp_path, folder,
                                                  JUPYTER_TOKEN="a-token", JUPYTER_PORT=port),
                tmp_path)
    _refused(done, standins[1], f"fsdp-mini-lab: error: JUPYTER_PORT is '{port}': give a TCP "
                                f"port from 1 to 65535")
    assert not folder.exists()


@pytest.mark.parametrize("token,extra,args,port", [
    ("a-token", {}, [], "8888"),
    ("0123456789abcdef" * 3, {"JUPYTER_PORT": "9999"}, [], "9999"),
    ("two words", {}, [], "8888"),        # Note: a blank inside is typed like any character
    ("tökén-ü", {}, [], "8888"),
    ("a-token", {}, ["--ServerApp.log_level=DEBUG"], "8888"),
])
def test_entrypoint_starts_jupyterlab_with_a_good_token(standins, tmp_path, work, token, extra,
                                                        args, port):
    env = _lab_env(standins, tmp_path, work, JUPYTER_TOKEN=token, **extra)
    done = _run(["sh", str(ENTRYPOINT), *args], env, tmp_path)
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr)
    assert _lines(standins[1] / "jupyter.args") == [
        "lab", "--no-browser", "--ip", "0.0.0.0", "--port", port, "--port-retries", "0",
        f"--ServerApp.root_dir={work}", *args]
    assert (work / "notes.md").read_text() == "mine\n"  # the learners' work, kept
