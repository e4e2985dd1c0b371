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

from dataclasses import asdict, dataclass, field
from functools import partial

from ..arguments import _kind, choice, count, flag, number
from ..comm.link import Link
from ..theory import StateBytes
from . import hardware
from .budget import check_budget, training_cost
from .peaks import Layout, memory
from .shapes import MAX_COUNT, PRESETS, ModelShape
from .step_time import StepTime, compute_seconds, exposed_seconds, offload_seconds
from .traffic import Levels, collectives, comm_seconds, sent_bytes

PLAN_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
PRECISIONS = {"fp32": (StateBytes(4, 4, 8), 4), "bf16-mixed": (StateBytes(2, 2, 12), 2)}
REDUCE_DTYPES = {"fp32": ("fp32", 4), "float32": ("fp32", 4), "bf16": ("bf16", 2),
                 "bfloat16": ("bf16", 2), "fp16": ("fp16", 2), "float16": ("fp16", 2)}
UNITS_WITHOUT_SHAPE = 32  # a parameter count alone: assume 32 equal layers (a 7B-class depth)
SEQ_WITHOUT_SHAPE = 2048  # ... and sequences of 2048 tokens for the compute
# Note: limits beyond any real job, so that a typo is refused rather than a plan taking minutes:
# hsdp's default group is searched among the divisors up to a node's size, and a step of
# micro_batches lists every collective of each micro-batch.
MAX_GPUS = 2**20              # a million GPUs: ten times the largest clusters of 2025
MAX_MICRO_BATCHES = 1024      # micro-batches per step (gradient accumulation)


@dataclass
class StrategyPlan:
    """One strategy's prediction, per GPU. ``by_category`` is the breakdown at the peak;
    ``fits``: peak + the plan's reserve <= the GPU's memory."""

    persistent_bytes: float
    peak_bytes: float
    by_category: dict[str, float]
    fits: bool
    sent_bytes_per_step: float
    comm_seconds_per_step: float          # every collective's α-β time, one after another
    peak_moment: str = ""
    offloaded_bytes: float = 0.0          # per GPU, in host memory (offload=True)
    step_seconds: float = 0.0             # compute + exposed communication + offload
    compute_seconds: float = 0.0
    exposed_comm_seconds: float = 0.0     # what the overlap does not hide
    offload_seconds: float = 0.0          # PCIe copies and the CPU's Adam (offload=True)
    pcie_bytes_per_step: float = 0.0
    host_bytes_per_node: float = 0.0
    gpu_hours_per_million_tokens: float = 0.0
    train_hours: float | None = None      # with a budget (train_tokens or train_steps)
    train_gpu_hours: float | None = None
    train_cost: float | None = None       # with a price per GPU-hour too


@dataclass
class Plan:
    params: int
    gpus: int
    gpu_mem_bytes: float
    precision: str
    strategies: dict[str, StrategyPlan] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reserve_bytes: float = 0.0            # per GPU, kept free (see hardware.RESERVE)
    reduce_dtype: str = "fp32"
    tokens_per_gpu_per_step: int = 0
    train_steps: int | None = None        # the budget, in steps of the global batch
    train_tokens: float | None = None
    price_per_gpu_hour: float | None = None
    assumptions: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The JSON of ``fsdp-mini plan --json`` (see the README)."""
        return asdict(self)


def plan(params: float | None = None, *, model: str | ModelShape | None = None, gpus: int = 8,
         gpu_mem_gb: float | None = None, precision: str = "bf16-mixed", micro_batch: int = 1,
         seq: int | None = None, checkpointing: bool = False, offload: bool = False,
         prefetch: bool = False, shard_size: int | None = None, bandwidth_gbs: float = 50.0,
         latency_us: float = 10.0, bucket_mb: float = 25.0,
         strategies: tuple[str, ...] = PLAN_STRATEGIES, reduce_dtype=None,
         reserve_gb: float | None = None, gpu: str = hardware.DEFAULT_GPU,
         tflops: float | None = None, efficiency: float = hardware.DEFAULT_EFFICIENCY,
         gpus_per_node: int = hardware.GPUS_PER_NODE, node_bandwidth_gbs: float | None = None,
         node_latency_us: float = hardware.NODE_LATENCY_US, micro_batches: int = 1,
         no_sync: bool = False, train_tokens: float | None = None,
         train_steps: int | None = None, price_per_gpu_hour: float | None = None) -> Plan:
    """Predict memory, communication and step time per GPU for each strategy (see the module
    docstring).

    Give ``params`` (a count, e.g. ``7e9``: activations are then not counted) or ``model`` (a
    preset name, ``"7b"``, ``"13b"``, ``"70b"``, or a :class:`ModelShape`). ``shard_size``
    (hsdp's S) defaults to the largest divisor of gpus that fits in a node of ``gpus_per_node``.
    ``reduce_dtype``: the dtype gradients are reduced in, ``"fp32"`` (None, the default: what
    ``parallelize`` does) or ``"bf16"``. ``reserve_gb``: memory
    kept free per GPU (default :func:`~fsdp_mini.planner.hardware.default_reserve_gb`). The time:
    ``gpu`` (a preset: A100, H100, H200) or ``tflops`` (peak per GPU) at ``efficiency``;
    ``bandwidth_gbs`` and ``latency_us`` across nodes, ``node_bandwidth_gbs`` (default the GPU's
    NVLink) and ``node_latency_us`` inside a node of ``gpus_per_node``. ``micro_batches`` per
    step (gradient accumulation), reduced once under ``no_sync``. A training budget,
    ``train_tokens`` or ``train_steps`` (of the global batch), and your ``price_per_gpu_hour``
    give each strategy's time to train, GPU-hours and cost (:mod:`fsdp_mini.planner.budget`).
    Example, the kit's tiny GPT on 2 ranks in fp32::

        >>> from fsdp_mini.planner.shapes import ModelShape
        >>> tiny = ModelShape(2, 32, 2, 64, 16, positions=16)
        >>> p = plan(model=tiny, gpus=2, precision="fp32", micro_batch=4)
        >>> p.params, p.strategies["fsdp"].persistent_bytes      # 16Ψ/N
        (27840, 222720.0)
    """
    arg = "plan: {}".format
    # Note: every argument alone first (its type, its range), then what they mean together,
    # all before any work: a str is never read as a number or a flag, a fraction never as a count.
    if params is not None:
        params = count(arg("params"), params, unit="parameters", scale_hint=1e9,
                       at_most=MAX_COUNT)
    model = _model(model)
    n = count(arg("gpus"), gpus, unit="GPUs", at_most=MAX_GPUS)
    if gpu_mem_gb is not None:
        gpu_mem_gb = number(arg("gpu_mem_gb"), gpu_mem_gb, unit="GB", above=0)
    sizes, act_bytes = PRECISIONS[choice(arg("precision"), precision, PRECISIONS)]
    micro_batch = count(arg("micro_batch"), micro_batch, at_most=MAX_COUNT)
    if seq is not None:
        seq = count(arg("seq"), seq, at_most=MAX_COUNT)
    for name, value in (("checkpointing", checkpointing), ("offload", offload),
                        ("prefetch", prefetch), ("no_sync", no_sync)):
        flag(arg(name), value)
    if shard_size is not None:
        shard_size = count(arg("shard_size"), shard_size, at_most=MAX_GPUS)
    across = Link(number(arg("bandwidth_gbs"), bandwidth_gbs, unit="GB/s", above=0),
                  number(arg("latency_us"), latency_us, unit="µs", at_least=0))
    bucket_mb = number(arg("bucket_mb"), bucket_mb, unit="MB", above=0)
    strategies = _strategies(strategies)
    reduce_name, reduce_bytes = _reduce(reduce_dtype)
    if reserve_gb is not None:
        reserve_gb = number(arg("reserve_gb"), reserve_gb, unit="GB", at_least=0)
    device = hardware.gpu_named(gpu, argument=arg("gpu"))
    if tflops is not None:
        tflops = number(arg("tflops"), tflops, unit="TFLOPS", above=0)
    efficiency = number(arg("efficiency"), efficiency, above=0, at_most=1,
                        example="0.4, the share of the peak achieved")
    per_node = count(arg("gpus_per_node"), gpus_per_node, unit="GPUs", at_most=MAX_GPUS)
    node_gbs = device.nvlink_gbs if node_bandwidth_gbs is None else \
        number(arg("node_bandwidth_gbs"), node_bandwidth_gbs, unit="GB/s", above=0)
    node_us = number(arg("node_latency_us"), node_latency_us, unit="µs", at_least=0)
    micro_batches = count(arg("micro_batches"), micro_batches, at_most=MAX_MICRO_BATCHES)
    train_tokens, train_steps, price_per_gpu_hour = check_budget(
        train_tokens, train_steps, price_per_gpu_hour, caller="plan")
    shape = _shape(params, model, seq)
    mem_gb = device.memory_gb if gpu_mem_gb is None else gpu_mem_gb
    if reserve_gb is not None and not reserve_gb < mem_gb:
        raise ValueError(f"plan: reserve_gb must be a number of GB from 0 to below the GPU's "
                         f"{mem_gb:g} GB, got {reserve_gb:g}")
    reserve = hardware.default_reserve_gb(mem_gb) if reserve_gb is None else reserve_gb
    s = _shard_size(shard_size, n, per_node, "hsdp" in strategies)
    peak_flops = device.tflops(precision) if tflops is None else tflops * 1e12
    levels = Levels(Link(node_gbs, node_us), across, per_node)
    model_tensors = _tensors(shape, params)
    acts = _activations(shape, micro_batch, act_bytes, checkpointing)
    tokens = micro_batch * (shape.seq if shape else SEQ_WITHOUT_SHAPE) * micro_batches
    out = Plan(sum(t for _, t in model_tensors), n, mem_gb * 1e9, precision,
               reserve_bytes=reserve * 1e9, reduce_dtype=reduce_name,
               tokens_per_gpu_per_step=tokens,
               assumptions={"gpu": device.name if tflops is None else f"{tflops:g} TFLOPS",
                            "peak_flops": peak_flops, "efficiency": efficiency,
                            "node_link": levels.node.describe(),
                            "across_nodes": levels.across.describe(),
                            "gpus_per_node": per_node, "reserve": hardware.RESERVE
                            if reserve_gb is None else f"{reserve_gb:g} GB (given)"})
    if shape is None:
        out.notes.append(f"activations not counted (give a model shape); units assumed to be "
                         f"{UNITS_WITHOUT_SHAPE} equal layers, sequences of {SEQ_WITHOUT_SHAPE}")
    layout = Layout(model_tensors, sizes, bucket_mb * 2**20)
    compute = compute_seconds(out.params, tokens, checkpointing, peak_flops, efficiency)
    for name in strategies:
        group = s if name == "hsdp" else n
        m = memory(name, layout, n, group, acts, prefetch, offload, reduce_bytes, no_sync,
                   micro_batches)
        ops = collectives(name, layout.pieces(name, n, group), n, group, sizes.params,
                          reduce_bytes, levels, micro_batches, no_sync)
        pcie, moved = offload_seconds(m.local_params, sizes.params, reduce_bytes,
                                      device.pcie_gbs, hardware.HOST_GBS_PER_GPU) \
            if offload and name != "ddp" else (0.0, 0.0)
        time = StepTime(compute, exposed_seconds(name, ops, levels, compute, checkpointing,
                                                 prefetch), moved)
        out.strategies[name] = StrategyPlan(
            m.persistent_bytes, m.peak_bytes, m.by_category,
            m.peak_bytes + out.reserve_bytes <= out.gpu_mem_bytes, sent_bytes(ops),
            comm_seconds(ops, levels), m.peak_moment, m.offloaded_bytes, time.seconds,
            time.compute_seconds, time.exposed_comm_seconds, time.offload_seconds, pcie,
            m.offloaded_bytes * min(per_node, n),
            time.seconds / tokens * 1e6 / 3600)
    if train_tokens is not None or train_steps is not None:
        for s in out.strategies.values():
            c = training_cost(s.step_seconds, tokens * n, n, train_tokens, train_steps,
                              price_per_gpu_hour)
            s.train_hours, s.train_gpu_hours, s.train_cost = c.hours, c.gpu_hours, c.cost
        out.train_steps, out.train_tokens = c.steps, c.steps * tokens * n
        out.price_per_gpu_hour = price_per_gpu_hour
    return out


def _tensors(shape: ModelShape | None, params) -> list[tuple[str, int]]:
    if shape is not None:
        return shape.tensors()
    total = int(params)
    layer = total // UNITS_WITHOUT_SHAPE
    return [(f"blocks.{i}", layer) for i in range(UNITS_WITHOUT_SHAPE)] + \
        [("root", total - layer * UNITS_WITHOUT_SHAPE)]


def _model(model) -> ModelShape | None:
    """None, a ModelShape, or the preset a name names (any case: "7B" is "7b")."""
    if model is None or isinstance(model, ModelShape):
        return model
    if not isinstance(model, str):
        raise TypeError(f"plan: model must be a preset name ({', '.join(PRESETS)}) or a "
                        f"ModelShape, got {model!r} ({_kind(model)})")
    if model.lower() not in PRESETS:
        raise ValueError(f"plan: model names an unknown model preset {model!r}; choose from "
                         f"{', '.join(PRESETS)} or give params")
    return PRESETS[model.lower()]


def _shape(params, shape, seq) -> ModelShape | None:
    if (params is None) == (shape is None):
        raise ValueError("plan: give either params (a parameter count, e.g. 7e9) or model (a "
                         f"preset: {', '.join(PRESETS)}, or a ModelShape), not both or neither")
    if params is not None:
        if seq is not None:
            raise ValueError("plan: seq sets the sequence length of the activations, which params "
                             "does not count: plan a model preset or shape to count them, or "
                             "leave seq out")
        return None
    return shape.with_seq(seq) if seq is not None else shape


def _reduce(dtype) -> tuple[str, int]:
    """("fp32", 4) for None, "fp32" or torch.float32; ("bf16", 2) for "bf16", torch.bfloat16."""
    wanted = "'fp32' (the default, None: as parallelize does), 'bf16' or 'fp16' (or a torch dtype)"
    if dtype is not None and not isinstance(dtype, str) and not str(dtype).startswith("torch."):
        raise TypeError(f"plan: reduce_dtype must be {wanted}, got {dtype!r} ({_kind(dtype)})")
    name = "fp32" if dtype is None else str(dtype).removeprefix("torch.")
    if name not in REDUCE_DTYPES:
        raise ValueError(f"plan: reduce_dtype must be {wanted}, got {dtype!r}")
    return REDUCE_DTYPES[name]


def _strategies(strategies) -> tuple[str, ...]:
    """A tuple of names; a string is read as the CLI reads it: "fsdp" or "ddp,fsdp"."""
    choose = f"choose from {', '.join(PLAN_STRATEGIES)}"
    if isinstance(strategies, str):
        strategies = [name.strip() for name in strategies.split(",") if name.strip()]
    if not isinstance(strategies, (tuple, list)) or not all(isinstance(name, str)
                                                            for name in strategies):
        raise TypeError(f"plan: strategies must be names, a tuple ('ddp', 'fsdp') or a string "
                        f"'ddp,fsdp'; {choose}; got {strategies!r} ({_kind(strategies)})")
    if not strategies:
        raise ValueError(f"plan: no strategies given; {choose}")
    unknown = [name for name in strategies if name not in PLAN_STRATEGIES]
    if unknown:
        raise ValueError(f"plan: strategies must be names the planner knows, got {unknown}; "
                         f"{choose}")
    repeated = sorted({name for name in strategies if strategies.count(name) > 1})
    if repeated:
        raise ValueError(f"plan: strategies names {repeated} more than once; name each strategy "
                         f"once")
    return tuple(strategies)


def _shard_size(shard_size: int | None, n: int, per_node: int, hsdp: bool) -> int:
    """hsdp's S: given (already a whole number >= 1), or the largest divisor of ``n`` that fits
    in a node."""
    if shard_size is None:
        return max(d for d in range(1, min(per_node, n) + 1) if n % d == 0)
    if not hsdp:
        raise ValueError(f"plan: shard_size {shard_size} is hsdp's, but hsdp is not among the "
                         f"strategies; add hsdp, or leave shard_size out")
    if n % shard_size:
        raise ValueError(f"plan: shard_size {shard_size} does not divide gpus {n}: hsdp needs "
                         f"groups of equal size; pick a divisor of {n}")
    return shard_size


def _activations(shape, micro_batch: int, act_bytes: int, checkpointing: bool) -> tuple:
    """Activation bytes at forward end, at backward start, then in the backward of each layer
    below the last (1, 2, ... layers done): see ``ModelShape.activation_bytes``."""
    if shape is None:
        return (0, 0, 0)
    at = partial(shape.activation_bytes, micro_batch, act_bytes, checkpointing)
    return (at("forward end"), at("backward start"),
            *(at("backward", done) for done in range(1, max(shape.n_layer, 2))))
