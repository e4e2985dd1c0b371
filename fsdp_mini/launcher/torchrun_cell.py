"""torchrun from a notebook cell: the command a learner would type, bounded, leaving no process.
In the launcher because it starts and stops ranks (torchrun's, found through /proc like procs.py's).

    text = labs.torchrun("train.py", nproc=2)   # prints `$ torchrun --standalone ...`, returns output
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

__all__ = ["torchrun"]


def torchrun(script, nproc: int = 2, args=(), timeout: float = 120) -> str:
    """Run ``torchrun --standalone --nproc-per-node nproc script args`` and return its output.

        text = labs.torchrun("train.py", nproc=2)       # what `!torchrun ...` would print

    The command is printed first. Bounded by ``timeout`` seconds; on timeout or failure the whole
    job (torchrun and its ranks) is stopped and a RuntimeError shows the output's tail.
    Note: ``--standalone`` picks a free port, so re-running the cell works; ``start_new_session``
    keeps a Ctrl-C in the notebook from reaching torchrun half-way (the cell stops it, fully).
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a whole number >= 1 (the processes torchrun starts, "
                         f"e.g. nproc=2), got {nproc!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, e.g. 120, got {timeout!r}")
    if not os.path.isfile(script):
        raise FileNotFoundError(f"no script {script!r} in {os.getcwd()}: write it first (e.g. "
                                f"with %%writefile), or give its path")
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    base = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    cmd = base + ["--standalone", "--nproc-per-node", str(nproc), str(script), *map(str, args)]
    print("$ torchrun " + " ".join(cmd[len(base):]))
    scratch = tempfile.mkdtemp(prefix="fsdp_mini_torchrun_")  # torchelastic's files go here
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": scratch}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        text, _ = proc.communicate()
        raise RuntimeError(f"torchrun took more than {timeout:g} s and was stopped:\n"
                           f"{text[-3000:]}") from None
    finally:
        if proc.poll() is None:
            _stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{text[-3000:]}")
    return text


def _stop(proc) -> None:
    """SIGTERM torchrun (it stops its ranks), then SIGKILL whatever is left of its tree.
    Note: torchrun starts each rank in a session of its own, so killing torchrun's process
    group alone would leave the ranks running: they are found through /proc first."""
    ranks = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *ranks]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux: /proc; elsewhere none are found)."""
    parents = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        parent_pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == parent_pid]
        found += kids
        todo += kids
    return found
