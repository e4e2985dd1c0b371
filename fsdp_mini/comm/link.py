"""A simulated network: every collective takes at least its α-β ring time on a slow link.

On one machine gloo moves bytes through shared memory in microseconds, so communication looks
free and sharding looks like a bargain. ``parallelize(..., link=Link(bandwidth_gbs=1.0,
latency_us=50))`` gives each rank a link of that bandwidth β and per-message latency α, and makes
every collective complete no earlier than its α-β cost after it was issued (the ring model):

==============  ====================  =======================================
op              latency terms         bandwidth term (bytes = ledger payload)
==============  ====================  =======================================
all_gather      (N-1) α               (N-1)/N x bytes / β
reduce_scatter  (N-1) α               (N-1)/N x bytes / β
all_reduce      2(N-1) α              2(N-1)/N x bytes / β  (reduce-scatter + all-gather)
broadcast       (N-1) α               (N-1)/N x bytes / β   (a pipelined chain: N-1 hops)
barrier         (N-1) α               0
==============  ====================  =======================================

The bandwidth term is the ledger's own ring model, :func:`fsdp_mini.comm.ledger.ring_bytes` / β, so
the bytes a learner reads in the ledger are exactly the bytes the link is charged for.

Worked example, N = 4, all-gather of a 4 MB unit (payload 4·10⁶ B) at 1 GB/s, 50 µs::

    latency:    3 x 50 µs                   = 0.15 ms
    bandwidth:  3/4 x 4·10⁶ B / 10⁹ B/s     = 3.00 ms
    cost:                                     3.15 ms   (an all-reduce of it: 6.30 ms)

A rank has one link. Collectives in flight at once share it: the link is a FIFO queue, and a
collective's simulated transfer starts at max(its issue time, the previous one's simulated end)
and ends cost later. So no step finishes faster than its bytes ÷ bandwidth, however much it
overlaps. ``Handle.wait()`` returns at max(real completion, simulated end): a collective hidden
behind enough compute costs nothing at ``wait()``, one that is not shows up; a blocking collective
waits its full simulated time.

Each ``Link`` object is one rank's link (each rank process gets its own copy when the Link is
sent to the ranks); models parallelized with the same object on a rank share its queue. At world
size 1 (no process group) nothing is sent, every cost is 0 and a Link has no effect. A Link only
changes *time*: the numbers a model computes are the same with or without it.
"""

from __future__ import annotations

import math
from numbers import Real

from .ledger import OPS, ring_bytes

__all__ = ["Link", "latency_steps"]


def latency_steps(op: str, world_size: int) -> int:
    """How many α a collective pays: the messages one rank sends one after another in the ring.

    >>> latency_steps("all_gather", 4), latency_steps("all_reduce", 4), latency_steps("barrier", 1)
    (3, 6, 0)
    """
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; one of {', '.join(OPS)}")
    return (2 if op == "all_reduce" else 1) * (world_size - 1)


class Link:
    """One rank's simulated link: ``bandwidth_gbs`` (10⁹ bytes/s) and ``latency_us`` per message.

    >>> link = Link(bandwidth_gbs=1.0, latency_us=50)
    >>> round(link.cost("all_gather", 4_000_000, world_size=4) * 1e3, 3)   # milliseconds
    3.15
    """

    def __init__(self, bandwidth_gbs: float, latency_us: float = 0.0):
        self.bandwidth_gbs = _checked("bandwidth_gbs", bandwidth_gbs,
                                      "a finite number of GB/s > 0, e.g. 1.0",
                                      lambda v: 0 < v < math.inf)
        self.latency_us = _checked("latency_us", latency_us,
                                   "a finite number of microseconds >= 0, e.g. 50",
                                   lambda v: 0 <= v < math.inf)
        self._free_at = 0.0  # perf_counter time at which the link ends its last transfer

    @property
    def bytes_per_second(self) -> float:
        return self.bandwidth_gbs * 1e9

    @property
    def latency_seconds(self) -> float:
        return self.latency_us * 1e-6

    def cost(self, op: str, payload_bytes: float, world_size: int) -> float:
        """Seconds ``op`` occupies the link: latency terms + ring bytes / bandwidth."""
        return (latency_steps(op, world_size) * self.latency_seconds
                + ring_bytes(op, payload_bytes, world_size) / self.bytes_per_second)

    def reserve(self, issued: float, seconds: float) -> float:
        """Queue a transfer of ``seconds`` issued at ``issued`` (perf_counter); return when the
        link begins it: after the transfers already queued (FIFO)."""
        start = max(issued, self._free_at)
        self._free_at = start + seconds
        return start

    def describe(self) -> str:
        """``'1 GB/s, 50 µs'``: for notes on tables and dashboards."""
        return f"{self.bandwidth_gbs:g} GB/s, {self.latency_us:g} µs"

    def as_dict(self) -> dict:
        return {"bandwidth_gbs": self.bandwidth_gbs, "latency_us": self.latency_us}

    def __repr__(self) -> str:
        return f"Link(bandwidth_gbs={self.bandwidth_gbs:g}, latency_us={self.latency_us:g})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Link) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash((self.bandwidth_gbs, self.latency_us))

    # Note: a copy (sent to a rank, pickled in a config) is a fresh, idle link: the queue of
    # this process's transfers means nothing to another process.
    def __getstate__(self) -> dict:
        return self.as_dict()

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)


def _checked(name: str, value, what: str, ok) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"Link {name} must be {what}; got {value!r} ({type(value).__name__})")
    if not ok(float(value)):  # Note: also false for nan
        raise ValueError(f"Link {name} must be {what}; got {value!r}")
    return float(value)
