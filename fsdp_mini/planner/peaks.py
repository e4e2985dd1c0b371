"""Memory per GPU and strategy: the state kept between steps and the peak within a step.

The peak is the largest of these moments (see :mod:`fsdp_mini.planner.plan` for the table):
forward end, backward start and backward (fsdp, hsdp), backward end, optimizer step. Each is a
sum by memory category (:data:`fsdp_mini.memory.CATEGORIES`), padded exactly as the kit pads
its buckets (ddp, zero) and units (fsdp, hsdp). Gradients in flight travel in the reduce dtype:
a 16-bit gradient reduced in fp32 is copied into an fp32 buffer first (4 B per element).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory import CATEGORIES
from ..theory import PARTS, StateBytes, persistent_bytes

SHARDED = {"ddp": (), "zero1": ("optim",), "zero2": ("grads", "optim"), "fsdp": PARTS,
           "hsdp": PARTS}


@dataclass
class Layout:
    tensors: list[tuple[str, int]]
    sizes: StateBytes
    bucket_bytes: float

    @property
    def numel(self) -> int:
        return sum(t for _, t in self.tensors)

    def buckets(self) -> list[int]:
        """Element counts of the gradient buckets, in gradient-ready (reverse) order."""
        out, size = [[]], 0
        for _, numel in reversed(self.tensors):
            nbytes = numel * self.sizes.params
            if out[-1] and size + nbytes > self.bucket_bytes:
                out.append([])
                size = 0
            out[-1].append(numel)
            size += nbytes
        return [sum(b) for b in out if b]

    def units(self) -> dict[str, int]:
        """Element counts of the fsdp units: each layer, then the root (everything else)."""
        units: dict[str, int] = {}
        for unit, numel in self.tensors:
            units[unit] = units.get(unit, 0) + numel
        root = units.pop("root", 0)
        return {**units, "root": root}

    def pieces(self, name: str, n: int, group: int) -> list[int]:
        """What ``name`` communicates as one: units (padded to the group), buckets (zero pads
        them to N)."""
        if name in ("fsdp", "hsdp"):
            return [_padded(u, group) for u in self.units().values()]
        if name in ("zero1", "zero2"):
            return [_padded(b, n) for b in self.buckets()]
        return self.buckets()


@dataclass
class Memory:
    persistent_bytes: float
    peak_bytes: float
    by_category: dict[str, float]
    peak_moment: str
    offloaded_bytes: float
    local_params: float       # parameters this GPU's optimizer updates (its shard, or all)


def _padded(numel: int, n: int) -> int:
    return -(-numel // n) * n if numel else n


def memory(name: str, layout: Layout, n: int, group: int, acts: tuple[int, ...], prefetch: bool,
           offload: bool, reduce_bytes: int, no_sync: bool = False,
           micro_batches: int = 1) -> Memory:
    """The state and the peak of ``name`` on one GPU; ``acts`` are the activations at forward
    end, backward start, then in the backward of each layer below the last. With
    ``micro_batches`` > 1 the gradients of the micro-batches before the last one are held
    through its forward and backward."""
    sizes, sharded = layout.sizes, SHARDED[name]
    pieces = layout.pieces(name, n, group)
    padded = sum(pieces)
    state = persistent_bytes(sharded, layout.numel, group, padded, sizes=sizes)
    local = {p: getattr(sizes, p) * (padded / group if p in sharded else layout.numel)
             for p in PARTS}
    local_params = padded / group if "optim" in sharded else layout.numel
    offloaded = sum(local[p] for p in sharded) if offload else 0.0
    if offload:
        local.update({p: 0.0 for p in sharded})
    if no_sync and name in ("zero2", "fsdp", "hsdp"):
        # Note: under no_sync the gradients of the micro-batches add up on the rank, whole:
        # zero2's p.grad, each fsdp unit's flat gradient (4Ψ instead of 4Ψ/N in fp32).
        local["grads"] = sizes.grads * (padded if name != "zero2" else layout.numel)
    kept = {"params": local["params"], "optimizer_state": local["optim"]}
    largest = max(t for _, t in layout.tensors) / (group if sharded else 1)
    travel = reduce_bytes + (sizes.grads if reduce_bytes != sizes.grads else 0)
    bucket = max(pieces) * travel  # the largest bucket's (or unit's) flat gradient in flight
    moments = {"forward end": {**kept, "activations": acts[0]},
               "backward end": {**kept, "grads": local["grads"], "comm_buffers": bucket},
               "optimizer step": {**kept, "grads": local["grads"],
                                  "activations": 2 * 4 * largest}}  # Adam's temporaries
    if name == "zero1":
        # Note: zero1 keeps its full gradient buffer between steps and sends it at the step,
        # into a shard (G/N) through a working copy of the bucket.
        moments["forward end"]["grads"] = local["grads"]
        moments["backward end"]["comm_buffers"] = 0.0
        moments["optimizer step"].update(grads=local["grads"] * (1 + 1 / n),
                                         comm_buffers=bucket, activations=0.0)
    elif name == "zero2" and no_sync:
        # Note: every p.grad is already in the whole gradients held; the last bucket adds its
        # flat copy, and the shard its reduce-scatter lands in joins them.
        moments["backward end"].update(comm_buffers=bucket,
                                       grads=local["grads"] + sizes.grads * padded / group)
    elif name == "zero2":
        moments["backward end"]["comm_buffers"] = 2 * bucket  # the bucket's p.grad + flat copy
    elif name in ("fsdp", "hsdp"):
        layer = max(pieces[:-1], default=0)
        gathered = (pieces[-1] + layer * (2 if prefetch else 1)) * sizes.params
        moments["backward end"]["gathered_params"] = gathered
        # Note: fsdp's forward-end peak comes a moment later, once the head has run its backward
        # and the last layer is gathered again; and in backward the layer after the last one is
        # gathered while the last one's flat gradient is still being reduce-scattered.
        del moments["forward end"]
        moments["backward start"] = {**kept, "gathered_params": gathered,
                                     "activations": acts[1]}
        # Note: in backward, fewer activations stay alive with each layer done, while the
        # layers done keep their gradient shards; with checkpointing (small activations kept)
        # the peak comes late, with the shards of every layer but the first.
        moments["backward"] = max(
            ({**kept, "gathered_params": gathered, "comm_buffers": layer * travel,
              "grads": local["grads"] if no_sync else done * layer * sizes.grads / group,
              "activations": act} for done, act in enumerate(acts[2:], start=1)),
            key=lambda moment: sum(moment.values()))
    if micro_batches > 1:
        # Note: from the second micro-batch on, forward runs with the gradients so far held.
        for key in ("forward end", "backward start", "backward"):
            if key in moments:
                moments[key]["grads"] = max(moments[key].get("grads", 0.0), local["grads"])
    moment = max(moments, key=lambda k: sum(moments[k].values()))
    by_category = {c: float(moments[moment].get(c, 0.0)) for c in CATEGORIES}
    return Memory(state, sum(by_category.values()), by_category, moment, offloaded, local_params)
