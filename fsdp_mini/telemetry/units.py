"""Numbers as a person reads them: sizes, rates, times, and the bandwidth of a collective.

Conventions:
- sizes are binary, the way memory is counted: 1 KiB = 1024 B, 1 MiB = 1024 KiB, ...
- rates are decimal, the nccl-tests convention: 1 GB/s = 1e9 bytes per second;
- bandwidth of a collective (nccl-tests): algbw = payload bytes / duration, and
  busbw = algbw x (N-1)/N for all-gather and reduce-scatter, x 2(N-1)/N for all-reduce,
  x 1 for broadcast. busbw is what each link carried, comparable across ops and world sizes.
"""

from __future__ import annotations

import math

from ..comm.ledger import ring_fraction

# -- readable numbers ---------------------------------------------------------------------------

def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def _three_digits(x: float) -> str:
    return f"{x:.2f}" if x < 9.995 else f"{x:.1f}" if x < 99.95 else f"{x:.0f}"


def fmt_bytes(n) -> str:
    """``12953600`` -> ``'12.4 MiB'`` (binary units, three significant digits)."""
    if _missing(n):
        return "–"
    sign, x = ("-" if n < 0 else ""), abs(float(n))
    if x < 1024:
        return f"{sign}{x:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        x /= 1024
        if x < 1023.5 or unit == "TiB":
            return f"{sign}{_three_digits(x)} {unit}"


def fmt_rate(bytes_per_second) -> str:
    """``2.5e9`` -> ``'2.50 GB/s'`` (decimal units, as nccl-tests prints them)."""
    if _missing(bytes_per_second):
        return "–"
    x = float(bytes_per_second)
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(x) >= scale * 0.9995:
            return f"{_three_digits(x / scale)} {unit}"
    return f"{x:.0f} B/s"


def fmt_seconds(seconds) -> str:
    """``0.2448`` -> ``'245 ms'``; microseconds, milliseconds, seconds or minutes."""
    if _missing(seconds):
        return "–"
    s = float(seconds)
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{_three_digits(s * 1e3)} ms"
    if s < 60:
        return f"{_three_digits(s)} s"
    return f"{int(s // 60)} min {s % 60:.0f} s"


def fmt_link(link: dict | None) -> str:
    """A simulated link of a meta event: ``{"bandwidth_gbs": 1, "latency_us": 50}`` ->
    ``'simulated link: 1 GB/s, 50 µs'`` (``''`` without one)."""
    if not link:
        return ""
    return f"simulated link: {link['bandwidth_gbs']:g} GB/s, {link['latency_us']:g} µs"


# -- bandwidth, nccl-tests convention --------------------------------------------------------------

def busbw_factor(op: str, world_size: int) -> float:
    """busbw / algbw for one collective on ``world_size`` ranks (0 for a barrier): the ring
    model's fraction of the payload each link carries, except for broadcast, which nccl-tests
    counts at 1 (every link carries the whole tensor once)."""
    return 1.0 if op == "broadcast" else ring_fraction(op, world_size)


def algbw(payload_bytes: float, seconds: float) -> float:
    return payload_bytes / seconds if seconds > 0 else float("nan")


def busbw(op: str, payload_bytes: float, seconds: float, world_size: int) -> float:
    return algbw(payload_bytes, seconds) * busbw_factor(op, world_size)


PHASES = {"forward": "all-gather, forward", "backward": "all-gather, backward",
          "grad": "reduce-scatter of grads"}  # FSDP label suffixes, in the order they happen


def phase_name(phase: str) -> str:
    return PHASES.get(phase, phase.replace("_", "-"))


def unit_and_phase(label: str, op: str) -> tuple[str, str]:
    """``'blocks.0/forward'`` -> ``('blocks.0', 'forward')``; ``'bucket3'`` -> ``('bucket3', op)``;
    every ``'sync/<param>'`` broadcast at wrap time -> ``('sync', op)``."""
    unit, _, phase = label.rpartition("/")
    if label.startswith("sync/"):
        return "sync", op
    return (unit, phase) if unit else (label, op)
