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
        deadline = time.monotonic() + 30
        while not (zygotes := [c for c in _children(caller.pid) if "--zygote" in _describe(c)]):
            assert caller.poll() is None and time.monotonic() < deadline, "no zygote started"
            time.sleep(0.02)
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 5
    while (alive := [p for p in zygotes if _is_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"the zygote outlived its caller: {alive}"
