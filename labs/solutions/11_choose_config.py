"""Assessment, task 1, reference solution: the cheapest configuration whose planned peak fits
the GPUs with headroom.

Lab 07's search, with one change: the limit is not the GPU's memory but what the headroom leaves
of it, (1 - headroom) x gpu_mem_gb GB (10**9 bytes, the planner's unit). Every candidate
(strategy x precision x checkpointing) is planned with the model's shape, so that its peak counts
the activations; the cheapest sends the fewest bytes per GPU per step; at equal bytes, no
checkpointing comes first, then the less sharded strategy, then fp32.
"""

import fsdp_mini

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")    # the less sharded first
PRECISIONS = ("fp32", "bf16-mixed")


def choose_config(model, gpus, gpu_mem_gb, micro_batch, headroom):
    """The cheapest configuration within the headroom: {"strategy", "precision",
    "checkpointing"}, or None when nothing fits."""
    limit = (1 - headroom) * gpu_mem_gb * 1e9          # bytes a planned peak may use
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES,
                               reduce_dtype="bf16" if precision == "bf16-mixed" else None)
            for strategy, s in p.strategies.items():
                cost = (s.sent_bytes_per_step, checkpointing, STRATEGIES.index(strategy),
                        PRECISIONS.index(precision))
                if s.peak_bytes <= limit and (best_cost is None or cost < best_cost):
                    best_cost = cost
                    best = {"strategy": strategy, "precision": precision,
                            "checkpointing": checkpointing}
    return best
