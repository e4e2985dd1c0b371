"""Step time: the compute, plus the communication the overlap does not hide, plus offload.

Compute per GPU and step: 6Ψ FLOPs per token (2Ψ forward, 4Ψ backward), 8Ψ with full
activation checkpointing (the forward again in backward), at ``efficiency`` x the GPU's peak
(attention's s² term is left out: small against 6Ψ for s ≤ 4k at these widths). Communication
runs on its own stream beside the compute, as NCCL does on GPUs; what it cannot hide:

    ddp, zero2   buckets reduced during backward: hidden up to the backward's length, except the
                 last bucket (ready only when backward ends); zero2's all-gather after the step
    zero1        reduce-scatter and all-gather at optimizer.step(): nothing hidden
    fsdp, hsdp   without prefetch each all-gather blocks its unit (all exposed), reduce-scatters
                 hide behind the next units' backward; with prefetch the all-gathers hide too,
                 except the first of forward and of backward

Example, fsdp with prefetch: backward compute 0.40 s, its all-gathers and reduce-scatters 0.55 s
on the link, the first gather 0.02 s and the last reduce-scatter 0.03 s: exposed = 0.02 + 0.03 +
max(0, 0.55 − 0.05 − 0.40) = 0.15 s.

Offload adds, exposed (the kit copies a shard just before its all-gather): the bytes moved over
PCIe (each parameter shard in twice a step, each gradient shard out once) and the CPU's Adam on
its shard at the host memory bandwidth (see :mod:`fsdp_mini.planner.hardware`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import ADAM_BYTES_PER_PARAM
from .traffic import Collective, Levels


@dataclass(frozen=True)
class StepTime:
    compute_seconds: float
    exposed_comm_seconds: float
    offload_seconds: float

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.exposed_comm_seconds + self.offload_seconds


def compute_seconds(params: int, tokens: int, checkpointing: bool, flops_per_second: float,
                    efficiency: float) -> float:
    """FLOPs of one step on one GPU over the FLOP/s it achieves.

    >>> round(compute_seconds(7_000_000_000, 2048, False, 989e12, 0.4), 4)   # 7B, 2k tokens
    0.2174
    """
    return (8 if checkpointing else 6) * params * tokens / (flops_per_second * efficiency)


def exposed_seconds(name: str, ops: list[Collective], levels: Levels, compute: float,
                    checkpointing: bool, prefetch: bool) -> float:
    """Seconds of ``ops`` the compute does not hide (see the module docstring)."""
    backward = compute * (6 / 8 if checkpointing else 4 / 6)
    forward = compute - backward

    def total(when, gathers=None):
        return sum(levels.seconds(c) for c in ops
                   if c.when == when and (gathers is None or c.gathers == gathers))

    def first(when, gathers):
        return next((levels.seconds(c) for c in ops if c.when == when and c.gathers == gathers),
                    0.0)

    def last(when, gathers):
        return next((levels.seconds(c) for c in reversed(ops)
                     if c.when == when and c.gathers == gathers), 0.0)

    if name in ("ddp", "zero1", "zero2"):
        reduced, tail = total("backward"), last("backward", False)
        return tail + max(0.0, reduced - tail - backward) + total("step")
    reduces, tail = total("backward", False), last("backward", False)
    if not prefetch:
        return (total("forward") + total("backward", True) + tail
                + max(0.0, reduces - tail - backward))
    head_f, head_b = first("forward", True), first("backward", True)
    return (head_f + max(0.0, total("forward") - head_f - forward)
            + head_b + tail + max(0.0, total("backward", True) + reduces - head_b - tail
                                  - backward))


def offload_seconds(local_params: float, param_bytes: int, reduce_bytes: int, pcie_gbs: float,
                    host_gbs: float) -> tuple[float, float]:
    """(bytes over PCIe per step, seconds of PCIe and of the CPU's Adam) for a GPU whose shard
    holds ``local_params`` parameters."""
    pcie = local_params * (2 * param_bytes + reduce_bytes)
    return pcie, pcie / (pcie_gbs * 1e9) + local_params * ADAM_BYTES_PER_PARAM / (host_gbs * 1e9)
