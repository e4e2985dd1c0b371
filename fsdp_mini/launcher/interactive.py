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
cell, a kernel restart, a killed kernel, killed engines): the controller and the engines are
started by a keeper process that ends them all once the kernel is gone
(:mod:`fsdp_mini.launcher.keeper`). A ``%%px`` cell after a rank has died says which rank
and what to do.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch.distributed as dist

from .keeper import alive, descendants, kill

KEEPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keeper.py")

__all__ = ["RankDiedError", "Ranks", "start_ranks"]


def _set_up_rank(rank, world_size, port, backend, timeout, path):
    """Runs on each engine: join the process group, define the usual names."""
    import os as _os
    import sys
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
    # Note: an engine is an IPython kernel; %%px cells run in its user namespace.
    from IPython import get_ipython
    get_ipython().user_ns.update(rank=rank, world_size=world_size, torch=torch, dist=_dist,
                                 fsdp_mini=fsdp_mini, _fsdp_mini_store=store)
    return _os.getpid()


class RankDiedError(RuntimeError):
    """A rank of an interactive job is gone: its process group cannot be used any more."""


class Ranks:
    """``world_size`` ipyparallel engines forming one torch.distributed process group."""

    def __init__(self, world_size: int, backend: str = "gloo", timeout: float = 60.0,
                 activate: bool = True):
        import ipyparallel as ipp

        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1 (the number of ranks), got "
                             f"{world_size!r}")
        self.world_size, self.backend = world_size, backend
        self.pids: list[int] = []
        self._client = None
        started = time.monotonic()
        self._store = dist.TCPStore("127.0.0.1", 0, world_size, True,
                                    timeout=timedelta(seconds=timeout), wait_for_workers=False)
        self._keeper = _Keeper(world_size)
        atexit.register(self.stop)
        try:
            where = self._keeper.wait_until_ready(timeout + 30)
            self._client = ipp.Client(where, timeout=timeout)  # Note: the file, positionally
            self._client.wait_for_engines(world_size, timeout=timeout)
            self._join(timeout)
        except BaseException:
            self.stop()
            raise
        if activate:
            self.view.activate()  # registers %%px in this notebook
            self._guard_px()
        print(f"{world_size} ranks ready ({backend}, {time.monotonic() - started:.1f} s): in a "
              f"%%px cell, `rank`, `world_size`, `torch`, `dist` and `fsdp_mini` are defined")

    @property
    def keeper_pid(self) -> int:
        """The process that started the controller and engines, and ends them (keeper.py)."""
        return self._keeper.process.pid

    def _join(self, timeout: float) -> None:
        ids = sorted(self._client.ids)[: self.world_size]
        self._engines = [self._client[i] for i in ids]
        self.view = self._client[ids]
        self.view.block = True
        pending = [e.apply_async(_set_up_rank, r, self.world_size, self._store.port, self.backend,
                                 timeout, [p for p in sys.path if isinstance(p, str)])
                   for r, e in enumerate(self._engines)]
        self.pids = [job.get(timeout=timeout + 30) for job in pending]

    def check_alive(self) -> None:
        """A clear error if a rank has died (its process group is broken from then on)."""
        if self._client is None:
            raise RankDiedError("these ranks were stopped; start new ones: ranks = "
                                f"labs.start_ranks({self.world_size})")
        dead = [(r, pid) for r, pid in enumerate(self.pids) if not alive(pid)]
        if dead:
            which = ", ".join(f"rank {r} (pid {pid})" for r, pid in dead)
            raise RankDiedError(
                f"{which} {'has' if len(dead) == 1 else 'have'} died, so the ranks' process group "
                f"is broken: a collective would hang or fail, and what the rank held is lost. "
                f"Stop these ranks and start new ones: ranks.stop(); ranks = labs.start_ranks("
                f"{self.world_size}), then run the cells that set them up again.")

    def _guard_px(self) -> None:
        """``%%px`` and ``%px`` check that every rank is alive first (see check_alive)."""
        from IPython import get_ipython
        from IPython.core.error import UsageError
        magics = get_ipython().magics_manager.magics

        def guarded(magic):
            def px(*args, **kwargs):
                try:
                    self.check_alive()
                except RankDiedError as e:
                    raise UsageError(str(e)) from None  # Note: IPython shows it in one line
                return magic(*args, **kwargs)
            return px
        for kind in ("cell", "line"):
            if "px" in magics[kind]:
                magics[kind]["px"] = guarded(magics[kind]["px"])

    # -- using the ranks ------------------------------------------------------------------------

    def run(self, fn, *args) -> list:
        """``fn(rank, world_size, *args)`` on every rank at once; the results by rank."""
        self.check_alive()
        jobs = [e.apply_async(fn, r, self.world_size, *args) for r, e in enumerate(self._engines)]
        return [job.get() for job in jobs]

    def execute(self, code: str) -> None:
        """Run ``code`` on every rank (what a ``%%px`` cell does)."""
        self.check_alive()
        self.view.execute(code, block=True)

    def pull(self, name: str) -> list:
        """The value of ``name`` on every rank, by rank."""
        self.check_alive()
        return [e.pull(name, block=True) for e in self._engines]

    def push(self, **names) -> None:
        """Define ``names`` on every rank (the same values everywhere)."""
        self.check_alive()
        self.view.push(names, block=True)

    # -- stopping -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every rank and the controller; safe to call twice."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close(linger=0)
            except Exception:  # noqa: BLE001  (stopping must not fail)
                pass
        keeper, self._keeper = getattr(self, "_keeper", None), None
        if keeper is not None:
            keeper.stop()
        self._store = None

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._keeper is None else "running"
        return f"Ranks(world_size={self.world_size}, backend={self.backend!r}, {state})"


class _Keeper:
    """The kernel's side of :mod:`fsdp_mini.launcher.keeper`: start it, hear where the
    cluster is, tell it to stop (and kill its whole tree if it does not)."""

    def __init__(self, world_size: int):
        self.log = tempfile.TemporaryFile()  # its stderr, for the error if it fails
        # Note: run as a file: it needs only the standard library and ipyparallel
        self.process = subprocess.Popen(
            [sys.executable, KEEPER, str(os.getpid()), str(world_size),
             f"fsdp-mini-{os.getpid()}-{secrets.token_hex(4)}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            start_new_session=True)

    def wait_until_ready(self, timeout: float) -> str:
        """The path of the controller's connection file, once the cluster runs."""
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        message = json.loads(line) if line.startswith("{") else {}
        if "client_file" in message:
            return message["client_file"]
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace").strip().splitlines()[-5:]
        why = message.get("error") or (f"it did not start within {timeout:.0f} s" if not ready
                                       else "it stopped")
        raise RuntimeError(f"the ranks could not be started: {why}" +
                           ("\n" + "\n".join(tail) if tail else ""))

    def stop(self, timeout: float = 10.0) -> None:
        tree = descendants(self.process.pid)
        try:
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        except OSError:
            pass  # Note: already gone
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in [self.process.pid] + descendants(self.process.pid) + tree:
                kill(pid)
            self.process.wait()
        self.process.stdout.close()
        self.log.close()


def start_ranks(world_size: int, backend: str = "gloo", timeout: float = 60.0) -> Ranks:
    """Start ``world_size`` ranks that stay alive across cells (see the module docstring)."""
    return Ranks(world_size, backend, timeout)
