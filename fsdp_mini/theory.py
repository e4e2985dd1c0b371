"""The ZeRO formulas, as functions: what a strategy *should* cost, to set beside what it does.

Ψ = trainable parameters, N = ranks. Per parameter a rank keeps ``param_bytes`` of parameter,
``grad_bytes`` of gradient and ``optim_bytes`` of optimizer state (fp32 with Adam: 4, 4 and 8,
two moments). A ZeRO stage is the set of those three parts it shards over the N ranks:

    ddp    nothing sharded                  4Ψ + 4Ψ + 8Ψ            = 16Ψ
    zero1  the optimizer state              4Ψ + 4Ψ + 8Ψ/N          = 8Ψ + 8Ψ/N
    zero2  + the gradients                  4Ψ + (4Ψ + 8Ψ)/N        = 4Ψ + 12Ψ/N
    fsdp   + the parameters                 (4Ψ + 4Ψ + 8Ψ)/N        = 16Ψ/N
           (+ the gathered unit(s) and the activations while computing)

In mixed precision (2-byte parameters and gradients, 12 bytes of fp32 master copy and moments)
the same rule gives DDP 16Ψ, ZeRO-1 4Ψ + 12Ψ/N, ZeRO-2 2Ψ + 14Ψ/N, ZeRO-3 16Ψ/N.

Bytes sent per rank per step follow the ring model of :mod:`fsdp_mini.comm.ledger`, its one
home:

    ddp    all-reduce Ψ                               2(N-1)/N x 4Ψ
    zero   reduce-scatter Ψ + all-gather Ψ            2(N-1)/N x 4Ψ
    fsdp   all-gather Ψ (forward) + all-gather of the units freed after forward (backward)
           + reduce-scatter Ψ                         3(N-1)/N x 4Ψ with every unit freed
    hsdp   fsdp inside shard groups of S ranks        3(S-1)/S x 4Ψ
           + all-reduce of the Ψ/S shard over G = N/S  2(G-1)/G x 4Ψ/S  (across the groups)

Mixed precision (:mod:`fsdp_mini.precision.policy`) changes the bytes per element of each
collective: fsdp with ``param_dtype`` bf16 gathers 2-byte elements and reduce-scatters 4-byte ones,
(2 + 2 + 4)(N-1)/N x Ψ instead of 12(N-1)/N x Ψ; ``reduce_dtype`` bf16 halves the gradients'
part under every strategy (ddp: 2(N-1)/N x 2Ψ). The model state kept between steps is unchanged.

"Padded" counts round every flat bucket or unit up to a multiple of N, exactly as
:mod:`fsdp_mini.buffers.flat` lays them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .comm.ledger import ring_bytes

STRATEGIES = ("single", "ddp", "zero1", "zero2", "fsdp")  # the kit's own, in ZeRO order
PARTS = ("params", "grads", "optim")


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each part of the model state."""

    params: int = 4
    grads: int = 4
    optim: int = 8

    @classmethod
    def adam(cls, element_size: int, optim_bytes: int | None = None) -> "StateBytes":
        """Parameters and gradients of ``element_size`` bytes; Adam's two moments by default."""
        return cls(element_size, element_size,
                   2 * element_size if optim_bytes is None else optim_bytes)


@dataclass(frozen=True)
class UnitSize:
    """One FSDP unit as the formulas see it (element counts, padded to a multiple of N)."""

    trainable: int
    frozen: int = 0
    gathered_in_backward: bool = True


def persistent_bytes(sharded: tuple[str, ...], numel: int, world_size: int,
                     padded_numel: int | None = None, frozen_numel: int = 0,
                     sizes: StateBytes = StateBytes()) -> float:
    """Model-state bytes one rank keeps between steps when the parts in ``sharded`` are split
    over the ranks (their padded size / N) and the others are whole. Frozen parameters have no
    gradient and no optimizer state: only their values, sharded with the parameters."""
    n = world_size
    padded = numel if padded_numel is None else padded_numel
    total = 0.0
    for part in PARTS:
        per_param = getattr(sizes, part)
        total += per_param * padded / n if part in sharded else per_param * numel
    return total + sizes.params * frozen_numel / (n if "params" in sharded else 1)


def memory_formula(sharded: tuple[str, ...], sizes: StateBytes = StateBytes()) -> str:
    """``persistent_bytes`` as a person writes it: ``"4Ψ + 12Ψ/N"``."""
    whole = sum(getattr(sizes, p) for p in PARTS if p not in sharded)
    split = sum(getattr(sizes, p) for p in PARTS if p in sharded)
    terms = ([f"{whole}Ψ"] if whole else []) + ([f"{split}Ψ/N"] if split else [])
    return " + ".join(terms)


def ddp_sent_bytes(numel: int, world_size: int, elem_bytes: int = 4) -> float:
    """One all-reduce of every gradient."""
    return ring_bytes("all_reduce", numel * elem_bytes, world_size)


def zero_sent_bytes(padded_numel: int, world_size: int, elem_bytes: int = 4,
                    reduce_bytes: int | None = None) -> float:
    """A reduce-scatter of the gradients (``reduce_bytes`` per element, default ``elem_bytes``),
    then an all-gather of the updated parameters."""
    grads = padded_numel * (elem_bytes if reduce_bytes is None else reduce_bytes)
    return (ring_bytes("reduce_scatter", grads, world_size)
            + ring_bytes("all_gather", padded_numel * elem_bytes, world_size))


def fsdp_sent_bytes(units: list[UnitSize], world_size: int, elem_bytes: int = 4,
                    reduce_bytes: int | None = None) -> float:
    """Per unit: all-gather in forward, again in backward if it was freed, reduce-scatter.
    Gathers move ``elem_bytes`` per element (2 with param_dtype bf16), the reduce-scatter
    ``reduce_bytes`` (default ``elem_bytes``)."""
    reduce_bytes = elem_bytes if reduce_bytes is None else reduce_bytes
    total = 0.0
    for u in units:
        whole = (u.trainable + u.frozen) * elem_bytes
        total += ring_bytes("all_gather", whole, world_size) * (2 if u.gathered_in_backward else 1)
        total += ring_bytes("reduce_scatter", u.trainable * reduce_bytes, world_size)
    return total


def hsdp_sent_bytes(units: list[UnitSize], shard_size: int, world_size: int, elem_bytes: int = 4,
                    reduce_bytes: int | None = None) -> float:
    """FSDP's bytes inside a shard group of ``shard_size`` ranks, plus the all-reduce of each
    rank's gradient shard (``trainable / S`` elements) over the G = N/S groups. Example, Ψ = 8
    (one unit), N = 4, S = 2: 3 x 1/2 x 32 + 2 x 1/2 x 16 = 48 + 16 = 64 bytes."""
    reduce_bytes = elem_bytes if reduce_bytes is None else reduce_bytes
    inside = fsdp_sent_bytes(units, shard_size, elem_bytes, reduce_bytes)
    shard = sum(u.trainable for u in units) // shard_size
    return inside + ring_bytes("all_reduce", shard * reduce_bytes, world_size // shard_size)
