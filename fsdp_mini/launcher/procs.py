"""The rank processes of a launch: start them, watch them, stop them (always all of them).

Watching decides when to stop waiting, and why:
  "done"      every rank exited;
  "failed"    a rank failed, and the others had GRACE_S to report their own errors;
  "blocked"   after a rank returned, another used (almost) no CPU for `timeout` seconds;
  "deadline"  the whole job passed its `deadline`.
A rank that keeps using CPU is working, and only the deadline stops it.
"""
import codecs
import collections
import os
import signal
import subprocess
import sys
import time

from .failures import rank_file
from .warm import start_rank as start_warm

POLL_S = 0.05          # how often the caller looks at its ranks
CPU_POLL_S = 0.25      # how often it reads their CPU time, once a rank returned
GRACE_S = 2.0          # after the first failure, time the other ranks get to report their own error
STOP_GRACE_S = 1.0     # after SIGTERM (ranks dump their Python stacks), time before SIGKILL
IDLE_CPU_SHARE = 0.02  # a rank using less than this share of one core is not working

Watch = collections.namedtuple("Watch", "exited why blocked")


# ---------------------------------------------------------------- starting
def _rank_env(rank, world_size, port, extra):
    env = dict(os.environ)
    # Note: the folder that holds the fsdp_mini package (not the package itself, whose modules
    # would then shadow a rank's own `models` or `memory`), so ranks import the caller's copy.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if "GLOO_SOCKET_IFNAME" not in os.environ and sys.platform.startswith(("linux", "darwin")):
        # Note: all ranks are on this host; loopback avoids gloo picking an unreachable interface.
        env["GLOO_SOCKET_IFNAME"] = "lo" if sys.platform.startswith("linux") else "lo0"
    env.update(extra)
    return env


def start_ranks(procs, launch_dir, world_size, port, extra_env):
    """Start the ranks, appending each to procs at once (so an interrupt here still stops them).

    Note: forked from the warm zygote where possible (warm.py: seconds faster each), else fresh.
    """
    for rank in range(world_size):
        env, log_path = _rank_env(rank, world_size, port, extra_env), rank_file(launch_dir, rank, "log")
        if start_warm(procs, launch_dir, rank, log_path, env):
            continue
        with open(log_path, "wb") as log:
            # Note: the log is the rank's fd 1 and 2, so C/C++ output (gloo, NCCL) lands there too.
            # A new session keeps a terminal Ctrl-C away from the ranks: the caller stops them.
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "fsdp_mini.launcher.rank_entry", launch_dir, str(rank)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd(),
                env=env, start_new_session=True))


# ---------------------------------------------------------------- watching
class LogTail:
    """Echo what a rank writes to its log onto the caller's sys.stdout (a notebook cell shows it)."""

    def __init__(self, path):
        self.path, self.offset = path, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def pump(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        text = self.decoder.decode(data)
        if text and sys.stdout is not None:
            sys.stdout.write(text)
            sys.stdout.flush()


def cpu_seconds(pid):
    """CPU time (user + system, all threads) a process has used, or None where /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # Note: the name in (...) may hold spaces
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class IdleRanks:
    """Which running ranks used (almost) no CPU over the last `timeout` seconds.

    Note: a rank that is still working uses CPU; one waiting for a peer that already returned,
    a lock or input() uses none. Only the rank's own process counts (all its threads, not its
    child processes). Where /proc is missing nobody is called idle.
    """

    def __init__(self, timeout):
        self.timeout, self.samples, self.read_at = timeout, {}, 0.0

    def find(self, procs, exited, now):
        if now - self.read_at < CPU_POLL_S:
            return []
        self.read_at, idle = now, []
        for rank, p in enumerate(procs):
            cpu = None if rank in exited else cpu_seconds(p.pid)
            if cpu is None:
                continue
            samples = self.samples.setdefault(rank, collections.deque())
            samples.append((now, cpu))
            while len(samples) > 1 and samples[1][0] <= now - self.timeout:
                samples.popleft()  # keep one sample at least `timeout` old
            then, cpu_then = samples[0]
            if now - then >= self.timeout and cpu - cpu_then < IDLE_CPU_SHARE * (now - then):
                idle.append(rank)
        return idle


def _has_failed(launch_dir, rank, proc):
    return proc.returncode not in (None, 0) or os.path.exists(rank_file(launch_dir, rank, "error"))


def watch_ranks(procs, launch_dir, timeout, deadline_at, on_poll=None):
    """Poll the ranks until they all exit or must be stopped; return a Watch(exited, why, blocked).

    exited is {rank: wall time it was seen to exit}; ranks still running are left to the caller.
    """
    tail, idle = LogTail(rank_file(launch_dir, 0, "log")), None
    exited, failed_at = {}, None
    while True:
        now = time.monotonic()
        for rank, p in enumerate(procs):
            if rank not in exited and p.poll() is not None:
                exited[rank] = time.time()
                if p.returncode == 0 and idle is None:
                    idle = IdleRanks(timeout)  # Note: from now on, a rank using no CPU is blocked
            if failed_at is None and _has_failed(launch_dir, rank, p):
                failed_at = now
        if on_poll is not None:
            on_poll()
        if failed_at is None:
            # Note: echo only while no rank has failed: what rank 0 prints after that is its own
            # "lost my peer" traceback, which would hide the real cause shown in the LaunchError.
            tail.pump()
        if len(exited) == len(procs):
            return Watch(exited, "done", [])
        if failed_at is not None and now - failed_at > GRACE_S:
            return Watch(exited, "failed", [])
        if deadline_at is not None and now >= deadline_at:
            return Watch(exited, "deadline", [])
        blocked = idle.find(procs, exited, now) if idle is not None and failed_at is None else []
        if blocked:
            return Watch(exited, "blocked", blocked)
        time.sleep(POLL_S)


# ---------------------------------------------------------------- stopping
def _signal(procs, sig):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)  # Note: the whole process group, so the rank's children too
            except (ProcessLookupError, PermissionError):
                pass


def _terminate(procs):
    """SIGTERM (ranks dump their Python stacks into their logs); wait up to STOP_GRACE_S."""
    _signal(procs, signal.SIGTERM)
    until = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def _kill_and_reap(procs):
    _signal(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def stop_ranks(procs):
    """Stop and reap every rank: SIGTERM, then SIGKILL after STOP_GRACE_S; at once on Ctrl-C.

    Note: a rank may ignore SIGTERM, and the user may press Ctrl-C again while we wait for it.
    That interrupt must not cut the sequence short (the ranks would outlive the call), so it
    skips the wait, kills and reaps every rank, and only then is raised.
    """
    interrupted = None
    try:
        _terminate(procs)
    except KeyboardInterrupt as exc:
        interrupted = exc
    while True:
        try:
            _kill_and_reap(procs)  # Note: safe to repeat, so a third Ctrl-C just repeats it
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted
