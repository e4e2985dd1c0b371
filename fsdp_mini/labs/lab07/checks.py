"""Lab 07: fitting bigger models: the checker of ``cheapest_fit`` (the measurements of the fsdp
options, ``measure_options``, are in ``runs.py``).

    labs.check_cheapest_fit(cheapest_fit)     # beside the reference on 96 budgets + the lab's

GPU memory is in GB (10⁹ bytes), as ``fsdp_mini.plan(gpu_mem_gb=...)`` takes it. A configuration
fits when its planned peak plus the planner's reserve (the CUDA context, NCCL's buffers,
fragmentation) is at most the GPU's memory (``.fits``); the cheapest is the fastest step
(``step_seconds``), then no checkpointing, then the less sharded strategy. The check asks your
function and the reference about 1.3B to 70B models on 1 to 64 GPUs of 24 to 80 GB, micro-batches
1 and 4 (ties where one GPU sends nothing, budgets where nothing fits), then the lab's own budgets
and the presets by name as the lab calls them later (:mod:`fsdp_mini.labs.shared.search`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...planner.hardware import default_reserve_gb
from ...planner.shapes import PRESETS, ModelShape
from ..common.exercise import load_solution, not_written_yet
from ..common.records import spread
from ..common.report import CheckResult, verdict_of_check
from ..common.plan_search import Search, SearchCheck, budget
from .runs import VARIANTS, gpt2_init, measure_options

__all__ = ["BUDGETS", "VARIANTS", "Budget", "check_cheapest_fit", "gpt2_init",
           "measure_options"]

GPT_1B = ModelShape(24, 2048, 16, 50304, 2048)    # a 1.3 B GPT (GPT-3 XL's shape)
SHAPES = {"1.3b": GPT_1B, **PRESETS}


@dataclass(frozen=True)
class Budget:
    """A model and the GPUs it must fit: ``gpu_mem_gb`` in GB (10⁹ B, the planner's unit)."""

    model: str
    gpus: int
    gpu_mem_gb: float
    micro_batch: int

    @property
    def shape(self) -> ModelShape:
        return SHAPES[self.model]

    def __str__(self) -> str:
        return (f"{self.model} on {self.gpus} GPUs of {self.gpu_mem_gb:g} GB, micro-batch "
                f"{self.micro_batch}")


# The lab's own: a 7B, a 70B, one budget where nothing fits, some where a few GB decide
BUDGETS = (Budget("1.3b", 2, 16, 4), Budget("7b", 2, 94, 1), Budget("7b", 8, 24, 1),
           Budget("7b", 4, 48, 1), Budget("70b", 16, 80, 1), Budget("70b", 4, 80, 1),
           Budget("1.3b", 4, 40, 8))


def _reserve(cfg) -> float:
    return default_reserve_gb(cfg["gpu_mem_gb"])


def _peak(cfg, s) -> str:
    return (f"{s.peak_bytes / 1e9:.1f} GB + {_reserve(cfg):.3g} GB reserve "
            f"{'<=' if s.fits else '>'} {cfg['gpu_mem_gb']:g} GB" + ("" if s.fits else
                                                                       " (does not fit)"))


CHEAPEST = Search(
    "cheapest_fit", ("gpus", "gpu_mem_gb", "micro_batch"), "step_seconds",
    cost_words=lambda s: (f"a step of {s.step_seconds:.3g} s ({s.compute_seconds:.3g} s "
                          f"compute, {s.exposed_comm_seconds:.3g} s of communication not "
                          f"hidden, {s.sent_bytes_per_step / 1e9:.3g} GB sent)"),
    room=lambda c: (c["gpu_mem_gb"] - _reserve(c)) * 1e9, fits=lambda c, s: s.fits,
    peak_words=_peak,
    limits=(("it fits the GPU's whole memory: the reserve the planner keeps free (the CUDA "
             "context, NCCL's buffers, fragmentation: .fits counts it) was left out",
             lambda search, c, s: s.peak_bytes <= c["gpu_mem_gb"] * 1e9),
            ("it fits gpu_mem_gb GiB (2^30 B): the budget is in GB (10^9 B), as .fits counts",
             lambda search, c, s: s.peak_bytes <= c["gpu_mem_gb"] * 2**30)),
    plain=(("with micro-batch 1 (plan()'s default when micro_batch is not passed)",
            {"micro_batch": 1}),
           ("for GPUs of 80 GB (plan()'s default when gpu_mem_gb is not passed)",
            {"gpu_mem_gb": 80}),
           ("for a GPU of gpu_mem_gb x 10^9 / 2^30 (GB turned into GiB: the budget and .fits "
            "are both in GB, 10^9 B)", {"gpu_mem_gb": lambda c: c["gpu_mem_gb"] * 1e9 / 2**30}),
           ("with bf16-mixed's gradients reduced in bf16 (reduce_dtype='bf16'; lab 07 plans "
            "what parallelize does: fp32 reductions, plan()'s default)", {"_options": lambda
            precision: {"reduce_dtype": "bf16"} if precision == "bf16-mixed" else {}})))

CHECK = SearchCheck("your cheapest_fit", search=CHEAPEST, agreed=(
    "the same choice as the reference in every budget: the fastest step among the candidates "
    "whose peak fits with the reserve, ties to no checkpointing and the less sharded"))


def configs(budgets=BUDGETS) -> list:
    """96 budgets from 1.3B on one GPU to 70B on 64, smallest first; then ``budgets``; then
    those of a preset again with its name, as the lab calls ``cheapest_fit("70b", ...)``."""
    family = [budget(c["model"], SHAPES[c["model"]], c["gpus"], c["gpu_mem_gb"],
                     c["micro_batch"]) for c in spread(
        model=list(SHAPES), gpus=[1, 2, 8, 64], gpu_mem_gb=[24, 48, 80], micro_batch=[1, 4])]
    named = [budget(b.model, b.shape, b.gpus, b.gpu_mem_gb, b.micro_batch, by_name=True)
             for b in budgets if b.model in PRESETS]
    return list(dict.fromkeys(family + _own(budgets) + named))


def _own(budgets) -> list:
    return [budget(b.model, b.shape, b.gpus, b.gpu_mem_gb, b.micro_batch) for b in budgets]


def _reference():
    return load_solution("07_cheapest_fit", "cheapest_fit")


# What tests/wrong_answers/ judges many answers with: the lab's check, one batch
JUDGES = {"07_cheapest_fit": lambda answers: CHECK.judge_many(answers, _reference(), configs())}


@verdict_of_check
def check_cheapest_fit(fn, budgets=BUDGETS) -> CheckResult:
    """Check ``fn(model, gpus, gpu_mem_gb, micro_batch)`` beside the reference on the budgets
    of :func:`configs` (``budgets``: the lab's own, last): the first budget where the choice
    differs, both choices with their planned peak and step, and what the budgets where yours
    differs have in common."""
    result = CheckResult(CHECK.what)
    if not_written_yet(fn):
        return result.wrong("cheapest_fit is not written yet: write its body in the cell above",
                            hint="labs.show_solution('07_cheapest_fit') shows one way").finish()
    cfgs = configs(budgets)
    CHECK(fn, _reference(), result, configs=cfgs)
    records = result.facts["records"]
    result.facts["answers"] = [records[c][0].get("choice") if c in records else None
                               for c in _own(budgets)]
    return result.finish()
