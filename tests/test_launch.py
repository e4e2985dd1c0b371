"""Tests for fsdp_mini.launch (fsdp_mini/launcher.py): results by rank, failure reports, timeouts, output, notebooks, cleanup.

Every test also checks (autouse fixture) that no child process of pytest is left behind.
How launch stops ranks and explains odd failures: test_launch_faults.py.
"""
import _thread
import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
import torch

from fsdp_mini.launcher import LaunchError, LaunchTimeoutError, launch, run_with_torchrun

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)
sys.path.insert(0, TESTS_DIR)
from helpers import notebook_kernel  # noqa: E402
from launch_helpers import workers  # noqa: E402  (importable, so pickled by reference)

LOCK_NAME = ".launch.lock"  # the file that marks a log_dir in use (fsdp_mini.launcher.files)


# ---------------------------------------------------------------- no process left behind
def _children(pid):
    """Child pids of pid (zombies included: a child not yet reaped is still left behind)."""
    kids = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                kids += [int(k) for k in f.read().split()]
        except FileNotFoundError:
            pass
    return sorted(set(kids))


def _describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"{pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid}: ?"


def _is_zygote(pid):
    return "fsdp_mini.launcher.rank_entry --zygote" in _describe(pid)


def _ours(pid):
    """Children of pid; the warm starter (fsdp_mini/launcher/warm.py), which is meant to outlive
    launches, is left out, but its children (the ranks it forked) count."""
    return {k for c in _children(pid) for k in (_children(c) if _is_zygote(c) else [c])}


@pytest.fixture(autouse=True)
def no_leftover_processes():
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc to check for leftover processes")
    before = _ours(os.getpid())
    yield
    deadline = time.monotonic() + 5.0  # a Jupyter kernel may take a moment to be reaped
    while (left := _ours(os.getpid()) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, "processes left behind: " + "; ".join(map(_describe, sorted(left)))


@pytest.fixture
def own_tempdir(tmp_path, monkeypatch):
    """Make launch's temporary folders land in tmp_path, to see whether they are removed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.fixture
def no_process_may_start(monkeypatch):
    """Any attempt to start a process fails the test (and starts nothing, even on buggy code)."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")
    monkeypatch.setattr(subprocess, "Popen", refuse)


# ---------------------------------------------------------------- results
def test_results_by_rank_with_tensors_and_output(tmp_path, capsys):
    results = launch(workers.all_reduce_rank, 3, 2.0, log_dir=tmp_path)
    assert [r["rank"] for r in results] == [0, 1, 2]
    for r in results:
        assert r["world_size"] == 3 and r["env_rank"] == r["rank"] and r["threads"] == 1
        assert torch.equal(r["sum"], torch.full((4,), 12.0))  # (1 + 2 + 3) * 2
    # rank 0's output (Python and file-descriptor level) is echoed; the others' stays in their logs
    out = capsys.readouterr().out
    assert "hello from rank 0" in out and "fd-level stderr of rank 0" in out
    assert "rank 1" not in out and "rank 2" not in out
    log1 = (tmp_path / "rank1.log").read_text()
    assert "hello from rank 1" in log1 and "fd-level stderr of rank 1" in log1
    assert "Warning" not in log1, log1  # e.g. runpy: fsdp_mini.launcher.rank_entry imported twice
    assert "hello from rank 0" in (tmp_path / "rank0.log").read_text()
    assert not list(tmp_path.glob("*.result"))  # logs kept, results removed


def test_two_launches_in_a_row_world_size_one_then_two(own_tempdir):
    [result] = launch(workers.all_reduce_rank, 1, 5.0)
    assert torch.equal(result["sum"], torch.full((4,), 5.0))
    # a fresh store on a fresh port: re-running a notebook cell works
    assert launch(workers.read_env, 2, "FSDP_MINI_TEST", env={"FSDP_MINI_TEST": "yes"}) == ["yes", "yes"]
    assert os.listdir(own_tempdir) == []  # temporary folders are removed after success


# ---------------------------------------------------------------- failures
def test_raising_rank_is_named_not_its_peers(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch(workers.fail_on, 3, 1, log_dir=tmp_path, timeout=30)
    err = info.value
    assert (err.rank, err.exc_type) == (1, "ValueError")
    assert err.message == "rank 1 exploded on purpose"
    assert "in fail_on" in err.traceback and 'raise ValueError(f"rank {rank} exploded' in err.traceback
    text = str(err)
    assert text.startswith("rank 1 failed first: ValueError: rank 1 exploded on purpose")
    assert "rank 1 starting" in text  # the tail of rank 1's log
    assert "closed by peer" not in text and "reset by peer" not in text
    assert err.log_dir == str(tmp_path) and str(tmp_path) in text
    assert "exploded" in (tmp_path / "rank1.log").read_text()
    assert not (tmp_path / LOCK_NAME).exists()  # the log_dir is free again after a failure


@pytest.mark.parametrize("how, expected", [("sigkill", "rank 1 was killed by signal SIGKILL"),
                                           ("exit", "rank 1 exited with code 3")])
def test_rank_dying_without_exception_is_named(tmp_path, how, expected):
    with pytest.raises(LaunchError) as info:
        launch(workers.die_on, 2, 1, how, log_dir=tmp_path, timeout=30)
    assert info.value.rank == 1
    assert expected in str(info.value) and expected in info.value.message
    assert not isinstance(info.value, LaunchTimeoutError)


@pytest.mark.slow
def test_hung_rank_times_out(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch(workers.hang_on, 2, 1, timeout=3, log_dir=tmp_path)
    elapsed = time.monotonic() - start
    assert elapsed < 3 + 10, elapsed
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, LaunchError)
    assert err.rank == 1
    text = str(err)
    assert "rank 0 timed out after 3 s waiting in a collective" in text
    assert "rank 1 still running" in text
    assert "sleep_forever" in text  # the stuck rank's Python stack, dumped when it was stopped


def test_rank_stuck_outside_collectives_times_out(tmp_path):
    """Rank 1 sleeps (uses no CPU) after rank 0 returned: blocked, stopped after `timeout`."""
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch(workers.straggle, 2, timeout=2, log_dir=tmp_path)
    assert time.monotonic() - start < 2 + 10
    text = str(info.value)
    assert text.startswith("rank 1 used no CPU for 2 s after rank 0 returned: it is blocked waiting "
                           "for something that will not come"), text
    assert "in sleep_forever" in text  # its Python stack, dumped when it was stopped


def test_keyboard_interrupt_stops_ranks(tmp_path):
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(workers.sleep_forever, 2, log_dir=tmp_path)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 10
    assert not (tmp_path / LOCK_NAME).exists()


def test_ranks_die_when_the_caller_is_killed(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{REPO_DIR!r}, {TESTS_DIR!r}]
        from fsdp_mini.launcher import launch
        from launch_helpers.workers import record_pid_and_sleep
        launch(record_pid_and_sleep, 1, {str(tmp_path)!r}, timeout=60, log_dir={str(tmp_path / "logs")!r})
    """)
    caller = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("*.pid")):
            assert caller.poll() is None and time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
        pids += [_parent(p) for p in pids if _parent(p) != caller.pid]  # the warm starter
    finally:
        caller.kill()
        caller.wait()
    deadline = time.monotonic() + 5
    while (alive := [p for p in pids if _is_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"ranks outlived their caller: {alive}"
    # the killed launch's files are still known as the kit's (by its list): the next one there
    # removes them, and nothing else is left
    assert launch(workers.sleep_then_return, 1, 0.0, log_dir=tmp_path / "logs") == [0]
    assert sorted(os.listdir(tmp_path / "logs")) == [KIT_LIST, "config.json", "rank0.log"]


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _is_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------- bad input: fails before any process
@pytest.mark.parametrize("world_size", [0, -1, 2.0, "2", True])
def test_bad_world_size(world_size):
    with pytest.raises((ValueError, TypeError), match=r"world_size must be an int >= 1") as info:
        launch(workers.all_reduce_rank, world_size)
    assert repr(world_size) in str(info.value) or str(world_size) in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_nccl_without_enough_gpus(monkeypatch):
    with pytest.raises(ValueError, match=r"needs GPUs, one per rank, and no CUDA GPU is visible "
                                         r"here.*backend=\"gloo\" to run the ranks on the CPU"):
        launch(workers.all_reduce_rank, 2, backend="nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a box with one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"world_size=2 but only 1 CUDA device\(s\).*"
                                         r"backend=\"gloo\" \(CPU\) or a world_size <= 1"):
        launch(workers.all_reduce_rank, 2, backend="nccl")


@pytest.mark.parametrize("kwargs, match", [({"backend": "mpi"}, "backend must be"),
                                           ({"timeout": 0}, "timeout must be a positive"),
                                           ({"timeout": -3}, "timeout must be a positive")])
def test_bad_backend_or_timeout(kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch(workers.all_reduce_rank, 2, **kwargs)


TIMEOUT_RANGE = r"timeout must be a positive number of seconds, from 1 to 604800 \(one week\).*Got "
DEADLINE = r"deadline must be None \(no limit\) or a finite number of seconds > 0 .*got "


@pytest.mark.parametrize("kwargs, match", [
    ({"timeout": float("inf")}, TIMEOUT_RANGE + "inf"),
    ({"timeout": float("nan")}, TIMEOUT_RANGE + "nan"),
    ({"timeout": 1e-9}, TIMEOUT_RANGE + "1e-09"),
    ({"timeout": 0.5}, TIMEOUT_RANGE + "0.5"),
    ({"timeout": 1e10}, TIMEOUT_RANGE + "10000000000.0"),
    ({"deadline": 0}, DEADLINE + "0"),
    ({"deadline": -5}, DEADLINE + "-5"),
    ({"deadline": float("inf")}, DEADLINE + "inf"),
    ({"deadline": float("nan")}, DEADLINE + "nan"),
    ({"deadline": "60"}, DEADLINE + "'60'"),
    ({"deadline": True}, DEADLINE + "True"),
    ({"world_size": 2**40},
     r"world_size must be at most 512 \(every rank is a process on this machine\), got 1099511627776"),
    ({"world_size": 10**6}, r"world_size must be at most 512 .*got 1000000"),
    ({"world_size": 513}, r"world_size must be at most 512 .*got 513"),
    ({"log_dir": __file__}, r"log_dir .*test_launch.py is a file, not a folder"),
    ({"env": ["A=1"]}, r"launch\(env\) must be None or a dict of environment variables"),
])
def test_bad_numbers_fail_before_anything_starts(own_tempdir, no_process_may_start, kwargs, match):
    """One clear error, in well under a second, and nothing left: no process, no temp folder."""
    kwargs = dict(kwargs)
    world_size = kwargs.pop("world_size", 2)
    start = time.monotonic()
    with pytest.raises((ValueError, TypeError), match=match):
        launch(workers.all_reduce_rank, world_size, **kwargs)
    assert time.monotonic() - start < 1.0
    assert os.listdir(own_tempdir) == []


ENV = r"launch\(env\): "


@pytest.mark.parametrize("env, error, match", [
    ({"DEBUG": None}, TypeError, ENV + r"the value of 'DEBUG' must be a str, got None \(a NoneType\); "
                                       r"write env=\{'DEBUG': '1'\} or leave the key out"),
    ({"DATA": b"/data"}, TypeError, ENV + r"the value of 'DATA' must be a str, got b'/data' "
                                          r"\(a bytes\); write env=\{'DATA': '/data'\}"),
    ({"X": "a\x00b"}, ValueError, ENV + r"the value of 'X' holds a NUL character"),
    ({"WORKERS": 4}, TypeError, ENV + r"the value of 'WORKERS' must be a str, got 4 \(an int\); "
                                      r"write env=\{'WORKERS': '4'\}"),
    ({"ON": True}, TypeError, ENV + r"the value of 'ON' must be a str, got True \(a bool\)"),
    ({"S": "\ud800"}, ValueError, ENV + r"the value of 'S' cannot be encoded"),
    ({"": "1"}, ValueError, ENV + r"the name '' is not an environment variable's name: it must be "
                                  r"non-empty and hold no '='"),
    ({"A=B": "1"}, ValueError, ENV + r"the name 'A=B' is not an environment variable's name"),
    ({"A\x00": "1"}, ValueError, ENV + r"the name 'A\\x00' holds a NUL character"),
    ({1: "x"}, TypeError, ENV + r"the name 1 must be a str, got an int"),
    ({b"KEY": "x"}, TypeError, ENV + r"the name b'KEY' must be a str, got a bytes; write env=\{'KEY'"),
    ({"RANK": "3"}, ValueError, ENV + r"'RANK' is set by launch itself, for each rank"),
    ({"MASTER_PORT": "29500"}, ValueError, ENV + r"'MASTER_PORT' is set by launch itself"),
])
def test_bad_env_fails_before_anything_starts(own_tempdir, no_process_may_start, env, error, match):
    """Each bad name or value is refused naming the key: None reached the ranks as "None",
    b"/data" as "b'/data'", and a NUL killed rank 0 without a Python exception."""
    with pytest.raises(error, match=match):
        launch(workers.read_env, 1, "X", env=env)
    assert os.listdir(own_tempdir) == []


def test_env_reaches_the_ranks_exactly(monkeypatch):
    """Any Mapping; values as given (a '=' or an empty value is fine; a path becomes its str)."""
    from pathlib import Path
    from types import MappingProxyType
    env = MappingProxyType({"FSDP_MINI_A": "x=y", "FSDP_MINI_P": Path("/data"), "FSDP_MINI_E": ""})
    assert launch(workers.read_envs, 1, list(env), env=env) == [["x=y", "/data", ""]]


class _Monitor:
    def launch_started(self, world_size, events_dir):
        pass


@pytest.mark.parametrize("kwargs, error, match", [
    ({"log_dir": ""}, ValueError, r"log_dir must be None or a folder path, got '' \(an empty path\)"),
    ({"log_dir": "logs\x00"}, ValueError, r"log_dir holds a NUL character"),
    ({"log_dir": b"logs"}, TypeError, r"log_dir must be None or a folder path .*got b'logs' "
                                      r"\(bytes\); write log_dir='logs'"),
    ({"monitor": 42}, TypeError, r"monitor must be None or an object with the methods "
                                 r"launch_started\(world_size, events_dir\), launch_poll\(\) and "
                                 r"launch_finished\(ok\).*got 42 \(an int\)"),
    ({"monitor": _Monitor()}, TypeError, r"monitor must be None .*which lacks launch_poll, "
                                         r"launch_finished"),
    ({"backend": 1}, TypeError, r'backend must be None, "gloo" or "nccl", got 1 \(an int\)'),
])
def test_bad_log_dir_monitor_or_backend_fail_before_anything_starts(
        own_tempdir, no_process_may_start, monkeypatch, kwargs, error, match):
    """log_dir="" was the current folder; a monitor without its methods failed half way."""
    monkeypatch.chdir(own_tempdir)  # Note: today's code takes "" for the current folder
    with pytest.raises(error, match=match):
        launch(workers.read_env, 1, "X", **kwargs)
    assert os.listdir(own_tempdir) == []


@pytest.mark.parametrize("kwargs, env, error, match", [
    ({"fn": 42}, {}, TypeError, r"run_with_torchrun\(fn\) must be callable as fn\(rank, "
                                r"world_size, \*args\), got 42 \(an int\)"),
    ({"backend": "mpi"}, {}, ValueError, r'backend must be None, "gloo" or "nccl", got \'mpi\''),
    ({"timeout": 0}, {}, ValueError, r"timeout must be a positive number of seconds"),
    ({}, {"RANK": "zero"}, RuntimeError, r"run_with_torchrun: RANK='zero' in the environment is "
                                         r"not a whole number >= 0; torchrun sets it"),
    ({}, {"WORLD_SIZE": "0"}, RuntimeError, r"WORLD_SIZE='0' .* not a whole number >= 1"),
    ({}, {"RANK": "1"}, RuntimeError, r"RANK=1 and LOCAL_RANK=0 must each be below WORLD_SIZE=1"),
])
def test_run_with_torchrun_checks_its_arguments_before_it_starts(monkeypatch, kwargs, env, error,
                                                                  match):
    """Checked before the process group is made: fn=42 failed after init, backend="mpi" and
    RANK="zero" inside torch or int()."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
            "LOCAL_RANK": "0"}
    for k, v in {**base, **env}.items():
        monkeypatch.setenv(k, v)
    kwargs = {"fn": workers.all_reduce_rank, "backend": "gloo", "timeout": 30, **kwargs}
    with pytest.raises(error, match=match):
        run_with_torchrun(kwargs.pop("fn"), 1.0, **kwargs)
    assert not torch.distributed.is_initialized()


# ---------------------------------------------------------------- log_dir: only the kit's own files
KIT_LIST = ".launch.files"  # the kit's list of the files it wrote in a log_dir (launcher/files.py)


@pytest.mark.parametrize("name", ["config.json", "payload.pkl", "rank0.log", "rank1.result",
                                  "rank1.error.tmp", KIT_LIST])
def test_a_users_file_in_log_dir_is_never_overwritten_or_deleted(tmp_path, no_process_may_start,
                                                                 name):
    """A file of the user's whose name the launch would write: refused, naming it, before any
    process, and every file as it was. (It used to be deleted by name.)"""
    (tmp_path / name).write_text("mine")
    (tmp_path / "notes.txt").write_text("mine too")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=re.escape(f"log_dir {tmp_path} holds {name}, ") + ".*"
                       + re.escape(f"move {name} elsewhere, or choose another log_dir")):
        launch(workers.sleep_then_return, 2, 0.0, log_dir=tmp_path)
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / name).read_text() == "mine" and (tmp_path / "notes.txt").read_text() == "mine too"


def test_log_dir_loses_only_the_kits_own_files(tmp_path):
    """The kit removes its earlier files by its list of them, never by name: a rank5.log of the
    user's stays; one of its logs the user edited, or replaced, is the user's now."""
    assert launch(workers.sleep_then_return, 2, 0.0, log_dir=tmp_path) == [0, 1]
    (tmp_path / "rank5.log").write_text("mine")  # a name of the kit's that this launch won't write
    assert launch(workers.sleep_then_return, 1, 0.0, log_dir=tmp_path) == [0]
    assert not (tmp_path / "rank1.log").exists()  # the kit's, from the launch before: gone
    assert (tmp_path / "rank5.log").read_text() == "mine"
    refused = re.escape(f"log_dir {tmp_path} holds rank0.log, ") + ".*" + re.escape(
        "move rank0.log elsewhere, or choose another log_dir")
    with open(tmp_path / "rank0.log", "a") as f:
        f.write("my notes\n")  # the kit's log, edited since
    with pytest.raises(ValueError, match=refused):
        launch(workers.sleep_then_return, 1, 0.0, log_dir=tmp_path)
    assert (tmp_path / "rank0.log").read_text().endswith("my notes\n")
    (tmp_path / "rank0.log").unlink()
    (tmp_path / "rank0.log").write_text("mine\n")  # may well get the removed file's inode
    with pytest.raises(ValueError, match=refused):
        launch(workers.sleep_then_return, 1, 0.0, log_dir=tmp_path)
    assert (tmp_path / "rank0.log").read_text() == "mine\n"
    assert (tmp_path / "rank5.log").read_text() == "mine"


def test_temp_folder_removed_when_launch_fails_before_any_rank_starts(own_tempdir, monkeypatch):
    """Whatever goes wrong between making the temp folder and starting ranks, the folder goes."""
    def broken_store(*args, **kwargs):
        raise RuntimeError("no store today")
    monkeypatch.setattr(torch.distributed, "TCPStore", broken_store)
    with pytest.raises(RuntimeError, match="no store today"):
        launch(workers.all_reduce_rank, 2)
    assert os.listdir(own_tempdir) == []


def test_unpicklable_fn_or_args():
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"could not pickle fn .*lock.*module level"):
        launch(lambda rank, ws: lock.locked(), 2)
    with pytest.raises(TypeError, match=r"could not pickle args\[1\] \(generator\)"):
        launch(workers.all_reduce_rank, 2, 1.0, (i for i in range(3)))


# ---------------------------------------------------------------- the torchrun path
def test_run_with_torchrun_in_process(monkeypatch):
    """What one torchrun rank sees (env vars), with world size 1 in this very process."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        run_with_torchrun(workers.all_reduce_rank)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(k, "1" if k == "WORLD_SIZE" else "0")
    result = run_with_torchrun(workers.all_reduce_rank, 3.0, backend="gloo", timeout=30)
    assert result["world_size"] == 1 and torch.equal(result["sum"], torch.full((4,), 3.0))
    assert not torch.distributed.is_initialized()  # destroyed again


# ---------------------------------------------------------------- a function defined in a notebook
NOTEBOOK_CELLS = [
    f"""
import os, sys
sys.path.insert(0, {REPO_DIR!r})
assert sys.prefix == {sys.prefix!r}, (sys.prefix, "the kernel must run pytest's interpreter")
import torch, torch.distributed as dist
import fsdp_mini
from fsdp_mini import LaunchError
""",
    """
def work(rank, ws):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print(f"cell rank {rank} sum {t.item()}")
    return t.item() * 10 + rank

results = fsdp_mini.launch(work, 2, timeout=60)
assert results == [30.0, 31.0], results
""",
    """
def broken(rank, ws):
    raise KeyError("broken in a cell")

try:
    fsdp_mini.launch(broken, 1, timeout=60, log_dir="broken_logs")
except LaunchError as e:
    err = e
assert err.exc_type == "KeyError" and 'raise KeyError("broken in a cell")' in err.traceback, str(err)
assert err.traceback.splitlines()[1].endswith("in broken"), err.traceback  # starts at the user's fn
print("LaunchError seen")
""",
]


@pytest.mark.slow
def test_function_defined_in_a_notebook(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    name = notebook_kernel(tmp_path, monkeypatch)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    nbclient.NotebookClient(nb, kernel_name=name, timeout=120,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.output_type == "stream")
    assert "cell rank 0 sum 3.0" in out and "cell rank 1" not in out
    assert "LaunchError seen" in "".join(o.get("text", "") for o in nb.cells[2].outputs)


def _rank_sys_path(rank, world_size):
    import sys as rank_sys
    return list(rank_sys.path)


@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm", "fresh"])
def test_ranks_find_the_callers_fsdp_mini_without_its_modules_on_their_path(monkeypatch, warm):
    """The folder holding the package goes on the ranks' path, never the package itself (its
    `models`, `memory` or `labs` would shadow a rank's own modules of those names)."""
    import fsdp_mini
    monkeypatch.setenv("FSDP_MINI_WARM_START", warm)
    package = os.path.dirname(os.path.abspath(fsdp_mini.__file__))
    paths = launch(_rank_sys_path, 2)[0]
    assert package not in [os.path.abspath(p) for p in paths]
    assert os.path.dirname(package) in [os.path.abspath(p) for p in paths]
