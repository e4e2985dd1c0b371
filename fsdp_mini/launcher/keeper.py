"""The keeper of interactive ranks: the one process that starts them and the one that ends them.

``start_ranks`` (:mod:`fsdp_mini.launcher.interactive`) does not start ipyparallel's controller
and engines from the notebook's kernel. It starts this small process, which

    1. becomes a *subreaper* (Linux): every process it starts, and every process those start,
       stays in its tree even when its own parent dies (an engine's nanny, say);
    2. starts the cluster (a controller and N engines) and prints one JSON line saying where
       the kernel connects to it;
    3. waits for ``stop`` on its stdin, or for the kernel to be gone (its parent changes, or
       stdin closes); then stops the cluster and kills every process left in its tree, removes
       the cluster's connection files, and exits.

So no process outlives the kernel, whatever happens to it (a failing cell, a restart, SIGKILL
while the ranks are still starting) or to the engines (killed first, the kernel after them).
The keeper runs in a session of its own and ignores SIGINT: interrupting a cell does not stop
the ranks. SIGTERM and SIGHUP end it like ``stop``.

    python keeper.py KERNEL_PID N CLUSTER_ID     # as a file: stdlib and ipyparallel only
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import signal
import sys
import threading
import time

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def main(kernel_pid: int, world_size: int, cluster_id: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: end(cluster_id))
    _become_subreaper()
    threading.Thread(target=_watch_kernel, args=(kernel_pid, cluster_id), daemon=True,
                     name="fsdp-mini-watch-kernel").start()
    import ipyparallel as ipp
    cluster = ipp.Cluster(n=world_size, cluster_id=cluster_id, log_level=40,
                          shutdown_atexit=False)
    try:
        cluster.start_cluster_sync()
    except Exception as e:  # noqa: BLE001  (told to the kernel, which raises it)
        _tell({"error": f"{type(e).__name__}: {e}"})
        end(cluster_id)
    _tell({"client_file": os.path.join(cluster.profile_dir, "security",
                                       f"ipcontroller-{cluster_id}-client.json")})
    for line in sys.stdin:  # Note: EOF too: the kernel is gone
        if line.strip() == "stop":
            break
    try:
        cluster.stop_cluster_sync()
    except Exception:  # noqa: BLE001  (whatever is left is killed below)
        pass
    end(cluster_id)


def end(cluster_id: str) -> None:
    """Kill every process in the keeper's tree, remove the cluster's files, exit."""
    deadline = time.monotonic() + 5
    while (left := descendants(os.getpid())) and time.monotonic() < deadline:
        for pid in left:
            kill(pid)
        _reap()
        time.sleep(0.05)
    _reap()
    for leftover in glob.glob(os.path.expanduser(f"~/.ipython/profile_*/security/*{cluster_id}*")):
        try:
            os.remove(leftover)
        except OSError:
            pass
    os._exit(0)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (children before their own children)."""
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def parent_of(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if fields else -1


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent, ...)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _watch_kernel(kernel_pid: int, cluster_id: str) -> None:
    # Note: the keeper's parent is the kernel; once the kernel is gone it is re-parented.
    while os.getppid() == kernel_pid:
        time.sleep(0.1)
    end(cluster_id)


def _become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap() -> None:
    """Collect the exit status of every finished child (orphans come to a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _tell(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
