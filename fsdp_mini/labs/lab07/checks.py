"""Lab 07: fitting bigger models: the checker of ``cheapest_fit`` (the measurements of the fsdp
options, ``measure_options``, are in ``runs.py``).

    labs.check_cheapest_fit(cheapest_fit)     # ✔/✘ per budget; a known mistake is named
    labs.describe({"strategy": "fsdp", "precision": "bf16-mixed", "checkpointing": True})

GPU memory is in GB (10⁹ bytes) here, as GPUs are sold and as ``fsdp_mini.plan(gpu_mem_gb=...)``
takes it. A configuration fits when its planned peak plus the planner's reserve (the CUDA
context, NCCL's buffers, fragmentation: ``Plan.reserve_bytes``) is at most the GPU's memory, as
``StrategyPlan.fits`` says; the cheapest is the one whose step is fastest (compute, plus the
communication the overlap does not hide: ``step_seconds``), which on a fixed number of GPUs is the
fewest GPU-hours per token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...planner.hardware import default_reserve_gb
from ...planner.plan import plan
from ...planner.shapes import PRESETS, ModelShape
from ..common.configurations import PRECISIONS, STRATEGIES, describe, what_is_invalid
from ..common.exercise import not_written_yet
from ..common.report import CheckResult
from .runs import VARIANTS, gpt2_init, measure_options

__all__ = ["BUDGETS", "VARIANTS", "Budget", "check_cheapest_fit", "gpt2_init",
           "measure_options"]

GPT_1B = ModelShape(24, 2048, 16, 50304, 2048)    # a 1.3 B GPT (GPT-3 XL's shape)


@dataclass(frozen=True)
class Budget:
    """A model and the GPUs it must fit: ``gpu_mem_gb`` in GB (10⁹ B, the planner's unit)."""

    model: str
    gpus: int
    gpu_mem_gb: float
    micro_batch: int

    @property
    def shape(self) -> ModelShape:
        return GPT_1B if self.model == "1.3b" else PRESETS[self.model]

    def __str__(self) -> str:
        return (f"{self.model} on {self.gpus} GPUs of {self.gpu_mem_gb:g} GB, micro-batch "
                f"{self.micro_batch}")


# Note: chosen so that each mistake below gives a different set of answers, with a 7B, a 70B,
# one budget where nothing fits, and some where a few GB decide.
BUDGETS = (Budget("1.3b", 2, 16, 4), Budget("7b", 2, 94, 1), Budget("7b", 8, 24, 1),
           Budget("7b", 4, 48, 1), Budget("70b", 16, 80, 1), Budget("70b", 4, 80, 1),
           Budget("1.3b", 4, 40, 8))

# mistake: (the plain words, the hint); _search says what each one counts
MISTAKES = {
    "activations": (
        ("you ignored the activations: your answers are those of a search that counts the peak"
         " without them"),
        ("give plan() the model's shape (model=...), not a parameter count, and compare its "
         "peak_bytes: activations of one micro-batch are part of the peak"),
    ),
    "adam": (
        ("you forgot Adam's state: your answers are those of a search that leaves out the "
         "optimizer state (12 bytes per parameter in bf16-mixed: fp32 master copy, m and v)"),
        ("count the whole peak: parameters, gradients, Adam's state, gathered units, buffers, "
         "activations: plan()'s peak_bytes"),
    ),
    "no reserve": (
        ("your configurations fit to the last byte: you compared the peak with the whole GPU and "
         "left out the reserve the planner keeps free (the CUDA context, NCCL's buffers, "
         "fragmentation)"),
        ("use .fits, which compares peak_bytes + the plan's reserve_bytes with the memory: a job "
         "planned to the last GB fails on the real GPU"),
    ),
    "no fit check": (
        ("you chose ddp where it cannot fit: your answers are the cheapest configuration "
         "whether or not it fits"),
        ("keep only the candidates whose .fits is True (ddp keeps the whole model state, 16Ψ, "
         "on every GPU)"),
    ),
    "fp32 only": (
        "you did not consider bf16-mixed: your answers are a search over fp32 only",
        ("try precision='bf16-mixed' too: 2-byte all-gathers and activations, the same 16Ψ of "
         "state"),
    ),
    "no checkpointing": (
        "you did not consider activation checkpointing: your answers are a search without it",
        "try checkpointing=True too: each layer keeps only its input",
    ),
    "persistent": (
        ("your configurations fit by the state kept between steps (persistent_bytes), not by "
         "the peak within a step"),
        ("compare peak_bytes with the memory: within a step come gathered units, gradient "
         "buffers and the activations"),
    ),
    "default memory": (
        "your answers fit 80 GB, not the budget: pass gpu_mem_gb to plan",
        ("fsdp_mini.plan(..., gpu_mem_gb=gpu_mem_gb): without it plan() assumes GPUs of 80 GB "
         "and .fits compares with 80 GB"),
    ),
    "GiB": (
        ("you compared with GiB (2^30 B); the budget is in GB (10^9 B): your answers fit "
         "gpu_mem_gb x 2^30 bytes"),
        "use .fits, which plan() computes in GB (10^9 B) with the reserve kept free",
    ),
    "smallest peak": (
        ("you picked the configuration with the smallest peak: the cheapest is the one whose "
         "step is fastest, among those that fit"),
        ("keep the candidates that fit, then compare their step_seconds (compute + the "
         "communication the overlap does not hide): GPU-hours are what a job pays"),
    ),
    "fewest bytes": (
        ("you picked the configuration that sends the fewest bytes: bytes are not time. "
         "Checkpointing recomputes the forward (8Ψ FLOPs per token instead of 6Ψ), and DDP hides "
         "its all-reduce behind backward while zero1 waits for its collectives at the step"),
        ("compare step_seconds, the planner's compute plus the communication it cannot hide, "
         "not sent_bytes_per_step"),
    ),
    "first fit": (
        ("you kept the first configuration that fits: the cheapest is the one whose step is "
         "fastest among all those that fit"),
        "try every candidate, keep those that fit, and compare their step_seconds",
    ),
    "micro batch": (
        ("your answers are those of a micro-batch of 1: pass micro_batch to plan (the "
         "activations grow with it)"),
        ("fsdp_mini.plan(..., micro_batch=micro_batch): without it plan() assumes 1 sample per "
         "micro-batch"),
    ),
}


# Note: how a slip about the memory reads the budget: (bytes, reserve kept free): the plan()
# default (through .fits: 80 GB less its reserve), or GiB compared by hand (no reserve).
MEMORY_SLIPS = {"default memory": lambda mem: (80e9, default_reserve_gb(80) * 1e9),
                "GiB": lambda mem: (mem / 1e9 * 2**30, 0.0)}
# Note: the mistakes that compare a figure with the memory by hand, not through .fits
BY_HAND = ("adam", "persistent", "no reserve")


def _plans(budget: Budget) -> dict:
    """The plans of every candidate; under ("params", ...) keys, those of a parameter count
    (no activations: what a search that ignores them sees)."""
    out = {}
    for prec in PRECISIONS:
        for ck in (False, True):
            common = {"gpus": budget.gpus, "gpu_mem_gb": 1.0, "precision": prec,
                      "micro_batch": budget.micro_batch, "checkpointing": ck,
                      "strategies": STRATEGIES}
            out[(prec, ck)] = plan(model=budget.shape, **common)
            out[("params", prec, ck)] = plan(params=budget.shape.params(), **common)
    return out


def _search(plans: dict, mem_bytes: float, mistake: str | None = None):
    """The cheapest fitting configuration, as the reference does, or as ``mistake`` would."""
    reserve = default_reserve_gb(mem_bytes / 1e9) * 1e9 if mistake not in BY_HAND else 0.0
    if mistake in MEMORY_SLIPS:
        (mem_bytes, reserve), mistake = MEMORY_SLIPS[mistake](mem_bytes), None
    best, best_cost = None, None
    for key, p in plans.items():
        if (key[0] == "params") != (mistake == "activations"):
            continue
        prec, ck = key[-2:]
        if (mistake == "fp32 only" and prec != "fp32") or (mistake == "no checkpointing" and ck):
            continue
        for name, s in p.strategies.items():
            used = {"adam": s.peak_bytes - s.by_category["optimizer_state"],
                    "persistent": s.persistent_bytes, "no fit check": 0.0}.get(mistake,
                                                                              s.peak_bytes)
            cost = ((s.peak_bytes,) if mistake == "smallest peak" else
                    (s.sent_bytes_per_step, ck, STRATEGIES.index(name)) if mistake ==
                    "fewest bytes" else (s.step_seconds, ck, STRATEGIES.index(name)))
            if used + reserve <= mem_bytes and (best_cost is None or (cost < best_cost
                                                            and mistake != "first fit")):
                best, best_cost = {"strategy": name, "precision": prec, "checkpointing": ck}, cost
    return best


def _smallest_peak(plans: dict) -> float:
    return min(s.peak_bytes for k, p in plans.items() if k[0] != "params"
               for s in p.strategies.values())


def _judge(result: CheckResult, budget: Budget, plans: dict, answer, want) -> None:
    mem = budget.gpu_mem_gb * 1e9
    reserve = default_reserve_gb(budget.gpu_mem_gb) * 1e9
    if answer == want:
        if want is None:
            result.ok(f"{budget}: nothing fits, rightly (the smallest peak is "
                      f"{_smallest_peak(plans) / 1e9:.0f} GB)")
            return
        s = plans[(want["precision"], want["checkpointing"])].strategies[want["strategy"]]
        result.ok(f"{budget}: {describe(want)}: peak {s.peak_bytes / 1e9:.1f} GB + "
                  f"{reserve / 1e9:.3g} GB reserve, a step of {s.step_seconds:.2f} s")
        return
    if answer is None:
        result.wrong(f"{budget}: you found nothing, but {describe(want)} fits")
        return
    s = plans[(answer["precision"], answer["checkpointing"])].strategies[answer["strategy"]]
    if mem - reserve < s.peak_bytes <= mem:
        result.wrong(f"{budget}: {describe(answer)} does not fit: its planned peak "
                     f"{s.peak_bytes / 1e9:.1f} GB leaves less than the reserve "
                     f"({reserve / 1e9:.3g} GB) of the {budget.gpu_mem_gb:g} GB free")
        return
    if s.peak_bytes > mem:
        cats = ", ".join(f"{c} {b / 1e9:.1f}" for c, b in s.by_category.items() if b)
        no_act = s.peak_bytes - s.by_category["activations"]
        why = ((f": it would fit {budget.gpu_mem_gb:g} GiB; you compared with GiB (2^30 B); the "
                f"budget is in GB (10^9 B)") if s.peak_bytes <= budget.gpu_mem_gb * 2**30
               else ": ddp keeps the whole model state on every GPU" if answer["strategy"] == "ddp"
               else (f": without its activations it would fit ({no_act / 1e9:.1f} GB), but the "
                     f"activations of one micro-batch are part of the peak") if no_act <= mem
               else "")
        result.wrong(f"{budget}: {describe(answer)} does not fit: its planned peak is "
                     f"{s.peak_bytes / 1e9:.1f} GB > {budget.gpu_mem_gb:g} GB ({cats} GB)"
                     + why)
        return
    if want is None:  # Note: the planner says nothing fits, so this answer's peak is over it
        result.wrong(f"{budget}: {describe(answer)} fits, but the planner says nothing does")
        return
    w = plans[(want["precision"], want["checkpointing"])].strategies[want["strategy"]]
    result.wrong(f"{budget}: {describe(answer)} fits, but its step takes {_time(s)}; "
                 f"{describe(want)} fits too and takes {_time(w)}"
                 + (_tie_break(answer, want) if w.step_seconds == s.step_seconds else ""))


def _time(s) -> str:
    return (f"{s.step_seconds:.2f} s ({s.compute_seconds:.2f} s compute, "
            f"{s.exposed_comm_seconds:.2f} s of communication not hidden, "
            f"{s.sent_bytes_per_step / 1e9:.1f} GB sent)")


def _tie_break(answer: dict, want: dict) -> str:
    """Why ``want`` beats ``answer`` when both steps take as long: the reference's order."""
    if answer["checkpointing"] != want["checkpointing"]:
        return ", as long: at equal step times, no checkpointing comes first"
    if answer["strategy"] != want["strategy"]:
        return (f", as long: at equal step times, the less sharded strategy comes first "
                f"({', '.join(STRATEGIES)}): {want['strategy']} before {answer['strategy']}")
    return (", as long: at equal step times, checkpointing and strategy, the first precision "
            f"tried is kept ({', '.join(PRECISIONS)})")


def _check_by_name(result: CheckResult, fn, budgets, answers) -> None:
    """Lab 07's section 8 calls ``fn("70b", gpus, 80, 1)``: a preset's name, not its shape. The
    answers must be the same (plan() takes either)."""
    for b, answer in zip(budgets, answers):
        if b.model not in PRESETS:
            continue
        call = f"cheapest_fit({b.model!r}, {b.gpus}, {b.gpu_mem_gb:g}, {b.micro_batch})"
        try:
            by_name = fn(b.model, b.gpus, b.gpu_mem_gb, b.micro_batch)
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            result.wrong(f"{call}, with the preset's name as the lab calls it later, raised "
                         f"{type(e).__name__}: {e}", hint="model is a name ('70b') or a ModelShape: "
                         "pass it straight to fsdp_mini.plan(model=model, ...), which takes both")
            return
        if by_name != answer:
            result.wrong(f"{call}, with the preset's name as the lab calls it later, returned "
                         f"{describe(by_name)}; with its shape, {describe(answer)}",
                         hint="pass model straight to fsdp_mini.plan(model=model, ...)")
            return
    result.ok("the same answers for a preset's name ('7b', '70b'), as the lab calls it later")


def check_cheapest_fit(fn, budgets=BUDGETS) -> CheckResult:
    """Check ``fn(model, gpus, gpu_mem_gb, micro_batch)`` on ``budgets``: the cheapest
    configuration (the fastest step, ``step_seconds``; then no checkpointing; then the less
    sharded strategy) among ddp/zero1/zero2/fsdp x fp32/bf16-mixed x checkpointing whose planned
    peak fits with the reserve (``.fits``), or None. A set of answers that a known mistake gives
    is named."""
    result = CheckResult("your cheapest_fit")
    if not_written_yet(fn):
        return result.wrong("cheapest_fit is not written yet: write its body in the cell above",
                            hint="labs.show_solution('07_cheapest_fit') shows one way").finish()
    answers, wants, all_plans = [], [], []
    for b in budgets:
        try:
            answer = fn(b.shape, b.gpus, b.gpu_mem_gb, b.micro_batch)
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            return result.wrong(f"cheapest_fit({b.model!r} shape, {b.gpus}, {b.gpu_mem_gb}, "
                                f"{b.micro_batch}) raised {type(e).__name__}: {e}").finish()
        if (bad := what_is_invalid(answer)):
            return result.wrong(f"{b}: {bad}").finish()
        plans = _plans(b)
        want = _search(plans, b.gpu_mem_gb * 1e9)
        _judge(result, b, plans, answer, want)
        answers.append(answer)
        wants.append(want)
        all_plans.append(plans)
    if answers == wants:
        _check_by_name(result, fn, budgets, answers)
    if answers != wants:
        for mistake, (words, hint) in MISTAKES.items():
            if mistake == "micro batch":  # Note: other plans: those of one sample a micro-batch
                if all(b.micro_batch == 1 for b in budgets) or any(
                        _search(_plans(replace(b, micro_batch=1)), b.gpu_mem_gb * 1e9) != a
                        for b, a in zip(budgets, answers)):
                    continue
            elif any(_search(p, b.gpu_mem_gb * 1e9, mistake) != a
                     for p, b, a in zip(all_plans, budgets, answers)):
                continue
            result.wrong(words, hint=hint)
    result.facts["answers"] = answers
    return result.finish()
