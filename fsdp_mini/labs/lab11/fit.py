"""The assessment, task 1: the cheapest configuration whose planned peak fits a GPU budget *with
headroom*; the job's budget and the checker of ``choose_config``.

    labs.check_choose_config(choose_config)    # beside the reference on 108 budgets + the job's

A GPU loses memory before any tensor is made (the CUDA context, NCCL's buffers, fragmentation),
so a plan keeps some free: the planned peak must be at most (1 − headroom) × the GPU's memory,
in GB (10⁹ B). Example: 80 GB with 10 % headroom leaves 72 GB. Cheapest: the fewest bytes sent
per GPU per step; at equal bytes, no checkpointing first, then the less sharded strategy. Lab
07's check with a headroom (:mod:`fsdp_mini.labs.shared.search`): a verdict says what is wrong
with the answer given, never which configuration is right.
"""

from __future__ import annotations

from dataclasses import dataclass

import fsdp_mini

from ...planner.shapes import PRESETS, ModelShape
from ..common.configurations import describe, reduce_dtype_of
from ..common.exercise import load_solution, not_written_yet
from ..common.records import spread
from ..common.report import CheckResult, verdict_of_check
from ..common.plan_search import Search, SearchCheck, budget

__all__ = ["FIT_BUDGETS", "FitBudget", "JOB_BUDGET", "JOB_SHAPE", "check_choose_config",
           "planned"]

# Note: shapes no lab plans: a 32.5 B Llama-1-33B-like model (60 layers, no grouped-query
# attention, 2048 tokens), and GPT-3 2.7B's shape.
JOB_SHAPE = ModelShape(60, 6656, 52, 32000, 2048, ffn=17920, style="llama", tie_weights=False)
GPT_2B7 = ModelShape(32, 2560, 32, 50304, 2048)
SHAPES = {"2.7b": GPT_2B7, "13b": PRESETS["13b"], "32b": JOB_SHAPE}


@dataclass(frozen=True)
class FitBudget:
    """A model, its GPUs (``gpu_mem_gb`` in GB, 10⁹ B), the micro-batch and the headroom kept
    free (a fraction of the GPU's memory)."""

    model: str
    shape: ModelShape
    gpus: int
    gpu_mem_gb: float
    micro_batch: int
    headroom: float

    @property
    def limit_bytes(self) -> float:
        """The most a planned peak may be: (1 − headroom) × the GPU's memory.

        >>> FitBudget("32b", JOB_SHAPE, 64, 80, 1, 0.10).limit_bytes / 1e9
        72.0
        """
        return (1 - self.headroom) * self.gpu_mem_gb * 1e9

    def __str__(self) -> str:
        return (f"{self.model} on {self.gpus} GPUs of {self.gpu_mem_gb:g} GB, micro-batch "
                f"{self.micro_batch}, {self.headroom:.0%} headroom")


JOB_BUDGET = FitBudget("32b", JOB_SHAPE, 64, 80, 1, 0.10)
# The job, the job's model where nothing fits a 20 % headroom, a 13b and a 2.7b
FIT_BUDGETS = (JOB_BUDGET, FitBudget("32b", JOB_SHAPE, 8, 80, 4, 0.20),
               FitBudget("13b", PRESETS["13b"], 8, 80, 4, 0.10),
               FitBudget("2.7b", GPT_2B7, 8, 48, 1, 0.10))


def planned(budget: FitBudget, config: dict):
    """The planner's figures (a ``StrategyPlan``) of ``config`` on ``budget``'s GPUs."""
    p = fsdp_mini.plan(model=budget.shape, gpus=budget.gpus, gpu_mem_gb=budget.gpu_mem_gb,
                       precision=config["precision"], micro_batch=budget.micro_batch,
                       checkpointing=config["checkpointing"], strategies=(config["strategy"],),
                       reduce_dtype=reduce_dtype_of(config["precision"]))
    return p.strategies[config["strategy"]]


def _limit(c) -> float:
    return (1 - c["headroom"]) * c["gpu_mem_gb"] * 1e9


def _peak(c, s) -> str:
    return (f"{s.peak_bytes / 1e9:.1f} GB {'<=' if s.peak_bytes <= _limit(c) else '>'} "
            f"{_limit(c) / 1e9:.1f} GB ({c['gpu_mem_gb']:g} GB less {c['headroom']:.0%})")


CHOOSE = Search(
    "choose_config", ("gpus", "gpu_mem_gb", "micro_batch", "headroom"), "sent_bytes_per_step",
    cost_words=lambda s: f"{s.sent_bytes_per_step / 1e9:.1f} GB sent per GPU per step",
    room=_limit, peak_words=_peak, reveal=False,
    options=lambda precision: {"reduce_dtype": reduce_dtype_of(precision)},
    limits=(("it fits the GPU's whole memory: the headroom was not kept",
             lambda search, c, s: s.peak_bytes <= c["gpu_mem_gb"] * 1e9),
            ("it fits (1 - headroom) x gpu_mem_gb GiB: you read the budget in GiB (2^30 B); "
             "GPU memory and the planner are in GB (10^9 B)",
             lambda search, c, s: s.peak_bytes <= (1 - c["headroom"]) * c["gpu_mem_gb"] * 2**30),
            ("it fits gpu_mem_gb GiB: no headroom, and GB (10^9 B) read as GiB (2^30 B)",
             lambda search, c, s: s.peak_bytes <= c["gpu_mem_gb"] * 2**30),
            ("peak x (1 + headroom) <= memory: you kept the headroom on the peak, which leaves "
             "headroom / (1 + headroom) free, less than the headroom",
             lambda search, c, s: s.peak_bytes * (1 + c["headroom"]) <= c["gpu_mem_gb"] * 1e9)),
    plain=(("with micro-batch 1 (plan()'s default when micro_batch is not passed)",
            {"micro_batch": 1}),
           ("with bf16-mixed's gradients reduced in fp32 (plan()'s default: the task plans "
            "reduce_dtype='bf16')", {"_options": {}})))

CHECK = SearchCheck("task 1: your choose_config", search=CHOOSE, agreed=(
    "the same choice as the reference in every budget: the fewest bytes among the candidates "
    "whose peak is within the headroom, ties to no checkpointing and the less sharded"))


def configs(budgets=FIT_BUDGETS) -> list:
    """108 budgets (a 2.7B, a 13B and the job's model on 1 to 64 GPUs of 48 or 80 GB, micro-
    batches 1 and 4, headroom 0, 10 % and 20 %), smallest first; then ``budgets``."""
    family = [budget(c["model"], SHAPES[c["model"]], c["gpus"], c["gpu_mem_gb"],
                     c["micro_batch"], headroom=c["headroom"]) for c in spread(
        model=list(SHAPES), gpus=[1, 8, 64], gpu_mem_gb=[48, 80], micro_batch=[1, 4],
        headroom=[0.0, 0.1, 0.2])]
    return list(dict.fromkeys(family + _own(budgets)))


def _own(budgets) -> list:
    return [budget(b.model, b.shape, b.gpus, b.gpu_mem_gb, b.micro_batch, headroom=b.headroom)
            for b in budgets]


def _reference():
    return load_solution("11_choose_config", "choose_config")


# What tests/wrong_answers/ judges many answers with: the task's check, one batch
JUDGES = {"11_choose_config": lambda answers: CHECK.judge_many(answers, _reference(), configs())}


@verdict_of_check
def check_choose_config(fn, budgets=FIT_BUDGETS) -> CheckResult:
    """Check ``fn(model, gpus, gpu_mem_gb, micro_batch, headroom)`` beside the reference on the
    budgets of :func:`configs` (``budgets`` last, the job's first of them): the first budget
    where the choice differs, what yours costs, and what the budgets where it differs share."""
    result = CheckResult(CHECK.what)
    if not_written_yet(fn):
        result.facts["verdict"] = "choose_config is not written yet"
        return result.wrong("choose_config is not written yet: write its body in the cell above",
                            hint="lab 07's cheapest_fit, with the limit the headroom leaves"
                            ).finish()
    CHECK(fn, _reference(), result, configs=configs(budgets))
    records = result.facts["records"]
    answers = [records[c][0].get("choice") if c in records else None for c in _own(budgets)]
    wrong = [msg for ok, msg, _ in result.lines if not ok]
    result.facts.update(answers=answers, verdict=wrong[0] if wrong else (
        f"the cheapest configuration within the headroom on all {len(records)} budgets; for "
        f"the job: {describe(answers[0])}"))
    return result.finish()
