"""The Python stack of every rank of a hung job, taken while it hangs.

Two ways on a cluster, both from outside the job and without stopping it:
- a signal the program asked :mod:`faulthandler` to answer (``faulthandler.register(SIGUSR1)``
  in the rank, then ``kill -USR1 PID``): every thread's stack written to a file, also while the
  rank is blocked in C++ (a collective), since faulthandler answers from C;
- ``py-spy dump --pid PID``, which reads a process's memory from outside (it needs the right to
  ptrace it: root, CAP_SYS_PTRACE, or Linux's Yama ``ptrace_scope`` at 0; sudo on macOS).

``stacks_of_hung_job`` does the first from the notebook, and the second where py-spy is found::

    hung = stacks_of_hung_job(log_on_rank_0, 2, False, timeout=6)
    print(hung.stacks[0])   # rank 0's threads, innermost frame first: the collective it waits in
    hung.job.error          # the hang still ends as before: the collective's timeout
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from functools import partial
from typing import NamedTuple, Optional

from .cluster_tools import JobRun, is_library, run_job, user_frame

STACK_SIGNAL = signal.SIGUSR1
PY_SPY_TIMEOUT = 20   # seconds one py-spy dump may take
SETTLE_S = 0.5        # a rank that used no CPU for this long is taken to be waiting
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+.*$", re.M)
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")   # py-spy colours its output even into a pipe
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$', re.M)


class HungJob(NamedTuple):
    """Each rank's stack text taken while the job hung (``stacks``; ``py_spy``: py-spy's, empty
    if it was not used), the rank processes' ids, and how the job ended (``job``)."""
    stacks: dict
    py_spy: dict
    pids: dict
    job: JobRun


def answering_stack_signal(fn, folder: str):
    """``fn`` for ``launch``, in ranks that write every thread's stack to ``folder/rank{r}.stack``
    on SIGUSR1 (and their process id to ``folder/rank{r}.pid`` once they do)."""
    return partial(_answer_signal_then_run, fn, folder)


def _answer_signal_then_run(fn, folder, rank, world_size, *args):
    stack_file = open(os.path.join(folder, f"rank{rank}.stack"), "w")  # Note: open while fn runs
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    pid_path = os.path.join(folder, f"rank{rank}.pid")
    with open(pid_path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_path + ".tmp", pid_path)  # Note: a pid seen means the signal is answered
    return fn(rank, world_size, *args)


def stacks_of_hung_job(fn, world_size: int, *args, timeout: float = 6.0, deadline: float = 40.0,
                       use_py_spy: Optional[bool] = None, env: Optional[dict] = None) -> HungJob:
    """Launch ``fn`` on ``world_size`` gloo ranks; once every rank is waiting (no CPU used for
    SETTLE_S), take each one's stack (SIGUSR1 → faulthandler; and py-spy's if ``use_py_spy``,
    None: if installed), then let the job end by its ``timeout``. No process outlives the call.
    """
    if use_py_spy and shutil.which("py-spy") is None:
        raise FileNotFoundError("py-spy is not installed (pip install py-spy); use_py_spy=None "
                                "takes the stacks with faulthandler alone")
    use_py_spy = shutil.which("py-spy") is not None if use_py_spy is None else use_py_spy
    folder, box = tempfile.mkdtemp(prefix="fsdp_mini_stacks_"), {}
    job = partial(run_job, answering_stack_signal(fn, folder), world_size, *args, env=env,
                  timeout=timeout, deadline=deadline)
    thread = threading.Thread(target=lambda: box.update(job=job()), daemon=True)
    thread.start()
    try:
        until = time.monotonic() + deadline
        pids = _wait_for_pids(folder, world_size, thread, until)
        _wait_until_waiting(pids.values(), thread, until)
        stacks = _signal_and_read(pids, folder) if thread.is_alive() else {}
        spied = {r: py_spy_dump(pid) for r, pid in pids.items()} if use_py_spy and stacks else {}
    finally:
        thread.join(deadline + 30)  # Note: the launch's deadline bounds it; its ranks end with it
        shutil.rmtree(folder, ignore_errors=True)
    return HungJob(stacks, spied, pids, box.get("job"))


def _wait_for_pids(folder, world_size, thread, until) -> dict:
    pids = {}
    while len(pids) < world_size and thread.is_alive() and time.monotonic() < until:
        for rank in range(world_size):
            try:
                with open(os.path.join(folder, f"rank{rank}.pid")) as f:
                    pids[rank] = int(f.read())
            except (FileNotFoundError, ValueError):
                pass
        time.sleep(0.05)
    return pids


def _cpu_ticks(pid) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # Note: utime + stime, fields 14 and 15
    except (OSError, IndexError, ValueError):
        return None


def _wait_until_waiting(pids, thread, until):
    """Until no rank used CPU for SETTLE_S (off Linux, without /proc: SETTLE_S * 4 at once)."""
    pids = list(pids)
    if not os.path.exists("/proc/self/stat"):
        time.sleep(SETTLE_S * 4)
        return
    last, still_since = None, time.monotonic()
    while thread.is_alive() and time.monotonic() < until:
        ticks = [_cpu_ticks(pid) for pid in pids]
        if ticks != last:
            last, still_since = ticks, time.monotonic()
        elif time.monotonic() - still_since >= SETTLE_S:
            return
        time.sleep(0.05)


def _signal_and_read(pids, folder) -> dict:
    for pid in pids.values():
        try:
            os.kill(pid, STACK_SIGNAL)
        except ProcessLookupError:  # Note: it ended meanwhile; its stack is simply missing
            pass
    stacks, until = {}, time.monotonic() + 2.0
    while len(stacks) < len(pids) and time.monotonic() < until:
        time.sleep(0.1)  # Note: faulthandler writes from the signal handler; give it a moment
        for rank in pids:
            with open(os.path.join(folder, f"rank{rank}.stack")) as f:
                text = f.read()
            if "most recent call first" in text:
                stacks[rank] = text.rstrip()
    return stacks


def py_spy_dump(pid: int) -> str:
    """What ``py-spy dump --pid PID`` prints (its error too, if it could not read the process)."""
    exe = shutil.which("py-spy")
    if exe is None:
        raise FileNotFoundError("py-spy is not installed: pip install py-spy")
    proc = subprocess.Popen([exe, "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=PY_SPY_TIMEOUT)
    finally:
        if proc.poll() is None:  # Note: timed out (or interrupted): no py-spy is left behind
            proc.kill()
            proc.wait()
    return _COLOUR.sub("", out).rstrip()


# ---------------------------------------------------------------- reading a stack
def rank_thread(stack: str) -> list:
    """The frames (file, line, function; innermost first) of the thread that runs the rank's
    function (its stack goes through the launcher's rank_entry.py), from a faulthandler dump."""
    for block in _THREAD.split(stack)[1:]:
        frames = [(path, int(line), name) for path, line, name in _FRAME.findall(block)]
        if any(path.endswith(os.path.join("launcher", "rank_entry.py")) for path, _, _ in frames):
            return frames
    return []


def where_it_waits(frames) -> dict:
    """Where a blocked thread waits, from its frames (innermost first)::

        {"in": "all_gather_single", "at": ".../distributed_c10d.py:4394",
         "chain": "all_gather_single <- wrapper <- <lambda>", "line": "train at cell.py:13",
         "source": "loss.backward()"}    # the user's innermost line, and its text if known
    """
    if not frames:
        return {"in": "", "at": "", "chain": "", "line": "", "source": ""}
    path, line, name = frames[0]
    mine = next(((p, n) for p, n, _ in frames if not is_library(p)), None)
    return {"in": name, "at": f"{path}:{line}", "chain": " <- ".join(f[2] for f in frames[:3]),
            "line": user_frame(frames),
            "source": linecache.getline(*mine).strip() if mine else ""}
