"""The ZeRO formulas, as functions: what each strategy *should* cost, to set beside what it does.

Ψ = trainable parameters, N = ranks, fp32 training with Adam: 4 bytes of parameter, 4 of gradient
and 8 of optimizer state (two moments) per parameter. "Padded" counts round every flat bucket or
unit up to a multiple of N, exactly as :mod:`fsdp_mini.flat` lays them out.

Persistent model state per rank (kept between steps):

    ddp    4Ψ + 4Ψ + 8Ψ            = 16Ψ
    zero1  4Ψ + 4Ψ + 8Ψ/N
    zero2  4Ψ + (4Ψ + 8Ψ)/N
    fsdp   (4Ψ + 4Ψ + 8Ψ)/N        (+ the gathered unit and activations while computing)

Bytes sent per rank per step (ring model, see :mod:`fsdp_mini.comm`):

    ddp    all-reduce Ψ                               2(N-1)/N x 4Ψ
    zero   reduce-scatter Ψ + all-gather Ψ            2(N-1)/N x 4Ψ
    fsdp   all-gather Ψ (forward) + all-gather of the units freed after forward (backward)
           + reduce-scatter Ψ                         3(N-1)/N x 4Ψ with every unit freed
"""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("single", "ddp", "zero1", "zero2", "fsdp")


@dataclass(frozen=True)
class UnitSize:
    """One FSDP unit as the formulas see it (element counts, padded to a multiple of N)."""

    trainable: int
    frozen: int = 0
    gathered_in_backward: bool = True


def ring_fraction(world_size: int) -> float:
    return (world_size - 1) / world_size


def ddp_sent_bytes(numel: int, world_size: int, elem_bytes: int = 4) -> float:
    return 2 * ring_fraction(world_size) * numel * elem_bytes


def zero_sent_bytes(padded_numel: int, world_size: int, elem_bytes: int = 4) -> float:
    return 2 * ring_fraction(world_size) * padded_numel * elem_bytes


def fsdp_sent_bytes(units: list[UnitSize], world_size: int, elem_bytes: int = 4) -> float:
    elements = 0
    for u in units:
        whole = u.trainable + u.frozen
        elements += whole + (whole if u.gathered_in_backward else 0) + u.trainable
    return ring_fraction(world_size) * elements * elem_bytes


def persistent_bytes(strategy: str, numel: int, world_size: int, padded_numel: int | None = None,
                     frozen_numel: int = 0, param_bytes: int = 4, grad_bytes: int = 4,
                     optim_bytes: int = 8) -> float:
    """Model-state bytes one rank keeps between steps (frozen parameters: params only)."""
    n = world_size
    padded = numel if padded_numel is None else padded_numel
    params, grads, optim = param_bytes * numel, grad_bytes * numel, optim_bytes * numel
    frozen = param_bytes * frozen_numel
    if strategy in ("single", "ddp"):
        return params + grads + optim + frozen
    if strategy == "zero1":
        return params + grads + optim_bytes * padded / n + frozen
    if strategy == "zero2":
        return params + (grad_bytes + optim_bytes) * padded / n + frozen
    if strategy == "fsdp":
        return (param_bytes + grad_bytes + optim_bytes) * padded / n + frozen / n
    raise ValueError(f"unknown strategy {strategy!r}; use one of {STRATEGIES}")
