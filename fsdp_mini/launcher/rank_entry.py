"""One rank started by `fsdp_mini.launch`: `python -m fsdp_mini.launcher.rank_entry LAUNCH_DIR RANK`.

The caller has written `config.json` and `payload.pkl` (cloudpickled fn and args) into LAUNCH_DIR and
pointed this process's stdout/stderr at `rank{RANK}.log`. This rank writes back either
`rank{RANK}.result` (torch.save of fn's return value) or `rank{RANK}.error` (JSON with the exception
type, message, traceback, frames and the time it happened, which the caller uses to find the first
failure).
"""
import atexit
import ctypes
import faulthandler
import json
import linecache
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta


def _die_with_parent(parent_pid):
    """Make sure this rank does not outlive the caller, even when the caller is SIGKILLed.

    Note: on Linux the kernel sends us SIGKILL when the parent dies (PR_SET_PDEATHSIG). It fires when
    the parent *thread* that started us exits, which is fine: that thread waits for us. The getppid
    check covers a parent that died before prctl ran; elsewhere a thread polls getppid.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(1)
    if sys.platform.startswith("linux"):
        return

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


def _write_atomically(path, write):
    """write(tmp_path), then rename: the caller never reads a half-written file."""
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def _write_error(path, exc):
    """Record exc for the caller (JSON) and print its traceback into this rank's log."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    tb = exc.__traceback__
    tb = tb.tb_next or tb  # start at the user's fn, not at main() below
    # Note: the frames (file, line, function) let the caller tell an error that torch.distributed
    # raised (a lost peer: a consequence) from the user's own, whatever the message says.
    record = {"type": name, "message": str(exc), "time": time.time(),
              "traceback": "".join(traceback.format_exception(kind, exc, tb)),
              "frames": [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(tb)]}
    sys.stderr.write(record["traceback"])

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(record, f)
    _write_atomically(path, write)


def main(launch_dir, rank, parent_pid=None):
    """Run rank `rank` of the launch in launch_dir; parent_pid: the zygote's, if it forked us."""
    with open(os.path.join(launch_dir, "config.json")) as f:
        cfg = json.load(f)
    _die_with_parent(cfg["parent_pid"] if parent_pid is None else parent_pid)
    faulthandler.enable()  # a segfault in C code still leaves a Python stack in the log
    # Note: the caller stops stuck ranks with SIGTERM; dump every thread's stack first, then die.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    # The caller's import path, so functions pickled by reference (importable modules) resolve.
    sys.path[:0] = [p for p in cfg["sys_path"] if p not in sys.path]
    # Source lines of notebook cells, which exist only in the caller's memory, for tracebacks.
    for name, lines in cfg["sources"].items():
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)

    import cloudpickle
    import torch
    import torch.distributed as dist

    # Note: imported here, not at the top: fsdp_mini.launcher must never import this module, or
    # `python -m fsdp_mini.launcher.rank_entry` would find it imported twice (runpy warns about that).
    from fsdp_mini.launcher.core import init_group
    from fsdp_mini.launcher.failures import rank_file

    torch.set_num_threads(1)  # ranks share the machine's cores; more threads only oversubscribe
    try:
        with open(os.path.join(launch_dir, "payload.pkl"), "rb") as f:
            fn, args = cloudpickle.load(f)
        store = dist.TCPStore("127.0.0.1", cfg["port"], cfg["world_size"], False,
                              timeout=timedelta(seconds=cfg["timeout"]))
        init_group(cfg["backend"], rank, cfg["world_size"], rank, cfg["timeout"], store=store)
        result = fn(rank, cfg["world_size"], *args)
        # Note: torch.save keeps tensors intact; cloudpickle handles classes defined in a notebook.
        _write_atomically(rank_file(launch_dir, rank, "result"),
                          lambda tmp: torch.save(result, tmp, pickle_module=cloudpickle))
    except BaseException as exc:  # KeyboardInterrupt and SystemExit are failures of fn too
        _write_error(rank_file(launch_dir, rank, "error"), exc)
        sys.stdout.flush()
        sys.stderr.flush()
        # Note: exit at once, without tearing down the process group: peers blocked in a collective
        # then see "connection closed" right away instead of waiting for the timeout.
        os._exit(1)
    dist.destroy_process_group()
    # Note: leave without the interpreter's teardown. Its C++ destructors (a communication thread
    # still joinable) can abort a rank whose work is done and saved ("terminate called without an
    # active exception"): seen once in CI. Exit handlers and output are flushed first.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:  # the warm starter, which forks ranks that then run main
        # Note: before the zygote's own imports: the caller may die meanwhile, and a print must
        # not reach the pipe of replies (fd 1, kept as `replies`; fd 1 itself goes to /dev/null).
        # `-m` has imported the fsdp_mini package (torch: seconds, more on a loaded machine)
        # before this line runs; a caller that died during that is seen here (its pid is no
        # longer our parent's) and the zygote exits, having started nothing.
        _die_with_parent(int(os.environ["FSDP_MINI_ZYGOTE_CALLER"]))
        replies, start_path, null = os.dup(1), list(sys.path), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        from fsdp_mini.launcher.zygote import serve
        serve(main, start_path, replies)
    else:
        main(sys.argv[1], int(sys.argv[2]))
