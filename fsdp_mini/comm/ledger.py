"""The ledger: every collective a rank issues, with the bytes the *algorithm* moves.

Logical bytes sent by one rank, ring model (N = world size, payload = the whole logical tensor):

==============  =================================  =========================================
op              payload                            bytes this rank sends
==============  =================================  =========================================
all_gather      the gathered (full) tensor         (N-1)/N x payload  = (N-1) x shard bytes
reduce_scatter  the full input tensor              (N-1)/N x payload  = (N-1) x shard bytes
all_reduce      the tensor                         2(N-1)/N x payload (reduce-scatter + all-gather)
broadcast       the tensor                         (N-1)/N x payload  (per-rank average of a
                                                   pipelined chain: N-1 links carry it once)
barrier         nothing                            0
==============  =================================  =========================================

Example, N = 4, all-gather of a unit whose padded flat parameter holds 8 floats (32 bytes)::

    before:  rank0 [a0 a1]  rank1 [b0 b1]  rank2 [c0 c1]  rank3 [d0 d1]      (shards, 8 B each)
    after:   every rank [a0 a1 b0 b1 c0 c1 d0 d1]                             (payload 32 B)
    ledger:  each rank sent 3/4 x 32 = 24 B  (it forwarded the 3 shards it did not own)

This table is the kit's one home of the ring model: the ledger, the formulas of
:mod:`fsdp_mini.theory` and the bandwidth figures of the dashboard all use :func:`ring_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier")


def ring_bytes(op: str, payload_bytes: float, world_size: int) -> float:
    """Bytes one rank sends in ``op`` on ``world_size`` ranks, under the ring model."""
    n = world_size
    if op in ("all_gather", "reduce_scatter", "broadcast"):
        return payload_bytes * (n - 1) / n  # Note: multiply first, so whole shards stay exact
    if op == "all_reduce":
        return 2 * payload_bytes * (n - 1) / n
    if op == "barrier":
        return 0.0
    raise ValueError(f"unknown collective {op!r}; one of {', '.join(OPS)}")


def ring_fraction(op: str, world_size: int) -> float:
    """The same, as a fraction of the payload."""
    return ring_bytes(op, 1.0, world_size)


@dataclass(frozen=True)
class Tag:
    """What a collective is for: the unit (or bucket) that asked, and the phase of the step.

    FSDP phases: ``forward`` and ``backward`` (all-gathers), ``grad`` (reduce-scatter),
    ``summon`` and ``state_dict``; buckets of ddp and zero use the op as the phase.
    """

    unit: str
    phase: str

    def __str__(self) -> str:
        return f"{self.unit}/{self.phase}"


@dataclass
class CollectiveRecord:
    """One collective as the ledger saw it."""

    op: str
    label: str          # for display only; ``unit`` and ``phase`` say what it was for
    payload_bytes: int
    sent_bytes: float
    step: int
    start: float  # wall clock (time.time()) when it was issued
    seconds: float = float("nan")  # issue -> completion seen by this rank (host clock)
    unit: str = ""
    phase: str = ""
    group: str = "world"  # which process group: the whole world, or (HSDP) a part of it
    waited: float = 0.0   # seconds after issue when this rank began to wait for it (0: blocking)
    # With a simulated link (fsdp_mini.Link), else nan: the α-β seconds it occupied the link,
    # and the seconds from issue until the link began it (queued behind earlier collectives).
    simulated_seconds: float = float("nan")
    simulated_queue: float = float("nan")


@dataclass
class OpTotal:
    calls: int = 0
    payload_bytes: int = 0
    sent_bytes: float = 0.0
    seconds: float = 0.0


@dataclass
class Ledger:
    """Per-rank list of collectives, with totals per op and per step.

    ``step`` numbers the training steps, so totals can be asked per step. It advances by itself:
    ``optimizer.step()`` of a parallelized model closes the current step, and the next collective
    opens the following one. A loop may also call ``ledger.next_step()`` itself (at the start or
    the end of each iteration); a step is never counted twice. Listeners (``subscribe``) are
    called with each record once it has completed.
    """

    records: list[CollectiveRecord] = field(default_factory=list)
    step: int = 0
    _listeners: list[Callable[[CollectiveRecord], None]] = field(default_factory=list)
    _step_closed: bool = False

    def next_step(self) -> int:
        """Start a new step now."""
        self.step += 1
        self._step_closed = False
        return self.step

    def step_done(self) -> None:
        """The optimizer stepped: the next collective belongs to the next step."""
        self._step_closed = True

    def _step_for_new_record(self) -> int:
        if self._step_closed:
            self.next_step()
        return self.step

    def reset(self) -> None:
        """Forget all records (the step counter is kept)."""
        self.records.clear()

    def subscribe(self, listener: Callable[[CollectiveRecord], None]) -> None:
        self._listeners.append(listener)

    def _issued(self, record: CollectiveRecord) -> None:
        self.records.append(record)

    def _completed(self, record: CollectiveRecord) -> None:
        for listener in self._listeners:
            listener(record)

    def select(self, step: int | None = None, op: str | None = None) -> list[CollectiveRecord]:
        return [r for r in self.records
                if (step is None or r.step == step) and (op is None or r.op == op)]

    def totals(self, step: int | None = None) -> dict[str, OpTotal]:
        """Totals per op, over all records or over one step."""
        out: dict[str, OpTotal] = {}
        for r in self.select(step):
            t = out.setdefault(r.op, OpTotal())
            t.calls += 1
            t.payload_bytes += r.payload_bytes
            t.sent_bytes += r.sent_bytes
            t.seconds += r.seconds
        return out

    def sent_bytes(self, step: int | None = None) -> float:
        return sum(r.sent_bytes for r in self.select(step))

    def steps(self) -> list[int]:
        return sorted({r.step for r in self.records})


