"""``fsdp-mini plan``: will a model fit, per strategy, and what does a step send?

    fsdp-mini plan --params 7e9 --gpus 8 --gpu-mem 80 --precision bf16-mixed
    fsdp-mini plan --model 70b --gpus 64 --micro-batch 1 --checkpointing --json plan.json
    fsdp-mini plan --layers 24 --hidden 2048 --heads 16 --vocab 50304 --seq 2048 --gpus 8
    fsdp-mini plan --model 7b --gpus 32 --gpu A100 --efficiency 0.35 --reduce-dtype bf16
    fsdp-mini plan --model 70b --gpus 64 --checkpointing --train-tokens 2e12 --price-per-gpu-hour 3

Nothing is launched: the numbers come from :func:`fsdp_mini.plan` (the formulas). Bad input is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import os
import re
import sys

from ..planner import hardware
from ..planner.plan import PLAN_STRATEGIES, PRECISIONS, SEQ_WITHOUT_SHAPE, plan
from ..planner.table import format_plan
from ..planner.shapes import PRESETS, ModelShape

SHAPE_ARGS = ("layers", "hidden", "heads", "vocab")  # a custom shape needs all four


def number(text: str) -> int | float:
    """A flag's number as written (``8``, ``7e9``, ``0.4``, ``nan``): an int or a float, left
    to :func:`fsdp_mini.plan` to judge, which names the flag if it is wrong (a fraction where a
    count is meant: ``--gpus 2.5``); text that is no number is argparse's error."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def kit_presets() -> dict[str, ModelShape]:
    """The class presets plus the kit's own GPTs (``tiny``, ``default``)."""
    from ..models import GPTConfig
    return {**PRESETS, "tiny": ModelShape.from_gpt(GPTConfig.tiny()),
            "default": ModelShape.from_gpt(GPTConfig())}


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="predict memory and traffic per GPU for every strategy")
    what = p.add_argument_group("the model: --params, --model, or a shape")
    what.add_argument("--params", type=number, help="parameter count, e.g. 7e9 (no activations)")
    what.add_argument("--model", help=f"a preset: {', '.join(kit_presets())}")
    for name, example in (("layers", 32), ("hidden", 4096), ("heads", 32), ("vocab", 32000)):
        what.add_argument(f"--{name}", type=number, help=f"shape: {name} (e.g. {example})")
    what.add_argument("--kv-heads", type=number, help="shape: key/value heads (GQA; default heads)")
    what.add_argument("--ffn", type=number, help="shape: MLP width (default 4 x hidden)")
    what.add_argument("--seq", type=number, help="sequence length (default: the preset's, or 2048)")
    p.add_argument("--micro-batch", type=number, default=1, help="sequences per GPU (default 1)")
    p.add_argument("--gpus", type=number, default=8, help="GPUs (data-parallel ranks, default 8)")
    p.add_argument("--gpu-mem", type=number, default=None,
                   help="GB (10⁹ B) per GPU (default: the --gpu preset's, 80 for an H100)")
    p.add_argument("--reserve-gb", type=number, default=None,
                   help=f"GB kept free per GPU (default {hardware.RESERVE})".replace("%", "%%"))
    p.add_argument("--precision", default="bf16-mixed",
                   help=f"{' or '.join(PRECISIONS)} (default bf16-mixed)")
    p.add_argument("--reduce-dtype", default=None,
                   help="the dtype gradients are reduced in: fp32, bf16 or fp16 (default fp32, "
                        "as parallelize does)")
    p.add_argument("--micro-batches", type=number, default=1,
                   help="micro-batches per step (gradient accumulation, default 1)")
    p.add_argument("--no-sync", action="store_true",
                   help="reduce the gradients once per step, not after each micro-batch")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    p.add_argument("--offload", action="store_true", help="sharded state in CPU memory")
    p.add_argument("--prefetch", action="store_true", help="fsdp gathers the next unit ahead")
    p.add_argument("--shard-size", type=number, default=None,
                   help="hsdp: GPUs per shard group (default: the largest divisor of --gpus "
                        "that fits in a node of --gpus-per-node)")
    time = p.add_argument_group("the step time: compute and the network")
    time.add_argument("--gpu", default=hardware.DEFAULT_GPU,
                      help=f"a preset for FLOP/s, NVLink and memory: {', '.join(hardware.GPUS)} "
                           f"(default {hardware.DEFAULT_GPU})")
    time.add_argument("--tflops", type=number, default=None,
                      help="peak TFLOPS per GPU instead of the preset's")
    time.add_argument("--efficiency", type=number, default=hardware.DEFAULT_EFFICIENCY,
                      help=f"achieved share of the peak (MFU, default "
                           f"{hardware.DEFAULT_EFFICIENCY:g})")
    time.add_argument("--gpus-per-node", type=number, default=hardware.GPUS_PER_NODE,
                      help=f"GPUs per node on NVLink (default {hardware.GPUS_PER_NODE})")
    time.add_argument("--node-bandwidth", type=number, default=None, metavar="GB_PER_S",
                      help="NVLink per GPU, one way (default: the --gpu preset's)")
    time.add_argument("--node-latency", type=number, default=hardware.NODE_LATENCY_US,
                      metavar="US", help=f"inside a node, µs (default {hardware.NODE_LATENCY_US:g})")
    time.add_argument("--link-bandwidth", type=number, default=50.0, metavar="GB_PER_S",
                      help="across nodes, per GPU, one way (default 50 GB/s: InfiniBand NDR)")
    time.add_argument("--link-latency", type=number, default=10.0, metavar="US",
                      help="across nodes, latency per message, µs (default 10)")
    money = p.add_argument_group("a training budget: time, GPU-hours and cost")
    money.add_argument("--train-tokens", type=number, default=None,
                       help="tokens to train on, e.g. 2e12")
    money.add_argument("--train-steps", type=number, default=None,
                       help="or steps of the global batch (micro-batch x micro-batches x seq x GPUs)")
    money.add_argument("--price-per-gpu-hour", type=number, default=None,
                       help="your price of one GPU-hour, in your currency (none is built in)")
    p.add_argument("--strategies", default=",".join(PLAN_STRATEGIES),
                   help=f"comma-separated, from {','.join(PLAN_STRATEGIES)} (default: all)")
    p.add_argument("--json", metavar="PATH", help="also write the plan to PATH as JSON")


# The one table from plan()'s keywords (and ModelShape's fields, --layers ...) to the flags
# that set them (--dest): the arguments go to plan() as they are, and its errors come back with
# each name written as its flag.
FLAGS = {"params": "params", "seq": "seq", "gpus": "gpus", "gpu_mem_gb": "gpu_mem",
         "precision": "precision", "micro_batch": "micro_batch", "checkpointing": "checkpointing",
         "offload": "offload", "prefetch": "prefetch", "shard_size": "shard_size",
         "bandwidth_gbs": "link_bandwidth", "latency_us": "link_latency",
         "strategies": "strategies", "reduce_dtype": "reduce_dtype", "reserve_gb": "reserve_gb",
         "gpu": "gpu", "tflops": "tflops", "efficiency": "efficiency",
         "gpus_per_node": "gpus_per_node", "node_bandwidth_gbs": "node_bandwidth",
         "node_latency_us": "node_latency", "micro_batches": "micro_batches",
         "no_sync": "no_sync", "train_tokens": "train_tokens", "train_steps": "train_steps",
         "price_per_gpu_hour": "price_per_gpu_hour"}
SHAPE_FLAGS = {"n_layer": "layers", "d_model": "hidden", "n_head": "heads", "vocab": "vocab",
               "kv_heads": "kv_heads", "ffn": "ffn"}


def _model(args) -> ModelShape | None:
    """plan()'s ``model`` from --model or the shape flags; None with --params."""
    shape_given = [a for a in SHAPE_ARGS if getattr(args, a) is not None]
    chosen = sum(x is not None for x in (args.params, args.model)) + bool(shape_given)
    if chosen != 1:
        raise ValueError("give one of --params (e.g. 7e9), --model (e.g. 7b) or a shape "
                         "(--layers --hidden --heads --vocab), not both" if chosen
                         else "give --params or --model (e.g. --params 7e9 or --model 7b), or a "
                         "shape (--layers --hidden --heads --vocab)")
    if args.model is not None:
        presets = kit_presets()
        if args.model.lower() not in presets:
            raise ValueError(f"unknown model preset {args.model!r}; choose from "
                             f"{', '.join(presets)}")
        return presets[args.model.lower()]
    if args.params is not None:
        return None
    missing = [f"--{a}" for a in SHAPE_ARGS if getattr(args, a) is None]
    if missing:
        raise ValueError(f"a shape needs {', '.join(missing)} too")
    # Note: --seq reaches plan(), which sets it; the shape's own is plan()'s default
    return ModelShape(**{field: getattr(args, dest) for field, dest in SHAPE_FLAGS.items()},
                      seq=SEQ_WITHOUT_SHAPE)


def in_flags(message: str) -> str:
    """An error of plan() (or of ModelShape) with each name written as the flag that sets it
    (the longest first: ``gpus_per_node`` before ``gpus``), the function's prefix dropped."""
    message = re.sub(r"^(?:plan|ModelShape): ", "", message)
    names = {**FLAGS, **SHAPE_FLAGS}
    for name in sorted(names, key=len, reverse=True):
        flag = "--" + names[name].replace("_", "-")
        message = re.sub(rf"(?<![\w-]){name}(?!\w)", flag, message)
    return message


def plan_command(args, check_json_path) -> int:
    """Run ``fsdp-mini plan``; ``check_json_path(path)`` raises ValueError for a --json path that
    cannot be written (the one ``compare`` uses)."""
    try:
        model = _model(args)
        check_json_path(args.json)
        result = plan(model=model, **{name: getattr(args, dest) for name, dest in FLAGS.items()})
    except (ValueError, TypeError) as err:
        print(f"fsdp-mini plan: error: {in_flags(str(err))}", file=sys.stderr)
        return 2
    print(format_plan(result))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result.as_dict(), f, indent=1)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0
