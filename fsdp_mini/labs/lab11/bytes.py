"""The assessment, task 4: the bytes one rank must send per step in a configuration, from the
model's units; checked against the ledger of real runs and against the planner at the job's
scale.

    units = labs.units_of(shape)           # {"blocks.0": elements, ..., "root": elements}
    labs.check_bytes_per_step(bytes_per_step, runs, N)

Per step, one rank sends (ring model, N ranks; bytes per element: 4 in fp32; 2 in bf16-mixed,
the planner's, for parameters and gradients alike):

    ddp     one all-reduce of the gradients           2(N−1)/N × Ψ × grad bytes
    zero    reduce-scatter gradients, all-gather      (N−1)/N × Ψ × (grad + param bytes)
            the updated parameters
    fsdp    per unit: an all-gather in forward, one   (N−1)/N × unit × (2 param + grad bytes)
            in backward, a reduce-scatter; the root
            only once (it stays gathered for backward) (N−1)/N × root × (param + grad bytes)

Checkpointing changes no byte: its recomputation runs while the unit is gathered for backward
anyway (lab 07). Example, fsdp in fp32 on 2 ranks, one unit of 1000 elements and a root of 200:
½ × (1000 × 12 + 200 × 8) = 6800 B.
"""

from __future__ import annotations

import math

from ...planner.plan import plan
from ...planner.shapes import ModelShape
from ..common.exercise import not_written_yet
from ..common.configurations import describe, reduce_dtype_of
from ..common.report import CheckResult, verdict_of_check
from .fit import JOB_BUDGET
from .runs import JOB_GPT

__all__ = ["bytes_model", "check_bytes_per_step", "units_of"]

TOL = 1e-3   # padding: a unit is padded to a multiple of N elements, a few bytes in a thousand

MISTAKES = {
    "ddp for fsdp": ("you used DDP's formula for FSDP: FSDP sends 3 collectives of each unit "
                     "(2 all-gathers, 1 reduce-scatter), about 3Ψ, not DDP's 2Ψ",
                     "fsdp: (N−1)/N × unit × (2 × param bytes + grad bytes), the root once"),
    "fp32 gathers": ("you counted bf16-mixed all-gathers in fp32: in bf16-mixed the parameters "
                     "travel in 2 bytes", "param bytes: 2 in bf16-mixed, 4 in fp32"),
    "fp32 grads": ("you counted bf16-mixed gradients in fp32: the planner's bf16-mixed reduces "
                   "them in 2 bytes (reduce_dtype=torch.bfloat16)",
                   "grad bytes: 2 in bf16-mixed, 4 in fp32"),
    "no ring": ("the (N−1)/N is missing: one rank sends (N−1)/N of each payload (an all-reduce "
                "2(N−1)/N)", "multiply each collective's payload by (N−1)/N"),
    "all-reduce once": ("you counted DDP's all-reduce as one pass: it is a reduce-scatter then "
                        "an all-gather, 2(N−1)/N × the payload",
                        "ddp: 2(N−1)/N × Ψ × grad bytes"),
    "root twice": ("you gathered the root twice: it stays gathered from its forward to its "
                   "backward, so it is gathered once", "units['root']: one all-gather"),
    "checkpointing": ("you added all-gathers for checkpointing: the recomputation runs while the "
                      "unit is gathered for its backward anyway, so the bytes are the same",
                      "checkpointing changes no byte sent"),
    "bits": ("off by 8: you counted bits; the ledger counts bytes", "return bytes"),
}


def units_of(shape: ModelShape) -> dict[str, int]:
    """The elements of each fsdp unit of ``shape``: each layer (``"blocks.i"``), then the root.

    >>> units_of(ModelShape(2, 32, 2, 64, 16, positions=16))
    {'blocks.0': 12608, 'blocks.1': 12608, 'root': 2624}
    """
    units: dict[str, int] = {}
    for unit, numel in shape.tensors():
        units[unit] = units.get(unit, 0) + numel
    root = units.pop("root")
    return {**units, "root": root}


def bytes_model(config: dict, units: dict, world_size: int, mistake: str | None = None) -> float:
    """The kit's answer (or, with ``mistake``, what that slip gives); see the module docstring.

    >>> bytes_model({"strategy": "fsdp", "precision": "fp32", "checkpointing": False},
    ...             {"blocks.0": 1000, "root": 200}, 2)
    6800.0
    """
    n, bf16 = world_size, config["precision"] == "bf16-mixed"
    ring = 1.0 if mistake == "no ring" else (n - 1) / n
    param = 4 if not bf16 or mistake == "fp32 gathers" else 2
    grad = 4 if not bf16 or mistake == "fp32 grads" else 2
    psi, strategy = sum(units.values()), config["strategy"]
    if strategy == "fsdp" and mistake == "ddp for fsdp":
        strategy = "ddp"
    if strategy == "ddp":
        sent = (1 if mistake == "all-reduce once" else 2) * ring * psi * grad
    elif strategy in ("zero1", "zero2"):
        sent = ring * psi * (grad + param)
    else:
        sent = sum(ring * numel * (param * _gathers(name, config, mistake) + grad)
                   for name, numel in units.items())
    return sent * (8 if mistake == "bits" else 1)


def _gathers(unit: str, config: dict, mistake) -> int:
    """All-gathers of ``unit`` in a step: 2 (forward, backward), the root 1 (kept for backward)."""
    if unit == "root":
        return 2 if mistake == "root twice" else 1
    return 3 if mistake == "checkpointing" and config["checkpointing"] else 2


def job_cases(runs: dict, world_size: int, shape: ModelShape, gpus: int) -> list[tuple]:
    """(what, configuration, units, N, the bytes a rank sends): each run's ledger, then the
    planner at the job's scale for the configurations of the job's runs and a few more."""
    small = units_of(ModelShape.from_gpt(JOB_GPT))
    cases = [(f"the stand-in's ledger, {name} on {world_size} ranks", run["config"], small,
              world_size, run["sent_bytes"]) for name, run in runs.items()]
    big, seen = units_of(shape), []
    extra = [{"strategy": s, "precision": p, "checkpointing": ck} for s, p, ck in
             (("fsdp", "bf16-mixed", True), ("ddp", "bf16-mixed", False),
              ("zero2", "bf16-mixed", True), ("zero1", "fp32", False))]
    for config in [run["config"] for run in runs.values()] + extra:
        if config in seen:
            continue
        seen.append(config)
        p = plan(model=shape, gpus=gpus, precision=config["precision"],
                 checkpointing=config["checkpointing"], strategies=(config["strategy"],),
                 reduce_dtype=reduce_dtype_of(config["precision"]))
        cases.append((f"the planner, the job's model on {gpus} GPUs", config, big, gpus,
                      p.strategies[config["strategy"]].sent_bytes_per_step))
    return cases


def _number(got) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isfinite(got)


def _near(got, want) -> bool:
    return _number(got) and math.isclose(got, want, rel_tol=TOL)


@verdict_of_check
def check_bytes_per_step(fn, runs: dict, world_size: int, shape: ModelShape | None = None,
                         gpus: int | None = None) -> CheckResult:
    """Check ``fn(config, units, world_size)`` against each run's ledger (``runs`` from
    :func:`run_job_configs`) and against the planner for the job's model on its GPUs (default:
    the job's); a set of answers a known slip gives is named."""
    result = CheckResult("task 4: your bytes_per_step")
    if not_written_yet(fn):
        result.facts["verdict"] = "bytes_per_step is not written yet"
        return result.wrong("bytes_per_step is not written yet: write its body in the cell "
                            "above", hint="sum, over the step's collectives, (N−1)/N × payload "
                            "(2(N−1)/N for an all-reduce)").finish()
    cases = job_cases(runs, world_size, shape or JOB_BUDGET.shape, gpus or JOB_BUDGET.gpus)
    answers = []
    for what, config, units, n, want in cases:
        try:
            got = fn(dict(config), dict(units), n)
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            result.facts["verdict"] = f"bytes_per_step raised {type(e).__name__}"
            return result.wrong(f"bytes_per_step({describe(config)}, ..., {n}) raised "
                                f"{type(e).__name__}: {e}").finish()
        answers.append(got)
        result.check(_near(got, want), f"{what}: {describe(config)}: {want:,.0f} B per step",
                     f"{what}: {describe(config)}: you say {got:,.0f} B, it sends {want:,.0f} B "
                     f"(yours is x{got / want:.3f})" if _number(got) else
                     f"{what}: {describe(config)}: you returned {got!r}, not a number of bytes")
    result.facts["verdict"] = (f"the bytes per step of all {len(cases)} runs and plans, the "
                               f"ledger's and the planner's")
    if not result.passed:
        result.facts["verdict"] = "wrong bytes per step for some configurations"
        for mistake, (words, hint) in MISTAKES.items():
            if all(_near(got, bytes_model(config, units, n, mistake))
                   for got, (_, config, units, n, _) in zip(answers, cases)):
                result.wrong(words, hint=hint)
                result.facts["verdict"] = words
                break
    return result.finish()
