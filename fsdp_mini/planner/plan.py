"""The planner: will a model train under ddp, zero1, zero2, fsdp or hsdp, and what does a step
send? ``plan(...)`` answers from the formulas alone, before any GPU is rented::

    p = fsdp_mini.plan(params=7e9, gpus=8, gpu_mem_gb=80, precision="bf16-mixed")
    p.strategies["ddp"].fits            # False: 16Ψ = 112 GB of model state per GPU
    p.strategies["fsdp"].peak_bytes     # 14 GB of state + the gathered units (+ activations)

Per GPU and strategy it predicts the model state kept between steps (the ZeRO formulas of
:mod:`fsdp_mini.theory`, padded exactly as the kit lays out its buckets and units) and the peak
within a step: the largest of these moments,

    forward end     state (zero1 keeps its full gradient buffer; the others freed theirs at
                    zero_grad) + the activations of one micro-batch
                    (:mod:`fsdp_mini.planner.shapes`)
    backward start  (fsdp, hsdp) the same a moment later: the root and the last layer gathered
                    (x2 with prefetch), an untied head's weight gradient
    backward        (fsdp, hsdp) the next layer gathered while the last one's flat gradient is
                    reduce-scattered; the activations left, the layer's weight gradients
    backward end    state with all gradients + the buffer in flight (a bucket, a unit's flat
                    gradient; zero2: the bucket's gradients and their flat copy)
    optimizer step  state + Adam's temporaries (two fp32 copies of the largest local tensor);
                    zero1: its gradient buffer, the reduce-scatter's working copy and the shard

Checked against ``track_memory`` on the kit's GPT (tests/test_planner.py): within 1 % for every
strategy at world sizes 2 and 4. Activation checkpointing, offload and prefetch are modelled but
not validated by measurement.

Bytes sent per step come from the theory's ring formulas, the α-β time from
:class:`fsdp_mini.Link` (per collective: latency steps x α + ring bytes / β). hsdp shards within
groups of S ranks and all-reduces each shard across the G = N/S groups:
3(S−1)/S·Ψ·b + 2(G−1)/G·Ψ/S·b bytes. Precisions: ``fp32`` (4 + 4 + 8 bytes per parameter,
4-byte activations and collectives) and ``bf16-mixed`` (2 + 2 + 12: bf16 parameters and
gradients, an fp32 master copy and Adam's moments; 2-byte activations and collectives).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..comm.ledger import ring_bytes
from ..comm.link import Link
from ..memory import CATEGORIES
from ..theory import PARTS, StateBytes, UnitSize, fsdp_sent_bytes, persistent_bytes
from .shapes import PRESETS, ModelShape

PLAN_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
SHARDED = {"ddp": (), "zero1": ("optim",), "zero2": ("grads", "optim"), "fsdp": PARTS,
           "hsdp": PARTS}
PRECISIONS = {"fp32": (StateBytes(4, 4, 8), 4), "bf16-mixed": (StateBytes(2, 2, 12), 2)}
UNITS_WITHOUT_SHAPE = 32  # a parameter count alone: assume 32 equal layers (a 7B-class depth)


@dataclass
class StrategyPlan:
    """One strategy's prediction, per GPU. ``by_category`` is the breakdown at the peak."""

    persistent_bytes: float
    peak_bytes: float
    by_category: dict[str, float]
    fits: bool
    sent_bytes_per_step: float
    comm_seconds_per_step: float
    peak_moment: str = ""
    offloaded_bytes: float = 0.0


@dataclass
class Plan:
    params: int
    gpus: int
    gpu_mem_bytes: float
    precision: str
    strategies: dict[str, StrategyPlan] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The JSON of ``fsdp-mini plan --json`` (see the README)."""
        return asdict(self)


def plan(params: float | None = None, *, model: str | ModelShape | None = None, gpus: int = 8,
         gpu_mem_gb: float = 80.0, precision: str = "bf16-mixed", micro_batch: int = 1,
         seq: int | None = None, checkpointing: bool = False, offload: bool = False,
         prefetch: bool = False, shard_size: int | None = None, bandwidth_gbs: float = 50.0,
         latency_us: float = 10.0, bucket_mb: float = 25.0,
         strategies: tuple[str, ...] = PLAN_STRATEGIES) -> Plan:
    """Predict memory and communication per GPU for each strategy (see the module docstring).

    Give ``params`` (a count, e.g. ``7e9``: activations are then not counted) or ``model`` (a
    preset name, ``"7b"``, ``"13b"``, ``"70b"``, or a :class:`ModelShape`). ``shard_size``
    (hsdp's S) defaults to min(8, gpus). Example, the kit's tiny GPT on 2 ranks in fp32::

        >>> from fsdp_mini.planner.shapes import ModelShape
        >>> tiny = ModelShape(2, 32, 2, 64, 16, positions=16)
        >>> p = plan(model=tiny, gpus=2, precision="fp32", micro_batch=4)
        >>> p.params, p.strategies["fsdp"].persistent_bytes      # 16Ψ/N
        (27840, 222720.0)
    """
    shape = _shape(params, model, seq)
    sizes, act_bytes = _precision(precision)
    n = _whole("gpus", gpus)
    _whole("micro_batch", micro_batch)
    if not (isinstance(gpu_mem_gb, (int, float)) and 0 < gpu_mem_gb < math.inf):
        raise ValueError(f"gpu_mem_gb must be a number of GB > 0, e.g. 80, got {gpu_mem_gb!r}")
    s = min(8, n) if shard_size is None else _whole("shard_size", shard_size)
    if n % s:
        raise ValueError(f"shard_size {s} does not divide gpus {n}: hsdp needs groups of equal "
                         f"size; pick a divisor of {n}")
    unknown = [name for name in strategies if name not in PLAN_STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(PLAN_STRATEGIES)}")
    link = Link(bandwidth_gbs, latency_us)
    model_tensors = _tensors(shape, params)
    acts = tuple(shape.activation_bytes(micro_batch, act_bytes, checkpointing, moment)
                 if shape else 0 for moment in ("forward end", "backward start", "backward"))
    out = Plan(sum(t for _, t in model_tensors), n, gpu_mem_gb * 1e9, precision)
    if shape is None:
        out.notes.append(f"activations not counted (give a model shape); units assumed to be "
                         f"{UNITS_WITHOUT_SHAPE} equal layers")
    layout = _Layout(model_tensors, sizes, int(bucket_mb * 2**20))
    for name in strategies:
        group = s if name == "hsdp" else n
        out.strategies[name] = _strategy(name, layout, n, group, acts, prefetch, offload, link,
                                         out.gpu_mem_bytes)
    return out


@dataclass
class _Layout:
    tensors: list[tuple[str, int]]
    sizes: StateBytes
    bucket_bytes: int

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


def _padded(numel: int, n: int) -> int:
    return -(-numel // n) * n if numel else n


def _strategy(name, layout: _Layout, n, group, acts: tuple[int, ...], prefetch, offload, link,
              mem) -> StrategyPlan:
    sizes, sharded = layout.sizes, SHARDED[name]
    if name in ("fsdp", "hsdp"):
        pieces = [_padded(u, group) for u in layout.units().values()]
    elif name in ("zero1", "zero2"):
        pieces = [_padded(b, n) for b in layout.buckets()]
    else:
        pieces = layout.buckets()
    padded = sum(pieces)
    state = persistent_bytes(sharded, layout.numel, group, padded, sizes=sizes)
    local = {p: getattr(sizes, p) * (padded / group if p in sharded else layout.numel)
             for p in PARTS}
    offloaded = sum(local[p] for p in sharded) if offload else 0.0
    if offload:
        local.update({p: 0.0 for p in sharded})
    kept = {"params": local["params"], "optimizer_state": local["optim"]}
    largest = max(t for _, t in layout.tensors) / (group if sharded else 1)
    bucket = max(pieces) * sizes.grads  # the largest bucket's (or unit's) flat gradient
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
        moments["backward"] = {**kept, "gathered_params": gathered, "comm_buffers": layer *
                               sizes.grads, "grads": layer * sizes.grads / group,
                               "activations": acts[2]}
    moment = max(moments, key=lambda k: sum(moments[k].values()))
    by_category = {c: float(moments[moment].get(c, 0.0)) for c in CATEGORIES}
    peak = sum(by_category.values())
    sent, seconds = _traffic(name, pieces, layout, n, group, link)
    return StrategyPlan(state, peak, by_category, peak <= mem, sent, seconds, moment, offloaded)


def _traffic(name, pieces, layout: _Layout, n, group, link: Link) -> tuple[float, float]:
    """(bytes sent per GPU per step, α-β seconds): the collectives each strategy issues."""
    p, g = layout.sizes.params, layout.sizes.grads
    ops: list[tuple[str, float, int]] = []  # (op, payload bytes, ranks)
    if name == "ddp":
        ops = [("all_reduce", b * g, n) for b in pieces]
    elif name in ("zero1", "zero2"):
        ops = [op for b in pieces for op in (("reduce_scatter", b * g, n),
                                             ("all_gather", b * p, n))]
    else:
        units = [UnitSize(u, gathered_in_backward=i < len(pieces) - 1)
                 for i, u in enumerate(pieces)]  # the root stays gathered for backward
        for u in units:
            ops += [("all_gather", u.trainable * p, group)] * (2 if u.gathered_in_backward else 1)
            ops.append(("reduce_scatter", u.trainable * g, group))
            if name == "hsdp":
                ops.append(("all_reduce", u.trainable / group * g, n // group))
        sent = fsdp_sent_bytes(units, group, p, g)
        if name == "hsdp":
            sent += sum(ring_bytes("all_reduce", u.trainable / group * g, n // group)
                        for u in units)
        return sent, sum(link.cost(op, b, k) for op, b, k in ops)
    return (sum(ring_bytes(op, b, k) for op, b, k in ops),
            sum(link.cost(op, b, k) for op, b, k in ops))


def _tensors(shape: ModelShape | None, params) -> list[tuple[str, int]]:
    if shape is not None:
        return shape.tensors()
    total = int(params)
    layer = total // UNITS_WITHOUT_SHAPE
    return [(f"blocks.{i}", layer) for i in range(UNITS_WITHOUT_SHAPE)] + \
        [("root", total - layer * UNITS_WITHOUT_SHAPE)]


def _shape(params, model, seq) -> ModelShape | None:
    if (params is None) == (model is None):
        raise ValueError("give either params (a parameter count, e.g. 7e9) or model (a preset: "
                         f"{', '.join(PRESETS)}, or a ModelShape), not both or neither")
    if params is not None:
        if isinstance(params, bool) or not isinstance(params, (int, float)) \
                or not 1 <= params < math.inf:
            raise ValueError(f"params must be a parameter count >= 1, e.g. 7e9, got {params!r}")
        return None
    if isinstance(model, str):
        if model.lower() not in PRESETS:
            raise ValueError(f"unknown model preset {model!r}; choose from {', '.join(PRESETS)} "
                             f"or give params")
        model = PRESETS[model.lower()]
    if not isinstance(model, ModelShape):
        raise TypeError(f"model must be a preset name or a ModelShape, got {type(model).__name__}")
    return model.with_seq(_whole("seq", seq)) if seq is not None else model


def _precision(precision: str) -> tuple[StateBytes, int]:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def _whole(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


def format_plan(p: Plan) -> str:
    """The terminal table of ``fsdp-mini plan``: bytes per GPU by category (GB, or MB / kB for
    small models), whether it fits, bytes sent and α-β seconds per step."""
    peak = max((s.peak_bytes for s in p.strategies.values()), default=0)
    unit, scale = next((u, f) for u, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1))
                       if peak >= f or f == 1)
    cats = ("params", "grads", "optimizer_state", "gathered_params", "comm_buffers", "activations")
    short = ("param", "grads", "optim", "gathr", "comm", "activ")
    head = (f"{'strategy':<8} {'state ' + unit:>8} " + " ".join(f"{s:>7}" for s in short)
            + f" {'peak ' + unit:>8} {'fits':>4} {'sent ' + unit + '/step':>12}"
            f" {'comm s/step':>11}  peak at")
    title = (f"Ψ = {p.params:,} parameters, {p.gpus} GPUs of {p.gpu_mem_bytes / 1e9:g} GB, "
             f"{p.precision}")
    lines = [title, head, "-" * len(head)]
    for name, s in p.strategies.items():
        cat = " ".join(f"{s.by_category[c] / scale:7.2f}" for c in cats)
        lines.append(f"{name:<8} {s.persistent_bytes / scale:8.2f} {cat}"
                     f" {s.peak_bytes / scale:8.2f} {'yes' if s.fits else 'NO':>4}"
                     f" {s.sent_bytes_per_step / scale:12.3f} {s.comm_seconds_per_step:11.3g}"
                     f"  {s.peak_moment}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)
