"""Interactive multi-rank mode: ranks that stay alive across notebook cells.

``launch`` starts fresh ranks for every call and hides what they hold in between. Here the ranks
are ipyparallel engines that live until you stop them, each with ``torch.distributed``
initialised, so a cell can run on every rank, and the next cell can look at what it left::

    ranks = labs.start_ranks(4)          # about 7 s: 4 engines, one process group
    %%px                                 # this cell runs on every rank
    x = torch.full((2,), float(rank))    # `rank`, `world_size`, `torch`, `dist`, `fsdp_mini`
    dist.all_reduce(x)                   #   are defined on every rank
    ranks.pull("x")                      # [tensor([6., 6.]), tensor([6., 6.]), ...] by rank
    ranks.stop()                         # no process left

``ranks.run(fn, *args)`` calls ``fn(rank, world_size, *args)`` on every rank and returns the
results by rank; ``ranks.push(name=value)`` defines names on every rank; ``ranks.execute(code)``
is ``%%px`` from Python.

Note: no process is left behind even when the notebook never reaches ``ranks.stop()`` (a failing
cell, a kernel restart, a killed kernel): every rank runs a watchdog thread that, once the
kernel's process is gone, stops the ipyparallel controller and then itself.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as dist

__all__ = ["Ranks", "start_ranks"]


def _set_up_rank(rank, world_size, port, backend, timeout, kernel_pid, controller_pid, path):
    """Runs on each engine: join the process group, watch the kernel, define the usual names."""
    import os as _os
    import sys
    import threading
    import time as _time
    from datetime import timedelta as _td

    import torch
    import torch.distributed as _dist

    import fsdp_mini

    sys.path[:0] = [p for p in path if p not in sys.path]  # the kernel's modules import here too
    torch.set_num_threads(1)  # the ranks share the machine's cores
    _os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = _dist.TCPStore("127.0.0.1", port, world_size, False, timeout=_td(seconds=timeout))
    _dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                             timeout=_td(seconds=timeout))

    def watch_kernel():
        # Note: the engine's parent is the kernel; once it is gone the engine is re-parented.
        while _os.getppid() == kernel_pid:
            _time.sleep(0.5)
        for pid in _children(_os.getpid()):  # this engine's nanny
            _kill(pid)
        _kill(controller_pid, group=True)  # Note: it leads a group with its schedulers
        _os._exit(0)

    threading.Thread(target=watch_kernel, daemon=True, name="fsdp-mini-watch-kernel").start()
    # Note: an engine is an IPython kernel; %%px cells run in its user namespace.
    from IPython import get_ipython
    get_ipython().user_ns.update(rank=rank, world_size=world_size, torch=torch, dist=_dist,
                                 fsdp_mini=fsdp_mini, _fsdp_mini_store=store)
    return _os.getpid()


class Ranks:
    """``world_size`` ipyparallel engines forming one torch.distributed process group."""

    def __init__(self, world_size: int, backend: str = "gloo", timeout: float = 60.0,
                 activate: bool = True):
        import ipyparallel as ipp

        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1 (the number of ranks), got "
                             f"{world_size!r}")
        self.world_size, self.backend = world_size, backend
        started = time.monotonic()
        self._store = dist.TCPStore("127.0.0.1", 0, world_size, True,
                                    timeout=timedelta(seconds=timeout), wait_for_workers=False)
        self._cluster = ipp.Cluster(n=world_size, log_level=40)
        self._client = self._cluster.start_and_connect_sync()
        self.pids: list[int] = []
        self._controller_pid = -1
        atexit.register(self.stop)
        try:
            self._join(timeout)
        except BaseException:
            self.stop()
            raise
        if activate:
            self.view.activate()  # registers %%px in this notebook
        print(f"{world_size} ranks ready ({backend}, {time.monotonic() - started:.1f} s): in a "
              f"%%px cell, `rank`, `world_size`, `torch`, `dist` and `fsdp_mini` are defined")

    def _join(self, timeout: float) -> None:
        ids = sorted(self._client.ids)[: self.world_size]
        self._engines = [self._client[i] for i in ids]
        self.view = self._client[ids]
        self.view.block = True
        controller = getattr(self._cluster.controller, "process", None)
        controller_pid = controller.pid if controller is not None else -1
        pending = [e.apply_async(_set_up_rank, r, self.world_size, self._store.port, self.backend,
                                 timeout, os.getpid(), controller_pid,
                                 [p for p in sys.path if isinstance(p, str)])
                   for r, e in enumerate(self._engines)]
        self.pids = [job.get(timeout=timeout + 30) for job in pending]
        self._controller_pid = controller_pid

    # -- using the ranks ------------------------------------------------------------------------

    def run(self, fn, *args) -> list:
        """``fn(rank, world_size, *args)`` on every rank at once; the results by rank."""
        jobs = [e.apply_async(fn, r, self.world_size, *args) for r, e in enumerate(self._engines)]
        return [job.get() for job in jobs]

    def execute(self, code: str) -> None:
        """Run ``code`` on every rank (what a ``%%px`` cell does)."""
        self.view.execute(code, block=True)

    def pull(self, name: str) -> list:
        """The value of ``name`` on every rank, by rank."""
        return [e.pull(name, block=True) for e in self._engines]

    def push(self, **names) -> None:
        """Define ``names`` on every rank (the same values everywhere)."""
        self.view.push(names, block=True)

    # -- stopping -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every rank and the controller; safe to call twice."""
        cluster, self._cluster = getattr(self, "_cluster", None), None
        if cluster is None:
            return
        # Note: each engine's nanny is found now: once the engines exit it has another parent.
        doomed = [c for p in self.pids for c in _children(p)] + self.pids
        try:
            cluster.stop_cluster_sync()
        except Exception:  # noqa: BLE001  (stopping must not fail: kill what is left below)
            pass
        for pid in doomed:
            _kill(pid)  # each engine's nanny, and the engine
        _kill(self._controller_pid, group=True)  # the controller and its schedulers
        self._store = None

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._cluster is None else "running"
        return f"Ranks(world_size={self.world_size}, backend={self.backend!r}, {state})"


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc (empty where there is no /proc)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def _kill(pid: int, group: bool = False) -> None:
    if pid <= 0:
        return
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except OSError:
        pass


def start_ranks(world_size: int, backend: str = "gloo", timeout: float = 60.0) -> Ranks:
    """Start ``world_size`` ranks that stay alive across cells (see the module docstring)."""
    return Ranks(world_size, backend, timeout)
