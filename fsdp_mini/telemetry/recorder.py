"""The rank side of telemetry: a :class:`Recorder` turns the engine's phase marks, the ledger's
collectives and the training loop's steps into events, and appends them to
``events_rank{r}.jsonl`` in one folder, a batch at a time (see :mod:`fsdp_mini.telemetry`).
"""

from __future__ import annotations

import json
import math
import os
import time

import torch.distributed as dist

from ..comm.ledger import CollectiveRecord
from .live_memory import LiveMemory

EVENTS_DIR_ENV = "FSDP_MINI_EVENTS_DIR"


class Recorder:
    """Rank side: collects this rank's events and writes them to ``directory`` (if any)."""

    def __init__(self, directory: str | None = None, rank: int | None = None, run: str = "run",
                 flush_seconds: float = 0.1, device_memory=None):
        initialised = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
        self.world_size = dist.get_world_size() if initialised else 1  # until attach() says
        self.run, self.flush_seconds = run, flush_seconds
        self.events: list[dict] = []     # everything recorded, kept for the rank's own use
        self._pending: list[str] = []
        self._last_flush = time.time()
        self._file = None
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            self._file = open(os.path.join(directory, f"events_rank{self.rank}.jsonl"), "a")
        self.model = self.ledger = self.live = None
        self.device_memory = device_memory  # None: the GPU's own figures on CUDA ranks
        self._step_start = None
        self.paused = False

    @classmethod
    def from_env(cls, run: str = "run", **kwargs) -> "Recorder":
        """A recorder writing where ``launch(..., monitor=...)`` (or ``FSDP_MINI_EVENTS_DIR``)
        says; without that variable it only keeps events in ``recorder.events``."""
        return cls(os.environ.get(EVENTS_DIR_ENV), run=run, **kwargs)

    # -- called by parallelize and by the engine ------------------------------------------------

    def attach(self, model, optimizer) -> None:
        """Start recording a parallelized model (``parallelize(..., recorder=rec)`` calls it)."""
        engine = model.fsdp_mini
        self.model, self.ledger = model, engine.comm.ledger
        # Note: the strategy's own group, not the world's; under hsdp, every group together
        self.world_size = getattr(engine, "world_comm", engine.comm).world_size
        self.ledger.subscribe(self._collective)
        self.live = LiveMemory(model, optimizer, device_memory=self.device_memory)
        # Note: autograd's saved-tensor hooks are on only from a forward to the end of its step
        # (the optimizer's post-step hook), not for the whole life of the recorder.
        model.register_forward_pre_hook(lambda *_: self._watch_activations(True))
        # Note: the model state kept between steps is whole right after the step, before
        # the training loop's zero_grad() frees the gradients: sampled once the strategy's own
        # after-step work is done too (ZeRO-1 frees its gradient shard there), not in torch's
        # step post-hook, which runs inside optimizer.step() before it.
        engine.step_listeners.append(self._after_optimizer_step)
        units = [{"name": u.name, "bytes": u.padded_bytes} for u in getattr(engine, "units", [])]
        device = next(iter(model.parameters())).device
        self._emit("meta", time=time.time(), world_size=self.world_size,
                   strategy=engine.strategy, params=sum(engine.numel()), units=units,
                   theory=engine.expected_costs(),
                   formulas=engine.formulas(engine.element_size()), device=str(device),
                   backend=dist.get_backend() if self.world_size > 1 else "none",
                   **_link_fields(engine.comm))
        for record in self.ledger.records:  # what happened before we listened (wrap-time sync)
            self._collective(record)
        self.ledger.next_step()
        self._step_start = time.time()
        self.mark("step_start")

    def mark(self, label: str) -> None:
        """A memory snapshot at a phase boundary (``label`` may carry ``unit`` and ``phase``)."""
        if self.live is None or self.paused:
            return
        total, by_category = self.live.sample()
        extra = {"cuda": cuda} if (cuda := self.live.cuda()) else {}
        if hasattr(label, "unit"):
            extra.update(unit=label.unit, phase=label.phase)
        self._emit("memory", time=time.time(), label=str(label), total_bytes=total,
                   by_category=by_category, **extra)

    def _watch_activations(self, on: bool) -> None:
        if self.live is None or self.live.active == on or (on and self.paused):
            return
        if on:
            self.live.__enter__()
        else:
            self.live.__exit__(None, None, None)

    def _after_optimizer_step(self) -> None:
        self.mark("optimizer_step")
        self._watch_activations(False)

    def _collective(self, r: CollectiveRecord) -> None:
        # Note: the simulated transfer (sim_start, sim_end) only with a simulated link.
        sim = ({"sim_start": r.start + r.simulated_queue,
                "sim_end": r.start + r.simulated_queue + r.simulated_seconds}
               if math.isfinite(r.simulated_seconds) else {})
        self._emit("collective", step=r.step, op=r.op, unit=r.unit, phase=r.phase, group=r.group,
                   label=r.label, payload_bytes=r.payload_bytes, sent_bytes=r.sent_bytes,
                   start=r.start, end=r.start + r.seconds, waited=r.start + r.waited, **sim)

    # -- called by the training loop ------------------------------------------------------------

    def step_end(self, loss) -> None:
        """Close this step (with its loss) and open the next one."""
        if self.paused:
            self.ledger.next_step()
            return
        now = time.time()
        self.mark("step_end")
        self._emit("step", loss=float(loss), start=self._step_start, end=now)
        self.ledger.next_step()
        self._step_start = now
        self.flush(force=False)

    def pause(self) -> None:
        """Stop recording (e.g. around evaluation) until ``resume()``."""
        self._watch_activations(False)
        self.paused = True

    def resume(self) -> None:
        self.paused = False  # activations are watched again from the next forward on
        self._step_start = time.time()

    def close(self) -> None:
        self._watch_activations(False)
        self.live = None
        self._emit("end", time=time.time())
        self.flush(force=True)
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------------

    def _emit(self, kind: str, **fields) -> None:
        if self.paused and kind != "end":
            return
        step = fields.pop("step", self.ledger.step if self.ledger is not None else 0)
        event = {"type": kind, "rank": self.rank, "step": step, "run": self.run, **fields}
        self.events.append(event)
        if self._file is not None:
            self._pending.append(json.dumps(event))
            self.flush(force=False)

    def flush(self, force: bool = True) -> None:
        """Write pending events; unless forced, at most once per ``flush_seconds``."""
        now = time.time()
        if self._file is None or not self._pending or (
                not force and now - self._last_flush < self.flush_seconds):
            return
        self._file.write("\n".join(self._pending) + "\n")
        self._file.flush()
        self._pending.clear()
        self._last_flush = now


def _link_fields(comm) -> dict:
    """``{"link": {"bandwidth_gbs", "latency_us"}}`` for a simulated link, else nothing."""
    link = getattr(comm, "link", None)
    return {"link": link.as_dict()} if link is not None else {}
