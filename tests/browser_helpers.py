"""Helpers for tests/test_browser.py: a JupyterLab server on localhost, and process bookkeeping.

The server runs in its own process group. Everything it starts (kernel, training ranks, which
run in sessions of their own) inherits an environment variable ``MARKER`` set to the server's
token, so they are found even once orphaned, and processes of other test runs on the same machine
are never mistaken for them. ``running_lab`` records them while it runs, shuts the kernels down
through the REST API, stops the group (SIGTERM, then SIGKILL), kills whatever is still alive and
lists it in ``leaked``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

# -- processes ----------------------------------------------------------------------------------


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (tells a pid apart from a later reuse)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def children(pid: int) -> set[int]:
    """Direct children of ``pid`` (all its threads), from /proc."""
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes_matching(text: str) -> set[int]:
    """Like ``pgrep -f text``: live processes whose command line contains ``text``."""
    me = os.getpid()
    return {int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me
            and text in cmdline(int(p)) and not _is_zombie(int(p))}


def processes_with_env(name: str, value: str) -> set[int]:
    """Live processes whose environment has ``name=value`` (inherited by all descendants)."""
    needle, out = f"{name}={value}".encode(), set()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and not _is_zombie(int(p)):
                    out.add(int(p))
        except OSError:
            pass
    return out


def alive(pid: int, start_time: int | None) -> bool:
    """``pid`` is still the process first seen with ``start_time``, and not a zombie."""
    return (start_time is not None and _start_time(pid) == start_time
            and not _is_zombie(pid))


# -- JupyterLab ---------------------------------------------------------------------------------

MARKER = "FSDP_MINI_BROWSER_TEST"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    proc: subprocess.Popen
    port: int
    token: str
    log_path: str
    seen: dict[int, tuple[int | None, str]] = field(default_factory=dict)  # pid -> (start, cmd)
    leaked: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}?token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5.0):
        req = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None

    def ours(self) -> set[int]:
        """Live processes started from this server (the server itself excluded)."""
        return processes_with_env(MARKER, self.token) - {self.proc.pid}

    def record_processes(self) -> set[int]:
        """Remember every process the server has started so far (kernel, ranks)."""
        found = (descendants(self.proc.pid) | self.ours()) - {self.proc.pid}
        for pid in found:
            if pid not in self.seen:
                self.seen[pid] = (_start_time(pid), cmdline(pid))
        return found

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def _wait_ready(lab: Lab, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({lab.proc.returncode}):\n{lab.log()[-4000:]}")
        try:
            lab.api("api/status", timeout=2)
            return
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer in {timeout:.0f} s:\n{lab.log()[-4000:]}")


def _stop(lab: Lab) -> None:
    lab.record_processes()
    with contextlib.suppress(Exception):  # kernels first, so they stop their ranks cleanly
        for kernel in lab.api("api/kernels"):
            lab.api(f"api/kernels/{kernel['id']}", method="DELETE", timeout=30)
    lab.record_processes()
    pgid = lab.proc.pid  # start_new_session: the server leads its own group
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        try:
            lab.proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # the kernel runs in a session of its own: give the server's shutdown a moment, then check
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p, s) for p, (s, _) in lab.seen.items()):
        time.sleep(0.2)
    lab.record_processes()  # orphans, if any, still carry the marker
    for pid, (start, cmd) in lab.seen.items():
        if alive(pid, start):
            lab.leaked.append(f"{pid}: {cmd}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_lab(root_dir, log_path, state_dir, timeout: float = 60.0):
    """JupyterLab serving ``root_dir`` on 127.0.0.1, a random token, ``CI=true`` with 25 steps (long enough to watch
    the dashboard fill while the cell runs); always stopped.
    Its config, settings, workspaces and runtime files go to ``state_dir``, not the user's."""
    port, token = free_port(), secrets.token_hex(24)
    state = str(state_dir)
    env = dict(os.environ, JUPYTER_TOKEN=token, CI="true", FSDP_MINI_STEPS="25", **{MARKER: token}, PYTHONUNBUFFERED="1",
               JUPYTER_CONFIG_DIR=os.path.join(state, "config"),
               JUPYTERLAB_SETTINGS_DIR=os.path.join(state, "settings"),
               JUPYTERLAB_WORKSPACES_DIR=os.path.join(state, "workspaces"),
               JUPYTER_RUNTIME_DIR=os.path.join(state, "runtime"),
               IPYTHONDIR=os.path.join(state, "ipython"))
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip", "127.0.0.1",
           "--port", str(port), "--port-retries", "0", f"--ServerApp.root_dir={root_dir}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(root_dir),
                                start_new_session=True)
    lab = Lab(proc, port, token, str(log_path))
    try:
        _wait_ready(lab, timeout)
        yield lab
    finally:
        _stop(lab)
