"""The planner against measured runs, per option, on this machine (CPU ranks with gloo, or one
NCCL rank per GPU): the table the closing notes quote, and on a GPU the reserve measured.

    python benchmarks/planner_check.py                 # CPU: 2 gloo ranks
    python benchmarks/planner_check.py --world-size 1  # a GPU box: NCCL, offload included

Per option, the planned peak against the measured one (``track_memory``'s tensors; on a GPU also
the caching allocator's peak) and their ratio. On a GPU it also measures what the reserve is
for: the memory the CUDA context and NCCL take before any tensor (``torch.cuda.mem_get_info``
around the process group's first collective) and the allocator's reserved-over-allocated at the
peak (fragmentation), against the planner's default (``fsdp_mini.planner.hardware``).
"""

from __future__ import annotations

import argparse

import torch

import fsdp_mini
from fsdp_mini.jobs.peaks import option_peaks
from fsdp_mini.models import GPTConfig
from fsdp_mini.planner import hardware
from fsdp_mini.planner.plan import plan
from fsdp_mini.planner.shapes import ModelShape

BF16 = torch.bfloat16
# name: (strategy, parallelize options, micro-batches, the plan's options)
CASES = {
    "ddp fp32": ("ddp", {}, 1, {"precision": "fp32"}),
    "zero2 fp32": ("zero2", {}, 1, {"precision": "fp32"}),
    "fsdp fp32": ("fsdp", {}, 1, {"precision": "fp32"}),
    "fsdp bf16": ("fsdp", {"param_dtype": BF16}, 1, {"precision": "bf16-mixed"}),
    "fsdp bf16, reduce bf16": ("fsdp", {"param_dtype": BF16, "reduce_dtype": BF16}, 1,
                               {"precision": "bf16-mixed", "reduce_dtype": "bf16"}),
    "fsdp checkpointing": ("fsdp", {"activation_checkpointing": True}, 1,
                           {"precision": "fp32", "checkpointing": True}),
    "fsdp prefetch": ("fsdp", {"prefetch": True}, 1, {"precision": "fp32", "prefetch": True}),
    "fsdp 2 micro-batches, no_sync": ("fsdp", {}, 2,
                                      {"precision": "fp32", "micro_batches": 2, "no_sync": True}),
    "fsdp offload (GPU)": ("fsdp", {"offload": True}, 1, {"precision": "fp32", "offload": True}),
}


def rank_figures(rank, world_size, model, micro_batch, names) -> dict:
    """On each rank: the memory CUDA and NCCL took before any tensor (GPUs only), then each
    case's peaks (:func:`fsdp_mini.jobs.peaks.option_peaks`)."""
    device = fsdp_mini.rank_device()
    out = {}
    if device.type == "cuda":  # Note: what the context and NCCL took before any tensor of the job
        free_before, total = torch.cuda.mem_get_info(device)
        torch.distributed.barrier()
        free_after, _ = torch.cuda.mem_get_info(device)
        out["_reserve"] = {"total": total, "context_and_nccl": total - free_after,
                           "nccl_first_collective": free_before - free_after}
    cfg = GPTConfig.sized(model)
    cases = {name: (cfg, *CASES[name][:3]) for name in names
             if device.type == "cuda" or not CASES[name][1].get("offload")}
    return {**out, **option_peaks(rank, world_size, cases, micro_batch)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    parser.add_argument("--world-size", type=int, default=gpus or 2)
    parser.add_argument("--model", choices=("tiny", "default"), default="default")
    parser.add_argument("--micro-batch", type=int, default=4)
    args = parser.parse_args()
    backend = "nccl" if gpus else "gloo"
    n, names = args.world_size, list(CASES)
    per_rank = fsdp_mini.launch(rank_figures, n, args.model, args.micro_batch, names,
                                backend=backend, timeout=600)
    shape = ModelShape.from_gpt(GPTConfig.sized(args.model))
    print(f"planner_check: {args.model} GPT ({shape.params():,} parameters), {n} {backend} "
          f"rank(s), micro-batch {args.micro_batch}; measured = the largest rank's")
    print(f"{'option':32s} {'planned':>12s} {'tensors':>12s} {'ratio':>7s} {'allocator':>12s} "
          f"{'ratio':>7s} {'fragment.':>11s}")
    for name in names:
        if name not in per_rank[0]:
            print(f"{name:32s} (GPU only)")
            continue
        strategy, _, _, plan_options = CASES[name]
        planned = plan(model=shape, gpus=n, micro_batch=args.micro_batch, strategies=(strategy,),
                       **plan_options).strategies[strategy].peak_bytes
        tensors = max(r[name]["tensors"] for r in per_rank)
        row = f"{name:32s} {planned:12,.0f} {tensors:12,d} {planned / tensors:7.3f}"
        if "allocator" in per_rank[0][name]:
            alloc = max(r[name]["allocator"] for r in per_rank)
            frag = max(r[name]["fragmentation"] for r in per_rank)
            row += f" {alloc:12,d} {planned / alloc:7.3f} {frag:11,d}"
        print(row)
    if "_reserve" in per_rank[0]:
        r = max(per_rank, key=lambda x: x["_reserve"]["context_and_nccl"])["_reserve"]
        print(f"reserve: the CUDA context + NCCL took {r['context_and_nccl'] / 1e9:.2f} GB of "
              f"{r['total'] / 1e9:.1f} GB before any tensor (the first collective: "
              f"{r['nccl_first_collective'] / 1e9:.2f} GB); the planner keeps "
              f"{hardware.default_reserve_gb(r['total'] / 1e9):.2f} GB ({hardware.RESERVE})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
