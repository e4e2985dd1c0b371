"""A training configuration in the words labs 07 and 11 use, as the planner counts it.

    config = {"strategy": "fsdp", "precision": "bf16-mixed", "checkpointing": True}
    describe(config)            # 'fsdp, bf16-mixed, with checkpointing'
    what_is_invalid(config)     # '' (or what is wrong with an answer, in words)
    options_of(config)          # the parallelize options that run it in fsdp_mini

"bf16-mixed" here means 2-byte all-gathers *and* 2-byte gradient reductions: in fsdp_mini
``param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16`` (``options_of``), in the planner
``reduce_dtype="bf16"`` (``reduce_dtype_of``). Both default to fp32 reductions; lab 07 measured
that default.
"""

from __future__ import annotations

import torch

__all__ = ["PRECISIONS", "STRATEGIES", "describe", "options_of", "reduce_dtype_of",
           "what_is_invalid"]

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")   # the less sharded first
PRECISIONS = ("fp32", "bf16-mixed")


def describe(config) -> str:
    """``{"strategy": "fsdp", "precision": "bf16-mixed", "checkpointing": True}`` in words."""
    if config is None:
        return "nothing fits"
    ck = "with checkpointing" if config["checkpointing"] else "no checkpointing"
    return f"{config['strategy']}, {config['precision']}, {ck}"


def what_is_invalid(answer) -> str:
    """'' if ``answer`` is None or a configuration, else what is wrong with it."""
    if answer is None:
        return ""
    if not isinstance(answer, dict) or set(answer) != {"strategy", "precision", "checkpointing"}:
        return (f"returned {answer!r}: return a dict with the keys strategy, precision, "
                f"checkpointing, or None when nothing fits")
    if answer["strategy"] not in STRATEGIES or answer["precision"] not in PRECISIONS \
            or answer["checkpointing"] not in (True, False):
        return (f"returned {answer!r}: strategy one of {', '.join(STRATEGIES)}, precision one of "
                f"{', '.join(PRECISIONS)}, checkpointing True or False")
    return ""


def options_of(config: dict) -> dict:
    """The ``parallelize`` options of a configuration, as the planner counts it.

    >>> options_of({"strategy": "fsdp", "precision": "bf16-mixed", "checkpointing": False})
    {'reduce_dtype': torch.bfloat16, 'param_dtype': torch.bfloat16}
    """
    strategy, options = config["strategy"], {}
    if config["precision"] == "bf16-mixed":
        if strategy in ("zero1", "zero2"):
            # Note: zero all-gathers its fp32 shards; the planner counts 2-byte all-gathers there.
            raise ValueError(f"{strategy} with bf16-mixed cannot run as the planner counts it in "
                             f"fsdp_mini (zero all-gathers fp32 parameters): run fp32, or fsdp")
        options["reduce_dtype"] = torch.bfloat16
        if strategy == "fsdp":
            options["param_dtype"] = torch.bfloat16
    if config["checkpointing"]:
        if strategy != "fsdp":
            raise ValueError("activation checkpointing is an fsdp option in fsdp_mini")
        options["activation_checkpointing"] = True
    return options


def reduce_dtype_of(precision: str) -> str | None:
    """The planner's ``reduce_dtype`` for a precision of these configurations: "bf16" for
    bf16-mixed (its gradients travel in bf16, as ``options_of`` runs it), None (fp32) else."""
    return "bf16" if precision == "bf16-mixed" else None
