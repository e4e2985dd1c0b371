"""The assessment, task 1: the cheapest configuration whose planned peak fits a GPU budget *with
headroom*; the job's budget and the checker of ``choose_config``.

    labs.check_choose_config(choose_config)    # ✔/✘ per budget; a known mistake is named

A GPU loses memory before any tensor is made (the CUDA context, NCCL's buffers, the allocator's
fragmentation), so a plan keeps some free: the planned peak must be at most (1 − headroom) × the
GPU's memory, in GB (10⁹ B) as the planner takes it. Example: 80 GB with 10 % headroom leaves
72 GB, so a configuration that peaks at 73 GB fits the GPU but not the plan. Cheapest: as in
lab 07, the fewest bytes sent per GPU per step; at equal bytes, no checkpointing first, then the
less sharded strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...planner.plan import plan
from ...planner.shapes import PRESETS, ModelShape
from ..common.configurations import (PRECISIONS, STRATEGIES, describe, reduce_dtype_of,
                                     what_is_invalid)
from ..common.exercise import not_written_yet
from ..common.report import CheckResult, verdict_of_check

__all__ = ["FIT_BUDGETS", "FitBudget", "JOB_BUDGET", "JOB_SHAPE", "check_choose_config",
           "planned"]

# Note: shapes no lab plans: a 32.5 B Llama-1-33B-like model (60 layers, no grouped-query
# attention, 2048 tokens), and GPT-3 2.7B's shape.
JOB_SHAPE = ModelShape(60, 6656, 52, 32000, 2048, ffn=17920, style="llama", tie_weights=False)
GPT_2B7 = ModelShape(32, 2560, 32, 50304, 2048)


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
# Note: chosen so that each mistake below gives a different set of answers: the job, the job's
# model where nothing fits a 20 % headroom, a 13b and a 2.7b where zero2 and zero1 win.
FIT_BUDGETS = (JOB_BUDGET, FitBudget("32b", JOB_SHAPE, 8, 80, 4, 0.20),
               FitBudget("13b", PRESETS["13b"], 8, 80, 4, 0.10),
               FitBudget("2.7b", GPT_2B7, 8, 48, 1, 0.10))

# mistake: (the plain words, the hint); _limit and _search say what each one counts
MISTAKES = {
    "no headroom": ("your configurations fit the GPUs' whole memory: the headroom was not kept",
                    "compare peak_bytes with (1 - headroom) * gpu_mem_gb * 1e9"),
    "GiB": ("you read the budget in GiB (2^30 B); GPU memory and the planner are in GB (10^9 B)",
            "(1 - headroom) * gpu_mem_gb * 1e9, not * 2**30"),
    "GiB, no headroom": ("you compared with the whole memory read in GiB (2^30 B): no headroom, "
                         "and GB (10^9 B) read as GiB", "(1 - headroom) * gpu_mem_gb * 1e9"),
    "fixed headroom": ("you kept 10 % free whatever the headroom asked: one budget asks for 20 %",
                       "use the headroom argument"),
    "headroom on the peak": ("you kept the headroom on the peak (peak x (1 + headroom) <= "
                             "memory): that leaves less than the headroom free",
                             "peak <= (1 - headroom) x memory"),
    "activations": ("you ignored the activations: your answers are those of a plan from a "
                    "parameter count", "give plan() the model's shape (model=...)"),
    "fp32 only": ("you did not consider bf16-mixed", "try precision='bf16-mixed' too"),
    "no checkpointing": ("you did not consider activation checkpointing",
                         "try checkpointing=True too"),
    "persistent": ("your configurations fit by the state kept between steps (persistent_bytes), "
                   "not by the peak within a step", "compare peak_bytes"),
    "smallest peak": ("you picked the smallest peak: the cheapest is the one that sends the "
                      "fewest bytes per step, among those that fit",
                      "compare sent_bytes_per_step of the candidates that fit"),
    "no fit check": ("you chose the cheapest configuration whether or not it fits",
                     "keep only the candidates whose peak fits the limit"),
}


def _limit(budget: FitBudget, mistake: str | None) -> float:
    mem, h = budget.gpu_mem_gb, budget.headroom
    return {"no headroom": mem * 1e9, "GiB": (1 - h) * mem * 2**30, "GiB, no headroom":
            mem * 2**30, "fixed headroom": 0.9 * mem * 1e9,
            "headroom on the peak": mem * 1e9 / (1 + h)}.get(mistake, budget.limit_bytes)


def _plans(budget: FitBudget) -> dict:
    """Every candidate's plan; under ("params", ...) those of a parameter count (no activations)."""
    out = {}
    for prec in PRECISIONS:
        for ck in (False, True):
            common = {"gpus": budget.gpus, "precision": prec, "micro_batch": budget.micro_batch,
                      "checkpointing": ck, "strategies": STRATEGIES,
                      "reduce_dtype": reduce_dtype_of(prec)}
            out[(prec, ck)] = plan(model=budget.shape, **common)
            out[("params", prec, ck)] = plan(params=budget.shape.params(), **common)
    return out


def _search(plans: dict, budget: FitBudget, mistake: str | None = None):
    """The cheapest configuration within the limit, as the reference finds it or as ``mistake``."""
    limit, best, best_cost = _limit(budget, mistake), None, None
    for key, p in plans.items():
        if (key[0] == "params") != (mistake == "activations"):
            continue
        prec, ck = key[-2:]
        if (mistake == "fp32 only" and prec != "fp32") or (mistake == "no checkpointing" and ck):
            continue
        for name, s in p.strategies.items():
            used = {"persistent": s.persistent_bytes, "no fit check": 0.0}.get(mistake,
                                                                              s.peak_bytes)
            cost = ((s.peak_bytes,) if mistake == "smallest peak" else
                    (s.sent_bytes_per_step, ck, STRATEGIES.index(name)))
            if used <= limit and (best_cost is None or cost < best_cost):
                best, best_cost = {"strategy": name, "precision": prec, "checkpointing": ck}, cost
    return best


def planned(budget: FitBudget, config: dict):
    """The planner's figures (a ``StrategyPlan``) of ``config`` on ``budget``'s GPUs."""
    p = plan(model=budget.shape, gpus=budget.gpus, gpu_mem_gb=budget.gpu_mem_gb,
             precision=config["precision"], micro_batch=budget.micro_batch,
             checkpointing=config["checkpointing"], strategies=(config["strategy"],),
             reduce_dtype=reduce_dtype_of(config["precision"]))
    return p.strategies[config["strategy"]]



def _judge(result: CheckResult, budget: FitBudget, plans: dict, answer, want) -> None:
    """One ✔/✘ line for ``budget``. Note: a ✘ line says what is wrong with the answer given,
    not what the right one is: the checker is an assessment's."""
    limit = (f"{budget.limit_bytes / 1e9:.1f} GB ({budget.gpu_mem_gb:g} GB less "
             f"{budget.headroom:.0%})")
    if answer == want:
        if want is None:
            low = min(s.peak_bytes for k, p in plans.items() if k[0] != "params"
                      for s in p.strategies.values())
            result.ok(f"{budget}: nothing fits, rightly: the smallest planned peak is "
                      f"{low / 1e9:.1f} GB > {limit}")
        else:
            s = plans[(want["precision"], want["checkpointing"])].strategies[want["strategy"]]
            result.ok(f"{budget}: {describe(want)}: planned peak {s.peak_bytes / 1e9:.1f} GB <= "
                      f"{limit}, {s.sent_bytes_per_step / 1e9:.1f} GB sent per GPU per step")
        return
    if answer is None:
        result.wrong(f"{budget}: you found nothing, but a configuration fits within {limit}")
        return
    s = plans[(answer["precision"], answer["checkpointing"])].strategies[answer["strategy"]]
    peak, mem = s.peak_bytes, budget.gpu_mem_gb * 1e9
    if peak > mem:
        gib = (f"; it would fit {budget.gpu_mem_gb:g} GiB: GPU memory is in GB (10^9 B)"
               if peak <= budget.gpu_mem_gb * 2**30 else "")
        result.wrong(f"{budget}: {describe(answer)} does not fit the GPU: its planned peak is "
                     f"{peak / 1e9:.1f} GB > {budget.gpu_mem_gb:g} GB{gib}")
    elif peak > budget.limit_bytes:
        result.wrong(f"{budget}: {describe(answer)} fits {budget.gpu_mem_gb:g} GB with no "
                     f"headroom: its planned peak {peak / 1e9:.1f} GB is over {limit}")
    elif want is None:
        result.wrong(f"{budget}: {describe(answer)} fits, but the planner says nothing does")
    else:
        w = plans[(want["precision"], want["checkpointing"])].strategies[want["strategy"]]
        ties = w.sent_bytes_per_step == s.sent_bytes_per_step
        result.wrong(f"{budget}: {describe(answer)} fits, but it is not the cheapest: it sends "
                     f"{s.sent_bytes_per_step / 1e9:.1f} GB per step"
                     + (", and another that fits sends as few: at equal bytes no checkpointing "
                        "comes first, then the less sharded strategy" if ties else
                        f"; one that fits sends {w.sent_bytes_per_step / 1e9:.1f} GB"))


@verdict_of_check
def check_choose_config(fn, budgets=FIT_BUDGETS) -> CheckResult:
    """Check ``fn(model, gpus, gpu_mem_gb, micro_batch, headroom)`` on ``budgets``: the cheapest
    configuration among ddp/zero1/zero2/fsdp x fp32/bf16-mixed x checkpointing whose planned
    peak is at most (1 − headroom) × the memory, or None. A known mistake's answers are named."""
    result = CheckResult("task 1: your choose_config")
    if not_written_yet(fn):
        result.facts["verdict"] = "choose_config is not written yet"
        return result.wrong("choose_config is not written yet: write its body in the cell above",
                            hint="lab 07's cheapest_fit, with the limit the headroom leaves"
                            ).finish()
    answers, wants, all_plans = [], [], []
    for b in budgets:
        try:
            answer = fn(b.shape, b.gpus, b.gpu_mem_gb, b.micro_batch, b.headroom)
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            result.facts["verdict"] = f"choose_config raised {type(e).__name__}"
            return result.wrong(f"choose_config({b.model!r} shape, {b.gpus}, {b.gpu_mem_gb:g}, "
                                f"{b.micro_batch}, {b.headroom:g}) raised {type(e).__name__}: "
                                f"{e}").finish()
        if (bad := what_is_invalid(answer)):
            result.facts["verdict"] = "choose_config returned an answer of the wrong form"
            return result.wrong(f"{b}: {bad}").finish()
        plans = _plans(b)
        want = _search(plans, b)
        _judge(result, b, plans, answer, want)
        answers.append(answer)
        wants.append(want)
        all_plans.append(plans)
    result.facts.update(answers=answers, verdict=(
        f"the cheapest configuration within the headroom on all {len(budgets)} budgets; for the "
        f"job: {describe(answers[0])}"))
    if answers != wants:
        result.facts["verdict"] = "not the cheapest configuration within the headroom everywhere"
        for mistake, (words, hint) in MISTAKES.items():
            if all(_search(p, b, mistake) == a for p, b, a in zip(all_plans, budgets, answers)):
                result.wrong(words, hint=hint)
                result.facts["verdict"] = words
                break
    return result.finish()
