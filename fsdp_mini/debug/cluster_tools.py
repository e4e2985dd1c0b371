"""torch's own debugging switches, tried live on gloo ranks.

A job is started with an environment variable set and its outcome kept, never raised::

    job = run_job(mismatched_all_reduce, 2, env=DETAIL_ENV)   # TORCH_DISTRIBUTED_DEBUG=DETAIL
    job.error.message      # torch's wrapper names the shapes each rank passed
    cost = detail_overhead(2, steps=20)
    cost["detail_s"] / cost["off_s"]    # what DETAIL costs a step of a small fsdp job

Each launch has a short collective ``timeout`` and a ``deadline``: no rank outlives a call.
Note: a ``TORCH_*`` variable makes the launcher start its warm-start helper anew (torch reads
those while importing), so a job with one costs a few seconds more than a plain one.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..api import parallelize
from ..launcher import LaunchError, launch
from .small_data import debug_batch, debug_net, debug_sgd

DETAIL_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
# Note: INIT prints the rings (rank 0's "Channel NN/MM :" lines) and the transports chosen;
# GRAPH the topology search, NET the network plugin and interface, ENV the NCCL_* settings read
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,NET,ENV"}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_TIMEOUT = 10     # seconds a collective may wait in a job of this section
JOB_DEADLINE = 60    # seconds a whole job may take


class JobRun(NamedTuple):
    """A finished job: its ranks' return values, or the error it failed with; its wall time;
    each rank's log (what it printed, C++ libraries' lines included) when asked for."""
    results: Optional[list]
    error: Optional[LaunchError]
    seconds: float
    logs: Optional[dict] = None


def run_job(fn, world_size: int, *args, env: Optional[dict] = None, backend: str = "gloo",
            timeout: float = JOB_TIMEOUT, deadline: float = JOB_DEADLINE,
            keep_logs: bool = False) -> JobRun:
    """``fsdp_mini.launch(fn, world_size, *args)`` with ``env`` added to the ranks'
    environment; a failure is returned in ``.error``, not raised; ``keep_logs``: the ranks'
    logs in ``.logs`` (rank → text).

    Example: ``run_job(mismatched_all_reduce, 2, env=DETAIL_ENV).error.message`` is torch's
    own report of the mismatch.
    """
    if env is not None and not all(isinstance(k, str) and isinstance(v, str)
                                   for k, v in dict(env).items()):
        raise TypeError(f"env must map names to strings, e.g. {DETAIL_ENV}; got {env!r}")
    log_dir = tempfile.mkdtemp(prefix="fsdp_mini_job_") if keep_logs else None
    started, results, error = time.perf_counter(), None, None
    try:
        results = launch(fn, world_size, *args, backend=backend, timeout=timeout,
                         deadline=deadline, env=env, log_dir=log_dir)
    except LaunchError as err:
        error = err
    finally:
        logs = _read_logs(log_dir) if log_dir else {}
        if log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
    return JobRun(results, error, time.perf_counter() - started, logs)


def _read_logs(log_dir) -> dict:
    logs = {}
    for path in glob.glob(os.path.join(log_dir, "rank*.log")):
        rank = os.path.basename(path)[len("rank"):-len(".log")]
        if rank.isdigit():
            with open(path, errors="replace") as f:
                logs[int(rank)] = f.read()
    return logs


def is_library(path: str) -> bool:
    """Is this frame's file torch's, fsdp_mini's or frozen stdlib's (not the user's own code)?"""
    return (path.startswith((_PACKAGE + os.sep, "<frozen"))
            or os.sep + "torch" + os.sep in path)


def user_frame(frames) -> str:
    """``"train at cell.py:13"``: the innermost of ``frames`` (innermost first; each a tuple
    (file, line, function)) that is the user's own code; "" when none is."""
    for path, line, name in frames:
        if not is_library(path):
            return f"{name} at {path}:{line}"
    return ""


# ---------------------------------------------------------------- the bug DETAIL catches
def mismatched_all_reduce(rank: int, world_size: int, numel: int = 4) -> str:
    """One matched all-reduce, then the bug: rank 1 all-reduces ``numel - 1`` elements where
    the others all-reduce ``numel``."""
    torch.set_num_threads(1)
    dist.all_reduce(torch.ones(numel))                 # the same on every rank: fine
    dist.all_reduce(torch.ones(numel - (rank == 1)))   # the bug: another shape on rank 1
    return "done"


def nccl_all_reduce(rank: int, world_size: int) -> float:
    """One all-reduce on this rank's GPU (run it with ``backend="nccl"``): the sum of ranks."""
    tensor = torch.full((1024,), float(rank), device=f"cuda:{torch.cuda.current_device()}")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    return tensor[0].item()


def backend_name(group=None) -> str:
    """The class of the CPU backend behind a process group: ``"ProcessGroupGloo"``, or
    ``"_ProcessGroupWrapper"`` under TORCH_DISTRIBUTED_DEBUG=DETAIL (the wrapper that checks)."""
    group = group or dist.group.WORLD
    try:
        return type(group._get_backend(torch.device("cpu"))).__name__
    except (AttributeError, RuntimeError):  # Note: a private API; older torch may lack it
        return "unknown"


# ---------------------------------------------------------------- what DETAIL costs
def timed_fsdp_steps(rank: int, world_size: int, steps: int) -> dict:
    """Train the debug net under fsdp for ``steps`` steps, 12 rows a step; the fastest step's
    seconds (after one step of warm-up) and the backend class in use. Note: the fastest step,
    not the median: on shared cores other jobs only ever add time, so the least disturbed step
    is the closest to what the work itself costs."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, optimizer = parallelize(debug_net(), "fsdp", optimizer=debug_sgd)
    seconds = []
    for step in range(steps + 1):
        x, y = debug_batch(step % 3, rank, world_size)
        started = time.perf_counter()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - started)
    return {"step_s": min(seconds[1:]), "backend": backend_name()}


def detail_overhead(world_size: int, steps: int = 20) -> dict[str, Any]:
    """The fastest step time of the same small fsdp job without and with DETAIL (rank 0's).

    Example: ``detail_overhead(2, 20)`` → ``{"off_s": ..., "detail_s": ..., "off_backend":
    "ProcessGroupGloo", "detail_backend": "_ProcessGroupWrapper"}``. Raises if a job failed.
    """
    if not isinstance(steps, int) or steps < 3:
        raise ValueError(f"steps must be an int of at least 3 (the fastest of a few); got {steps!r}")
    out = {}
    # Note: DETAIL first, right after the section's other DETAIL job: a TORCH_* variable
    # restarts the launcher's warm-start helper, and in this order it restarts once less
    for name, env in (("detail", DETAIL_ENV), ("off", None)):
        job = run_job(timed_fsdp_steps, world_size, steps, env=env)
        if job.error is not None:
            raise RuntimeError(f"the timed job ({name}) failed:\n{job.error}") from job.error
        out[f"{name}_s"] = job.results[0]["step_s"]
        out[f"{name}_backend"] = job.results[0]["backend"]
    return out
