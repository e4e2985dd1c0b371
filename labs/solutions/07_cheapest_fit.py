"""Lab 07, reference solution: the cheapest configuration whose planned peak fits the GPUs.

Try every candidate: each strategy, each precision, with and without activation checkpointing.
Keep those whose *peak* (not only the state kept between steps) fits the GPU's memory with the
planner's reserve kept free (``.fits``), the activations included (give plan the model's shape,
not a parameter count). The cheapest is the one whose step is fastest (``step_seconds``: the
compute, plus the communication the overlap does not hide): on a fixed number of GPUs, the
fewest GPU-hours per token. At equal times no recomputation beats checkpointing, and the less
sharded strategy comes first. GPU memory is in GB (10**9 bytes), as the planner takes it.
"""

import fsdp_mini

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")    # the less sharded first
PRECISIONS = ("fp32", "bf16-mixed")


def cheapest_fit(model, gpus, gpu_mem_gb, micro_batch=1):
    """The cheapest configuration that fits: {"strategy", "precision", "checkpointing"}, or None."""
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost = cost
                    best = {"strategy": strategy, "precision": precision,
                            "checkpointing": checkpointing}
    return best
