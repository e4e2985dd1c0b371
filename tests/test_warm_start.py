"""Warm start (fsdp_mini/launcher/warm.py): ranks forked by the zygote are the processes a fresh
start makes; the fallback to fresh starts; a stale zygote restarts; nothing outlives the caller.

Every test also checks (autouse fixture) that no process is left behind.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from test_launch import (
    REPO_DIR,
    _children,
    _describe,
    _is_alive,
    _parent,
    no_leftover_processes,  # noqa: F401  (autouse fixture)
)

from fsdp_mini.launcher import launch, warm

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm start: Linux")


def describe(rank, world_size):
    """What a rank can tell about the process it is in."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).split("[")[0]
        except OSError:  # the fd of the listing itself, closed by now
            pass
    return {"pid": os.getpid(), "parent": os.getppid(), "session": os.getsid(0),
            "group": os.getpgid(0), "cwd": os.getcwd(), "path": list(sys.path), "argv": sys.argv[2:],
            "env": {k: v for k, v in os.environ.items() if k != "MASTER_PORT"},
            "threads": len(os.listdir("/proc/self/task")), "fds": sorted(fds.values())}


def _run(monkeypatch, warm_start, **kwargs):
    monkeypatch.setenv("FSDP_MINI_WARM_START", "1" if warm_start else "0")
    return launch(describe, 2, **kwargs)


def test_a_warm_rank_is_the_process_a_fresh_start_makes(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _run(monkeypatch, True)  # the zygote is started
    monkeypatch.setenv("FSDP_MINI_SET_LATER", "yes")  # set after it started: reaches the ranks
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO_DIR, "relative", "", REPO_DIR]))
    fresh, forked = _run(monkeypatch, False), _run(monkeypatch, True)
    for a, b in zip(fresh, forked):
        assert a["parent"] == os.getpid() and b["parent"] != os.getpid()  # b: the zygote's
        for r in (a, b):
            assert r["session"] == r["group"] == r["pid"]  # a session of its own
        b["env"]["FSDP_MINI_WARM_START"] = "0"
        for key in ("cwd", "path", "argv", "env", "threads", "fds"):
            assert a[key] == b[key], key
        assert b["env"]["FSDP_MINI_SET_LATER"] == "yes" and b["cwd"] == str(tmp_path)


def test_warm_ranks_come_from_one_zygote_per_caller(monkeypatch):
    first, second = _run(monkeypatch, True), _run(monkeypatch, True)
    parents = {r["parent"] for r in first + second}
    assert len(parents) == 1 and _parent(parents.pop()) == os.getpid()


def test_fresh_start_when_the_zygote_cannot_serve(monkeypatch):
    # OpenBLAS starts 2 threads at import: fork would be unsafe, so the zygote refuses to serve
    results = _run(monkeypatch, True, env={"OPENBLAS_NUM_THREADS": "2"})
    assert all(r["parent"] == os.getpid() for r in results)
    assert any("threads after the imports" in why for why in warm._refused.values())


def test_an_edited_file_restarts_the_zygote(monkeypatch):
    before = {r["parent"] for r in _run(monkeypatch, True)}
    edited = os.path.join(os.path.dirname(warm.__file__), "text.py")
    stat = os.stat(edited)
    os.utime(edited)  # as an edit would: modified now
    try:
        after = {r["parent"] for r in _run(monkeypatch, True)}
    finally:
        os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert len(after) == 1 and after != before and not any(_is_alive(p) for p in before)


# Note: how long a step may take on a loaded machine (a CI runner beside other jobs): the
# caller's import of torch before it starts the zygote, and the zygote's own imports, at the end
# of which a zygote whose caller died while it imported sees that and exits. The kit itself allows
# the zygote's imports this long (warm.START_TIMEOUT_S). A fixed 30 s and 5 s went red under load.
LOADED_S = warm.START_TIMEOUT_S


def _started_at(pid):
    """The start time of process pid (clock ticks since boot), None if it is gone or a zombie.
    With the pid it names one process: a pid reused meanwhile is not taken for it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])  # state, starttime (field 22)


def test_a_caller_killed_while_its_zygote_starts_leaves_no_process(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{REPO_DIR!r}]
        from fsdp_mini.launcher import launch
        launch(print, 2, timeout=60)
    """)
    caller = subprocess.Popen([sys.executable, "-c", script], env={**os.environ,
                                                                   "FSDP_MINI_WARM_START": "1"})
    try:
        deadline = time.monotonic() + LOADED_S
        while not (zygotes := [c for c in _children(caller.pid) if "--zygote" in _describe(c)]):
            assert caller.poll() is None, "the caller ended without starting a zygote"
            assert time.monotonic() < deadline, f"the caller started no zygote in {LOADED_S:g} s"
            time.sleep(0.02)
        started = {z: _started_at(z) for z in zygotes}
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + LOADED_S
    while (alive := [z for z, t in started.items() if t is not None and _started_at(z) == t]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"the zygote outlived its caller by {LOADED_S:g} s: {alive}"
