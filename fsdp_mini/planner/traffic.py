"""The collectives of one training step, per strategy, as the kit issues them: their payloads in
the dtypes they travel in, the bytes one GPU sends (the ledger's ring model) and their α-β time
on the network level they cross.

Parameters travel in the precision's parameter bytes (2 in bf16-mixed: fsdp gathers bf16
units); gradients in the *reduce* dtype, which is what ``parallelize`` does by default: fp32,
the dtype of the shards, whatever the compute dtype (``reduce_dtype=torch.bfloat16`` halves
them). Example, fsdp on N = 4 in bf16-mixed, one unit of 1000 parameters, reduce in fp32::

    forward   all-gather       2 B x 1000 = 2000 B payload   sends 3/4 x 2000 = 1500 B
    backward  all-gather       2000 B                        1500 B
    backward  reduce-scatter   4 B x 1000 = 4000 B           3000 B        (2000 B in bf16)

A collective whose ranks are all in one node runs on NVLink; one that spans nodes on the
network between them. HSDP keeps its shard groups inside a node and all-reduces each shard
across the nodes; plain fsdp on more GPUs than a node has sends everything across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm.ledger import ring_bytes
from ..comm.link import Link


@dataclass(frozen=True)
class Collective:
    """One collective of a step: ``when`` is "forward", "backward" or "step" (after backward),
    ``ranks`` its group's size, ``across_nodes`` whether that group spans nodes."""

    op: str
    payload_bytes: float
    ranks: int
    across_nodes: bool
    when: str
    gathers: bool  # an all-gather of parameters (what prefetch can issue early)


@dataclass(frozen=True)
class Levels:
    """The two network levels: inside a node (NVLink) and across nodes."""

    node: Link
    across: Link
    gpus_per_node: int

    def link(self, c: Collective) -> Link:
        return self.across if c.across_nodes else self.node

    def seconds(self, c: Collective) -> float:
        return self.link(c).cost(c.op, c.payload_bytes, c.ranks)


def collectives(name: str, pieces: list[int], n: int, group: int, param_bytes: int,
                reduce_bytes: int, levels: Levels, micro_batches: int = 1,
                no_sync: bool = False) -> list[Collective]:
    """Every collective of one step of ``name``, in the order issued. ``pieces``: element
    counts of the buckets (ddp, zero) or units (fsdp, hsdp; the root last). A step of
    ``micro_batches`` gathers for each of them (fsdp) and reduces after each, or once at the
    last under ``no_sync`` (zero1 reduces once at ``optimizer.step()`` either way)."""
    spans, shard_spans = n > levels.gpus_per_node, group > levels.gpus_per_node
    reductions = 1 if no_sync or name == "zero1" else micro_batches

    def reduce(op, elements, ranks, across, when="backward"):
        return Collective(op, elements * reduce_bytes, ranks, across, when, False)

    def gather(elements, when):
        return Collective("all_gather", elements * param_bytes, group, shard_spans, when, True)

    if name == "ddp":
        return [reduce("all_reduce", b, n, spans) for b in pieces] * reductions
    if name in ("zero1", "zero2"):
        when = "step" if name == "zero1" else "backward"
        return ([reduce("reduce_scatter", b, n, spans, when) for b in pieces] * reductions
                + [Collective("all_gather", b * param_bytes, n, spans, "step", True)
                   for b in pieces])
    out: list[Collective] = []
    for micro in range(micro_batches):
        out += [gather(u, "forward") for u in pieces]
        reducing = micro == micro_batches - 1 or reductions > 1
        for i, u in reversed(list(enumerate(pieces))):
            if i < len(pieces) - 1:  # Note: the root stays gathered from forward to backward
                out.append(gather(u, "backward"))
            if reducing:
                out.append(reduce("reduce_scatter", u, group, shard_spans))
                if name == "hsdp":
                    out.append(reduce("all_reduce", u / group, n // group, spans))
    return out


def sent_bytes(ops: list[Collective]) -> float:
    """Bytes one GPU sends for ``ops`` (the ledger's ring model)."""
    return sum(ring_bytes(c.op, c.payload_bytes, c.ranks) for c in ops)


def comm_seconds(ops: list[Collective], levels: Levels) -> float:
    """Their α-β time one after another, each on its own level: nothing overlapped."""
    return sum(levels.seconds(c) for c in ops)
