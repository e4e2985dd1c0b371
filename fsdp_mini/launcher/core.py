"""``launch`` itself, and ``run_with_torchrun``: see :mod:`fsdp_mini.launcher`."""
import os
import sys
import time
from datetime import timedelta
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from .failures import LaunchError, LaunchTimeoutError, failure_error, outcome, rank_file
from .files import LaunchDir
from .inputs import (check_backend_name, check_env, check_launch_args, check_log_dir, check_monitor,
                     check_timeout, kind, pickle_payload)
from .procs import start_ranks, stop_ranks, watch_ranks

__all__ = ["launch", "rank_device", "run_with_torchrun", "LaunchError", "LaunchTimeoutError"]


# ---------------------------------------------------------------- shared with the ranks (rank_entry)
def init_group(backend, rank, world_size, local_rank, timeout, store=None):
    """Initialise the default process group (in the ranks of `launch` and in torchrun scripts)."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # Note: before init, so NCCL binds one GPU per rank
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    if backend == "gloo":
        # Note: gloo's init returns on a rank once *its* side of the connections is up. A rank
        # whose fn then returns at once (no collective) and exits can close a connection a peer
        # is still setting up: "Connection closed by peer" in the peer's init. Seen 2 launches in
        # 30 of a trivial fn at world size 4 (ranks forked warm). One barrier: all are connected.
        dist.barrier()


def rank_device() -> torch.device:
    """This rank's device: its GPU under NCCL, the CPU under gloo (or without a process group)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------- the public entry points
def launch(fn, world_size, *args, backend=None, timeout=120.0, deadline=None, log_dir=None,
           env=None, monitor=None):
    """Run `fn(rank, world_size, *args)` on `world_size` ranks; return its return values by rank.

    Each rank is a fresh process with `torch.distributed` initialised (gloo on CPU, or NCCL with one
    GPU per rank) and destroyed after fn returns. Rank 0's log is echoed to sys.stdout while it
    runs. `env` adds environment variables to the ranks.

    Failures raise `LaunchError` naming the rank that failed first, with its traceback and log.
    Ranks are stopped for taking too long only by these rules, each with its own message in the
    `LaunchTimeoutError` it raises:

    - `timeout` (seconds, 1 to one week) bounds every collective: a rank that hangs makes its peers'
      collectives time out. It also bounds how long a rank may sit idle once another rank returned:
      one that then uses (almost) no CPU for `timeout` s is blocked (waiting for a collective its
      peers no longer join, a lock, input()...) and is stopped. A rank that keeps computing after
      its peers returned is left alone. (Without /proc, i.e. off Linux, that idle rule is off.)
    - `deadline` (seconds of wall clock from the call, default None: no limit) bounds the whole job:
      when it passes, the ranks still running are stopped, each with its Python stack in its log.

    Before a rank is killed it gets SIGTERM, which dumps its Python stack into its log (shown in
    the error), and SIGKILL a second later. No rank outlives the call, also on Ctrl-C, pressed once
    or more (KeyboardInterrupt is re-raised after the ranks are stopped).

    Logs: `rank{r}.log` in `log_dir` (kept; one launch at a time per log_dir, a second concurrent
    one is refused with ValueError), or in a temporary folder, removed on success, kept on failure
    (its path is in the error). In a log_dir the kit removes only files it wrote there (its list
    of them: `.launch.files`), and refuses to start (ValueError naming the file) when the folder
    holds a file of yours that the launch would write over (`config.json`, `rank0.log`...).
    Every argument is checked before anything starts: `env` is a mapping of names to str values.

    `monitor` watches the ranks' telemetry live (e.g. `fsdp_mini.widgets.Dashboard()`): the ranks
    get `FSDP_MINI_EVENTS_DIR`, where `fsdp_mini.telemetry.Recorder.from_env()` writes, and the
    monitor's `launch_started(world_size, events_dir)`, `launch_poll()` (from this thread, while
    waiting) and `launch_finished(ok)` are called.
    """
    started = time.monotonic()
    job = _Job(*check_launch_args(world_size, backend, timeout, deadline), started)
    log_dir, env, monitor = check_log_dir(log_dir), check_env(env), check_monitor(monitor)
    payload, sources = pickle_payload(fn, args)
    # Note: the first thing that leaves a trace; all argument checks are done. It refuses a
    # log_dir holding a file of the user's that this launch would write over (files.py).
    folder = LaunchDir(log_dir, job.world_size, events=monitor is not None)
    procs, ok, monitoring = [], False, False
    try:
        if monitor is not None:
            events_dir = folder.events_dir
            env = {**env, "FSDP_MINI_EVENTS_DIR": events_dir}
            monitor.launch_started(job.world_size, events_dir)
            monitoring = True
        results = _run(job, procs, folder, payload, sources, env,
                       monitor.launch_poll if monitoring else None)
        ok = True
    except KeyboardInterrupt:
        if procs:
            print(f"launch interrupted; stopping the ranks (logs kept in {folder.path})", file=sys.stderr)
        raise
    finally:
        try:
            stop_ranks(procs)  # Note: reached on every path, so no rank survives the call
        finally:
            try:
                if monitoring:  # Note: before the folder goes: the last events are read from it
                    monitor.launch_finished(ok)
            finally:
                folder.close(ranks_started=bool(procs), ok=ok, world_size=job.world_size)
    return results


class _Job(NamedTuple):
    """A launch's checked settings; `started` is time.monotonic() when launch was called."""
    world_size: int
    backend: str
    timeout: float
    deadline: Optional[float]
    started: float

    @property
    def deadline_at(self):
        return None if self.deadline is None else self.started + self.deadline


def _run(job, procs, folder, payload, sources, env, on_poll):
    """Start the ranks, watch them, and return their results or raise what went wrong."""
    world_size, timeout = job.world_size, job.timeout
    # Note: the caller owns the rendezvous store, on a port the OS picked (port 0): launches never
    # race for a port, and re-running a cell just gets a new one. Ranks are its clients.
    store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=timedelta(seconds=timeout),
                          wait_for_workers=False)
    try:
        folder.write_inputs(payload, {
            "world_size": world_size, "backend": job.backend, "timeout": timeout, "port": store.port,
            "parent_pid": os.getpid(), "sources": sources,
            "sys_path": [os.path.abspath(p) for p in sys.path if isinstance(p, str)]})
        start_ranks(procs, folder.path, world_size, store.port, env)
        watch = watch_ranks(procs, folder.path, timeout, job.deadline_at, on_poll)
        stop_ranks(procs)
        outcomes = [outcome(folder.path, r, p, watch.exited) for r, p in enumerate(procs)]
        if any(o["kind"] != "ok" for o in outcomes):
            raise failure_error(outcomes, folder.path, timeout, why=watch.why,
                                blocked=watch.blocked, deadline=job.deadline)
        return [torch.load(rank_file(folder.path, r, "result"), weights_only=False)
                for r in range(world_size)]
    finally:
        store = None  # Note: closes the listening socket now, not when the traceback is freed


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
    if not callable(fn):
        raise TypeError(f"run_with_torchrun(fn) must be callable as fn(rank, world_size, *args), "
                        f"got {fn!r} ({kind(fn)})")
    backend = None if backend is None else check_backend_name(backend)
    timeout = check_timeout(timeout)
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise RuntimeError(f"run_with_torchrun expects {missing} set by torchrun "
                           "(torchrun --nproc-per-node N script.py); in a notebook use launch().")
    rank, world_size, local_rank = _torchrun_env()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.device_count() > local_rank:
        raise ValueError(f'run_with_torchrun(backend="nccl") needs one GPU per rank on this node, '
                         f"and LOCAL_RANK={local_rank} has none ({torch.cuda.device_count()} "
                         'visible); use backend="gloo", or fewer ranks per node')
    init_group(backend, rank, world_size, local_rank, timeout)
    try:
        result = fn(rank, world_size, *args)
    except BaseException:
        dist.destroy_process_group()  # Note: no barrier: the other ranks may never reach one
        raise
    # Note: every rank's collectives done before the group goes: a gloo work still alive when the
    # interpreter exits aborts the process ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    return result


def _torchrun_env():
    """RANK, WORLD_SIZE and LOCAL_RANK from the environment, each a whole number in range."""
    values = {}
    for name, low in (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)):
        text = os.environ[name].strip()
        if not (text.isascii() and text.isdigit()) or int(text) < low:
            raise RuntimeError(f"run_with_torchrun: {name}={os.environ[name]!r} in the environment "
                               f"is not a whole number >= {low}; torchrun sets it (torchrun "
                               "--nproc-per-node N script.py)")
        values[name] = int(text)
    if not values["RANK"] < values["WORLD_SIZE"] or not values["LOCAL_RANK"] < values["WORLD_SIZE"]:
        raise RuntimeError(f"run_with_torchrun: RANK={values['RANK']} and LOCAL_RANK="
                           f"{values['LOCAL_RANK']} must each be below WORLD_SIZE="
                           f"{values['WORLD_SIZE']}; torchrun sets them")
    return values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"]
