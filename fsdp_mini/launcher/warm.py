"""Warm start, caller side: ranks forked by a zygote that has torch imported already.

A rank started fresh spends ~3 s of CPU on imports (torch, then torch._dynamo at its first
optimizer) before it does anything; with more ranks than cores that is seconds per launch.
So the first launch of a process starts one helper, the zygote (zygote.py: a fresh interpreter,
which never touches CUDA, so the caller's CUDA state does not matter), and every rank after that
is an `os.fork()` of it, made into exactly the process `python -m fsdp_mini.launcher.rank_entry`
would be: its own session, fds 0/1/2 = /dev/null and its log, the caller's cwd, the env of the
request (sent with each one, so what the caller put in os.environ since arrives too), and the
sys.path that env and cwd give a fresh interpreter.

Fresh starts (Popen) remain: off Linux, with FSDP_MINI_WARM_START=0, and whenever the zygote
cannot serve (it failed to start, it is stale and still has ranks running, a non-main thread
would have to start it). `WarmRank` offers the part of Popen's surface procs.py uses.
"""
import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

START_TIMEOUT_S = 120.0  # the zygote's imports, on a loaded machine
# Note: variables read while importing (torch's config and logging, BLAS threads, Python's own,
# the temporary folder): the zygote imported with the values it started with, so a change
# restarts it. Others (RANK, CI, FSDP_MINI_*...) are read later and just travel with a request.
IMPORT_ENV = ("TORCH", "PYTORCH", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "PYTHON", "LD_", "LC_",
              "LANG", "TMPDIR", "TEMP", "TMP")

_current = None      # this process's zygote
_refused = {}        # key -> why the zygote could not start with it (no retry for that key)
_lock = threading.Lock()


def enabled():
    return (sys.platform.startswith("linux") and hasattr(os, "fork")
            and os.environ.get("FSDP_MINI_WARM_START", "1") != "0")


class ZygoteError(RuntimeError):
    """The zygote did not start, or died."""


class Zygote:
    """The helper process, and the messages it sent: exit codes by pid, replies by request."""

    def __init__(self, env, key):
        self.key, self.owner, self.exits, self.live, self.replies = key, os.getpid(), {}, set(), {}
        self.lock, self.pending, self.dead, self.next_id = threading.Lock(), b"", False, 0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fsdp_mini.launcher.rank_entry", "--zygote"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=os.getcwd(), env={**env, "FSDP_MINI_ZYGOTE_CALLER": str(os.getpid())},
            start_new_session=True)  # Note: a terminal's Ctrl-C must not reach it (nor its ranks)
        os.set_blocking(self.proc.stdout.fileno(), False)
        try:
            self.info = self._wait_for(lambda: self.replies.pop("ready", None), START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _read(self, timeout):
        """Read what the zygote sent within `timeout` s (None: until something comes)."""
        fd = self.proc.stdout.fileno()
        if self.dead or not select.select([fd], [], [], timeout)[0]:
            return
        with self.lock:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:  # Note: another thread read it first
                return
            if not data:
                self._died()
            *lines, self.pending = (self.pending + data).split(b"\n")
            for line in lines:
                try:
                    self._take(json.loads(line))
                except ValueError:  # Note: not ours (fd 1 goes to /dev/null, but just in case)
                    pass

    def _take(self, msg):
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["code"]
            self.live.discard(msg["exit"])
        elif "id" in msg:
            self.replies[msg["id"]] = msg
        elif "ready" in msg:
            self.replies["ready"] = msg["ready"]
        else:
            self.replies["error"] = msg.get("error", repr(msg))

    def _died(self):
        """Its ranks died with it (PDEATHSIG, or their own check of their parent): SIGKILL."""
        self.dead = True
        for pid in self.live:
            self.exits.setdefault(pid, -signal.SIGKILL)
        self.live.clear()

    def _wait_for(self, found, timeout):
        until = time.monotonic() + timeout
        while (value := found()) is None:
            if "error" in self.replies or self.dead:
                raise ZygoteError(self.replies.get("error") or "the zygote exited")
            left = until - time.monotonic()
            if left <= 0:
                raise ZygoteError(f"no answer from the zygote in {timeout:g} s")
            self._read(left)
        return value

    def fork_rank(self, launch_dir, rank, log, env):
        """Ask for one rank; return its pid. Note: finishes even on Ctrl-C, then re-raises it,
        so a rank never runs without the caller knowing its pid (and stopping it)."""
        with self.lock:  # Note: one request at a time on the pipe, each a whole line
            self.next_id += 1
            rid = self.next_id
            req = {"id": rid, "launch_dir": launch_dir, "rank": rank, "log": log,
                   "cwd": os.getcwd(), "env": env}
            try:
                self.proc.stdin.write((json.dumps(req) + "\n").encode())
                self.proc.stdin.flush()
            except OSError as exc:  # Note: BrokenPipeError: it died since it was last checked
                raise ZygoteError(f"the zygote is gone: {exc}") from None
        interrupted = None
        while True:
            try:
                reply = self._wait_for(lambda: self.replies.pop(rid, None), START_TIMEOUT_S)
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        if "error" in reply:
            raise ZygoteError(reply["error"])
        self.live.add(reply["pid"])
        if interrupted is not None:
            raise _Started(reply["pid"], interrupted)
        return reply["pid"]

    def exit_code(self, pid, timeout):
        if pid not in self.exits:
            self._read(timeout)
        return self.exits.get(pid)

    def close(self):
        """EOF on its stdin ends it; kill and reap it in any case (its ranks die with it)."""
        with self.lock:
            self._died()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


class _Started(Exception):
    """A KeyboardInterrupt that came while a rank was being forked, with that rank's pid."""

    def __init__(self, pid, interrupt):
        super().__init__(pid)
        self.pid, self.interrupt = pid, interrupt


class WarmRank:
    """A rank forked by the zygote, with the part of subprocess.Popen's surface procs.py uses.

    Note: the zygote, its parent, reaps it and sends its exit code; until that message is read
    poll() says running. os.killpg on its pid is as safe as with Popen in practice: the pid is
    only free for reuse after the zygote reaped it, and the message comes right after.
    """

    def __init__(self, zygote, pid):
        self.zygote, self.pid, self.returncode, self.args = zygote, pid, None, ["warm", pid]

    def poll(self):
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout=None):
        until = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if until is None else max(0.0, until - time.monotonic())
            self.returncode = self.zygote.exit_code(self.pid, left)
            if self.returncode is None and left == 0.0:  # Note: looked once more, like Popen
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


# ---------------------------------------------------------------- which zygote, if any
def _fingerprint():
    """Newest mtime and number of fsdp_mini's .py files: editing one restarts the zygote."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    newest, count = 0, 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                newest, count = max(newest, os.stat(os.path.join(folder, name)).st_mtime_ns), count + 1
    return newest, count


def _key(env):
    return (_fingerprint(), _torch_file(),
            tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_ENV))))


def _torch_file():
    torch = sys.modules.get("torch")
    return getattr(torch, "__file__", None)


def _zygote_for(env):
    """This process's zygote, fit for a rank with env; None: start the rank fresh."""
    global _current
    key = _key(env)
    with _lock:
        zygote = _current
        if zygote is not None and zygote.owner != os.getpid():
            zygote = _current = None  # Note: this is a fork of the caller; it belongs to the parent
        if zygote is not None and (zygote.key != key or zygote.dead or zygote.proc.poll() is not None):
            if zygote.live and not zygote.dead and zygote.proc.poll() is None:
                return None  # Note: stale, but its ranks (another thread's launch) still run
            zygote.close()
            zygote = _current = None
        if zygote is None:
            zygote = _current = _start(env, key)
        return zygote


def _start(env, key):
    """Note: only the main thread starts one. PDEATHSIG fires when the *thread* that started the
    zygote exits, and the zygote outlives launches: started from a thread that ends, it would die
    (and its ranks with it) with that thread."""
    if key in _refused or threading.current_thread() is not threading.main_thread():
        return None
    try:
        zygote = Zygote(env, key)
    except ZygoteError as exc:
        _refused[key] = str(exc)
        return None
    if zygote.info["torch"] != _torch_file():
        zygote.close()
        _refused[key] = f"the zygote imported {zygote.info['torch']}, the caller {_torch_file()}"
        return None
    return zygote


@atexit.register
def _close_current():
    if _current is not None and _current.owner == os.getpid():
        _current.close()


def start_rank(procs, launch_dir, rank, log, env):
    """Fork rank `rank` from the zygote and append its WarmRank to procs; False: start it fresh."""
    zygote = _zygote_for(env) if enabled() else None
    if zygote is None:
        return False
    open(log, "wb").close()  # Note: created here, so errors (a full disk...) are the caller's
    try:
        pid = zygote.fork_rank(launch_dir, rank, log, env)
    except ZygoteError:
        zygote.close()  # Note: no answer: it may still fork that rank; its death takes the rank
        return False
    except _Started as started:
        procs.append(WarmRank(zygote, started.pid))
        raise started.interrupt from None
    procs.append(WarmRank(zygote, pid))
    return True
