"""The warm starter ("zygote"), zygote side: `python -m fsdp_mini.launcher.rank_entry --zygote`.

A fresh rank spends seconds importing torch (and torch._dynamo, which the first optimizer
imports). The zygote imports all that once, then forks each rank on request, already warm. The
caller's side, and why the forked rank is the same as a fresh `python -m` one: warm.py.

Protocol: one JSON object per line. Caller -> zygote (stdin): {"id", "launch_dir", "rank", "log",
"cwd", "env"}. Zygote -> caller (the pipe that was its stdout): {"ready": info} once,
or {"error": text} and exit; then {"id", "pid"} (or {"id", "error"}) per request, and
{"exit": pid, "code": returncode} when a rank is reaped (code < 0: killed by that signal).
EOF on stdin means the caller is gone or done: the zygote exits, and its ranks die with it.
"""
import importlib
import json
import os
import select
import signal
import sys
import tempfile
import traceback


def _dedupe(paths):
    seen = set()
    return [p for p in paths if not (p in seen or seen.add(p))]


def _leading_path(cwd, env):
    """What `python -m` puts before the standard entries of sys.path: cwd, then PYTHONPATH.

    Note: site.py makes PYTHONPATH's entries absolute (an empty one is the cwd) and drops
    duplicates among them and the standard entries; the cwd comes after, as is.
    """
    extra = env.get("PYTHONPATH", "")
    entries = [os.path.normpath(os.path.join(cwd, p)) for p in extra.split(os.pathsep)] if extra else []
    return [cwd] + _dedupe(entries)


def _preload():
    """Import what every rank imports, so that no rank pays for it; return facts the caller checks.

    Note: the zygote must stay single-threaded (fork copies only the calling thread; a lock held
    by another thread stays locked forever in the child). Importing torch starts no thread as
    long as OMP_NUM_THREADS=1 (otherwise numpy's OpenBLAS starts its pool at import), which the
    ranks' environment sets. Checked here: more than one thread and the zygote refuses to serve.
    """
    import cloudpickle  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401  (Note: imported by the first optimizer: ~1.5 s of CPU)
    import torch.distributed  # noqa: F401

    import fsdp_mini
    import fsdp_mini.launcher.core  # noqa: F401
    import fsdp_mini.models  # noqa: F401
    import fsdp_mini.telemetry  # noqa: F401
    threads = sorted(os.listdir("/proc/self/task"))
    if len(threads) != 1:
        raise RuntimeError(f"{len(threads)} threads after the imports; fork needs exactly one")
    with open("/proc/self/maps") as f:
        driver = "libcuda.so" in f.read()  # Note: loaded at the first CUDA call, by anyone
    if torch.cuda.is_initialized() or driver:  # Note: CUDA state never survives a fork
        raise RuntimeError("CUDA was touched by the imports")
    return {"torch": torch.__file__, "fsdp_mini": fsdp_mini.__file__, "threads": len(threads)}


def _send(out, msg):
    os.write(out, (json.dumps(msg) + "\n").encode())


def _become_rank(req, main, base_path, zygote_pid, private_fds):
    """In the forked child: turn into the rank a fresh `python -m ...rank_entry` would be."""
    try:
        # Note: main() makes the rank die with the zygote, and exits if the zygote died already.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in private_fds:
            os.close(fd)
        os.setsid()  # Note: its own session and process group, as with start_new_session=True
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(req["log"], os.O_WRONLY)  # Note: the caller created (truncated) it
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(req["cwd"])
        os.environ.clear()  # Note: the rank's env replaces the zygote's wholesale
        os.environ.update(req["env"])
        leading = _leading_path(req["cwd"], req["env"])
        sys.path[:] = leading[:1] + _dedupe(leading[1:] + base_path)
        sys.argv[:] = [sys.modules["__main__"].__file__, req["launch_dir"], str(req["rank"])]
        importlib.invalidate_caches()
        tempfile.tempdir = None  # Note: recomputed from the rank's TMPDIR
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()  # Note: like `random`, which reseeds itself on fork
        main(req["launch_dir"], req["rank"], parent_pid=zygote_pid)  # ends with os._exit
    except BaseException:  # noqa: BLE001  (the child must never return into the zygote's loop)
        traceback.print_exc()
    finally:
        os._exit(1)


def _reap(out):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(out, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _handle(line, out, wake, main, base_path):
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()  # Note: nothing buffered may be written twice, by the zygote and the rank
    try:
        pid = os.fork()
    except OSError as exc:
        _send(out, {"id": req["id"], "error": str(exc)})
        return
    if pid == 0:
        _become_rank(req, main, base_path, os.getppid(), [out, *wake])
    _send(out, {"id": req["id"], "pid": pid})


def serve(main, start_path, out):
    """The zygote's life: import, say ready, then fork ranks until stdin closes.

    `start_path` is sys.path as Python set it up, before any import could add to it; `out` the
    fd of the replies' pipe. rank_entry made this process die with its caller (as a rank does).
    """
    try:
        leading = _leading_path(os.getcwd(), os.environ)
        if start_path[:len(leading)] != leading:
            raise RuntimeError(f"unexpected sys.path {start_path} (expected to start {leading})")
        info = _preload()
    except BaseException:  # noqa: BLE001  (the caller falls back to fresh ranks and says why)
        _send(out, {"error": traceback.format_exc()})
        os._exit(1)
    wake = os.pipe()
    os.set_blocking(wake[1], False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)  # Note: only to wake select up via `wake`
    _send(out, {"ready": info})
    _loop(out, wake, main, start_path[len(leading):])


def _loop(out, wake, main, base_path):
    pending = b""
    while True:
        ready, _, _ = select.select([0, wake[0]], [], [])
        if wake[0] in ready:
            os.read(wake[0], 4096)
            _reap(out)
        if 0 in ready:
            data = os.read(0, 1 << 16)
            if not data:
                os._exit(0)  # Note: the caller is gone; the ranks still running die with us
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                _handle(line, out, wake, main, base_path)
            _reap(out)
