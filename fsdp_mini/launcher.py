"""Run a function on N ranks from a notebook or a script, and get its return values back.

`launch(fn, world_size, *args)` starts `world_size` fresh Python processes (not `fork`, which breaks
once CUDA was touched, and not `multiprocessing`, whose spawn leaves a resource tracker behind), ships
`fn` and `args` to them *by value* with cloudpickle (so functions written in a notebook cell work),
initialises `torch.distributed` in each, runs `fn(rank, world_size, *args)` and collects the return
values from files written with `torch.save` (tensors survive; shared-memory queues do not outlive the
rank). Each rank's output goes to `rank{r}.log`; rank 0's log is echoed to the caller's stdout.

When a rank fails, the caller kills the others and raises `LaunchError` naming the rank that failed
*first*: peers that merely lost their partner ("Connection closed by peer") are consequences, not
causes. A rank that hangs makes its peers' collectives time out; that becomes `LaunchTimeoutError`.

The same training function runs under torchrun through `run_with_torchrun`.
"""
import codecs
import io
import json
import linecache
import marshal
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections import ChainMap
from datetime import timedelta
from numbers import Integral, Real

import cloudpickle
import torch
import torch.distributed as dist

from .launch_failures import LaunchError, LaunchTimeoutError, _error, _outcome, rank_file

__all__ = ["launch", "rank_device", "run_with_torchrun", "LaunchError", "LaunchTimeoutError"]

POLL_S = 0.05   # how often the caller looks at its ranks
GRACE_S = 2.0   # after the first failure, time the other ranks get to report their own error




# ---------------------------------------------------------------- shared with the ranks (_rank_entry)
def init_group(backend, rank, world_size, local_rank, timeout, store=None):
    """Initialise the default process group (in the ranks of `launch` and in torchrun scripts)."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # Note: before init, so NCCL binds one GPU per rank
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))


def rank_device() -> torch.device:
    """This rank's device: its GPU under NCCL, the CPU under gloo (or without a process group)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------- input checks (before any process)
def _check_world_size(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, Integral):
        raise TypeError(f"world_size must be an int >= 1 (the number of ranks), got {world_size!r} "
                        f"of type {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 (the number of ranks), got {world_size}")
    return int(world_size)


def _check_timeout(timeout):
    if isinstance(timeout, bool) or not isinstance(timeout, Real) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def _pick_backend(backend, world_size):
    """None means: NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        return "nccl" if 0 < world_size <= gpus else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f'backend must be None, "gloo" or "nccl", got {backend!r}')
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f'backend="nccl" needs one GPU per rank: world_size={world_size} but only '
                         f'{gpus} CUDA device(s) are visible. Use backend="gloo" (CPU) or a '
                         f"world_size <= {gpus}.")
    return backend


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, except that code objects travel with marshal and so keep their file name.

    Note: cloudpickle renames the file of functions it pickles by value (notebook cells, __main__)
    to "<dynamic-code>", so a rank's traceback would show neither the cell nor its source lines.
    marshal keeps co_filename, and the ranks run this same interpreter, so its format matches.
    """

    def __init__(self, file):
        self.filenames = set()
        # Note: the C pickler reads dispatch_table when it is initialised, so set it first.
        self.dispatch_table = ChainMap({types.CodeType: self._reduce_code}, cloudpickle.Pickler.dispatch_table)
        super().__init__(file)

    def _reduce_code(self, code):
        self.filenames.add(code.co_filename)
        return marshal.loads, (marshal.dumps(code),)


def _dumps(obj):
    """Pickle obj by value; return the bytes and the source files its functions come from."""
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.filenames


def _pickle_payload(fn, args):
    """Pickle fn and args now, so a bad argument fails here and not in N processes at once.

    Returns the payload and the source lines of files that exist only in memory (notebook cells),
    which the ranks put into their linecache so tracebacks show the offending line.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(rank, world_size, *args), got {fn!r}")
    parts = [("fn " + getattr(fn, "__qualname__", repr(fn)), fn)]
    parts += [(f"args[{i}] ({type(a).__name__})", a) for i, a in enumerate(args)]
    for what, obj in parts:
        try:
            _dumps(obj)
        except Exception as e:
            raise TypeError(
                f"launch could not pickle {what}: {type(e).__name__}: {e}. Ranks are fresh processes, "
                "so fn and args are sent by value with cloudpickle. Define the function at module "
                "level or in its own notebook cell, and do not capture locks, open files, sockets, "
                "generators or process groups in it or its arguments; create those inside fn."
            ) from e
    payload, filenames = _dumps((fn, tuple(args)))
    sources = {name: linecache.getlines(name) for name in filenames if not os.path.exists(name)}
    return payload, {name: lines for name, lines in sources.items() if lines}


# ---------------------------------------------------------------- starting and watching ranks
def _rank_env(rank, world_size, port, extra):
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if "GLOO_SOCKET_IFNAME" not in os.environ and sys.platform.startswith(("linux", "darwin")):
        # Note: all ranks are on this host; loopback avoids gloo picking an unreachable interface.
        env["GLOO_SOCKET_IFNAME"] = "lo" if sys.platform.startswith("linux") else "lo0"
    env.update({str(k): str(v) for k, v in (extra or {}).items()})
    return env


def _start_ranks(procs, launch_dir, world_size, port, extra_env):
    """Start the ranks, appending each to procs at once (so an interrupt here still stops them)."""
    for rank in range(world_size):
        with open(rank_file(launch_dir, rank, "log"), "wb") as log:
            # Note: the log is the rank's fd 1 and 2, so C/C++ output (gloo, NCCL) lands there too.
            # A new session keeps a terminal Ctrl-C away from the ranks: the caller stops them.
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "fsdp_mini._rank_entry", launch_dir, str(rank)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd(),
                env=_rank_env(rank, world_size, port, extra_env), start_new_session=True))


class _LogTail:
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


def _wait(procs, tail, launch_dir, timeout, on_poll=None):
    """Poll until all ranks exit, GRACE_S after the first failure, or `timeout` after a success.

    Returns {rank: wall time it was seen to exit}. Ranks still running are left to the caller.
    """
    exited, failed_at, done_at = {}, None, None
    while True:
        now = time.monotonic()
        for rank, p in enumerate(procs):
            if rank not in exited and p.poll() is not None:
                exited[rank] = time.time()
                if p.returncode == 0 and done_at is None:
                    done_at = now
            if failed_at is None and ((rank in exited and p.returncode != 0)
                                      or os.path.exists(rank_file(launch_dir, rank, "error"))):
                failed_at = now
        if on_poll is not None:
            on_poll()
        if failed_at is None:
            # Note: echo only while no rank has failed: what rank 0 prints after that is its own
            # "lost my peer" traceback, which would hide the real cause shown in the LaunchError.
            tail.pump()
        if len(exited) == len(procs) or (failed_at is not None and now - failed_at > GRACE_S):
            return exited
        # Note: a rank stuck outside any collective never times out by itself; once another rank
        # finished cleanly, give the rest one more `timeout` and then call it stuck.
        if failed_at is None and done_at is not None and now - done_at > timeout:
            return exited
        time.sleep(POLL_S)


def _stop(procs):
    """SIGTERM (ranks dump their Python stacks into their logs), then SIGKILL; reap every rank."""
    running = [p for p in procs if p.poll() is None]
    for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, None)):
        for p in running:
            try:
                os.killpg(p.pid, sig)  # Note: the whole process group, so the rank's children too
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (wait_s or 0)
        for p in running:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()) if wait_s else None)
            except subprocess.TimeoutExpired:
                pass
    for p in procs:
        p.wait()


# ---------------------------------------------------------------- the public entry points
def launch(fn, world_size, *args, backend=None, timeout=120.0, log_dir=None, env=None,
           monitor=None):
    """Run `fn(rank, world_size, *args)` on `world_size` ranks; return its return values by rank.

    Each rank is a fresh process with `torch.distributed` initialised (gloo on CPU, or NCCL with one
    GPU per rank) and destroyed after fn returns. `timeout` (seconds) bounds every collective: a
    rank that hangs makes the others time out, and this raises `LaunchTimeoutError`. Any other failure
    raises `LaunchError` naming the rank that failed first; a rank still running `timeout` s after
    another rank returned counts as stuck. Logs: `rank{r}.log` in `log_dir` (kept), or in a temporary
    folder that is removed on success and kept (path in the error) on failure. Rank 0's log is echoed
    to sys.stdout while it runs. `env` adds environment variables to the ranks. No rank outlives
    the call, also on Ctrl-C (KeyboardInterrupt is re-raised after the ranks are stopped).

    `monitor` watches the ranks' telemetry live (e.g. `fsdp_mini.widgets.Dashboard()`): the ranks
    get `FSDP_MINI_EVENTS_DIR`, where `fsdp_mini.telemetry.Recorder.from_env()` writes, and the
    monitor's `launch_started(world_size, events_dir)`, `launch_poll()` (from this thread, while
    waiting) and `launch_finished(ok)` are called.
    """
    world_size = _check_world_size(world_size)
    timeout = _check_timeout(timeout)
    backend = _pick_backend(backend, world_size)
    payload, sources = _pickle_payload(fn, args)
    launch_dir = _prepare_dir(log_dir)
    procs, store, ok = [], None, False
    if monitor is not None:
        events_dir = os.path.join(launch_dir, "events")
        env = {**(env or {}), "FSDP_MINI_EVENTS_DIR": events_dir}
        monitor.launch_started(world_size, events_dir)
    try:
        # Note: the caller owns the rendezvous store, on a port the OS picked (port 0): launches
        # never race for a port, and re-running a cell just gets a new one. Ranks are its clients.
        store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False)
        _write_inputs(launch_dir, payload, {
            "world_size": world_size, "backend": backend, "timeout": timeout, "port": store.port,
            "parent_pid": os.getpid(), "sources": sources,
            "sys_path": [os.path.abspath(p) for p in sys.path if isinstance(p, str)]})
        _start_ranks(procs, launch_dir, world_size, store.port, env)
        exited = _wait(procs, _LogTail(rank_file(launch_dir, 0, "log")), launch_dir, timeout,
                       monitor.launch_poll if monitor is not None else None)
        _stop(procs)
        outcomes = [_outcome(launch_dir, r, p, exited) for r, p in enumerate(procs)]
        if any(o["kind"] != "ok" for o in outcomes):
            raise _error(outcomes, launch_dir, timeout)
        results = [torch.load(rank_file(launch_dir, r, "result"), weights_only=False)
                   for r in range(world_size)]
        ok = True
    except KeyboardInterrupt:
        print(f"launch interrupted; stopping the ranks (logs kept in {launch_dir})", file=sys.stderr)
        raise
    finally:
        _stop(procs)  # Note: reached on every path, so no rank survives the call
        store = None  # closes the store's listening socket
        if monitor is not None:
            monitor.launch_finished(ok)
    _clean_up(launch_dir, world_size, keep_logs=log_dir is not None)
    return results


def _write_inputs(launch_dir, payload, config):
    with open(os.path.join(launch_dir, "payload.pkl"), "wb") as f:
        f.write(payload)
    with open(os.path.join(launch_dir, "config.json"), "w") as f:
        json.dump(config, f)


def _prepare_dir(log_dir):
    """A fresh temp dir, or the user's log_dir with files of an earlier launch removed."""
    if log_dir is None:
        return tempfile.mkdtemp(prefix="fsdp_mini_launch_")
    log_dir = os.path.abspath(log_dir)
    os.makedirs(log_dir, exist_ok=True)
    for name in os.listdir(log_dir):
        if re.fullmatch(r"rank\d+\.(log|result|error)(\.tmp)?|payload\.pkl|config\.json", name):
            os.remove(os.path.join(log_dir, name))
    return log_dir


def _clean_up(launch_dir, world_size, keep_logs):
    if not keep_logs:
        shutil.rmtree(launch_dir, ignore_errors=True)
        return
    for path in [os.path.join(launch_dir, "payload.pkl")] + [rank_file(launch_dir, r, "result") for r in range(world_size)]:
        if os.path.exists(path):
            os.remove(path)


def run_with_torchrun(fn, *args, backend=None, timeout=120.0):
    """Run `fn(rank, world_size, *args)` inside a rank started by torchrun; return its value.

    The same function then runs in a notebook through `launch` and from a shell through torchrun::

        # train.py -- run with: torchrun --nproc-per-node 2 train.py
        from fsdp_mini import run_with_torchrun

        def train(rank, world_size, steps):
            ...                      # torch.distributed is initialised here
            return loss

        if __name__ == "__main__":
            run_with_torchrun(train, 100)   # in a notebook: launch(train, 2, 100)
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise RuntimeError(f"run_with_torchrun expects {missing} set by torchrun "
                           "(torchrun --nproc-per-node N script.py); in a notebook use launch().")
    rank, world_size, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    init_group(backend, rank, world_size, local_rank, _check_timeout(timeout))
    try:
        return fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
