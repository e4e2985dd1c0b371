"""Lab 07: fitting bigger models: the fsdp options measured side by side, and the checker of
``cheapest_fit``.

    runs = labs.measure_options(cfg)          # one launch: fp32, bf16, checkpointing,
    runs["bf16"]["sent"]                      # accumulation with and without no_sync, meta init
    labs.check_cheapest_fit(cheapest_fit)     # ✔/✘ per budget; a known mistake is named

Each variant trains the lab's GPT under fsdp with AdamW (``foreach=False``: the per-parameter
update the planner assumes): a warm-up step, timed steps, then one step under ``track_memory``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from ..api import no_sync, parallelize
from ..launcher import launch, rank_device
from ..memory import track_memory
from ..models import GPTConfig, SyntheticText, make_model
from ..planner import plan
from ..planner_shapes import PRESETS, ModelShape
from ..training import loss_of
from .exercise import not_written_yet
from .report import CheckResult

__all__ = ["BUDGETS", "VARIANTS", "Budget", "check_cheapest_fit", "describe", "gpt2_init",
           "measure_options"]

# name: (fsdp options, micro-batches per step, no_sync on all but the last micro-batch)
VARIANTS = {
    "fp32": ({}, 1, False),
    "bf16": ({"param_dtype": torch.bfloat16}, 1, False),
    "checkpointing": ({"activation_checkpointing": True}, 1, False),
    "accumulate": ({}, 2, False),              # 2 micro-batches, a reduce-scatter after each
    "accumulate + no_sync": ({}, 2, True),     # 2 micro-batches, one reduce-scatter
    "offload": ({"offload": True}, 1, False),  # GPUs only (on CPU ranks it changes nothing)
}


def gpt2_init(module: nn.Module) -> None:
    """A ``param_init_fn`` for meta init: GPT-2's N(0, 0.02) weights, zero biases, LayerNorm =
    identity, on the tensors of ``module`` that are real (a unit's other tensors are meta)."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)) and not m.weight.is_meta:
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.LayerNorm) and not m.weight.is_meta:
                nn.init.ones_(m.weight)
            bias = getattr(m, "bias", None)
            if isinstance(bias, torch.Tensor) and not bias.is_meta:
                nn.init.zeros_(bias)


def measure_options(cfg, variants=None) -> dict:
    """Run each variant (default: all, but offload only on GPUs) on ``cfg.world_size`` ranks and
    meta init; returns {variant: figures}: peaks the largest over ranks, bytes rank 0's."""
    names = list(variants or [v for v in VARIANTS if v != "offload" or cfg.device == "cuda"])
    per_rank = launch(_options_rank, cfg.world_size, cfg.model, cfg.global_batch, names,
                      min(cfg.steps, 3), backend=cfg.backend, timeout=300)
    out = {}
    for name in per_rank[0]:
        runs = [r[name] for r in per_rank]
        merged = dict(runs[0])
        for key in ("peak", "cuda_peak", "cuda_kept", "seconds"):
            if key in merged:
                merged[key] = max(r[key] for r in runs)
        merged["peak_by_rank"] = [r.get("peak") for r in runs]
        out[name] = merged
    return out


def _options_rank(rank, world_size, model_size, global_batch, names, steps) -> dict:
    torch.set_num_threads(1)
    gpt = GPTConfig.tiny() if model_size == "tiny" else GPTConfig()
    device = rank_device()
    data = SyntheticText(gpt.vocab_size, gpt.block_size)

    def batch(step):
        return tuple(t.to(device) for t in data.local_batch(step, global_batch, rank, world_size))

    out = {name: _one_variant(gpt, device, batch, steps, *VARIANTS[name]) for name in names}
    out["meta init"] = _meta_init(gpt, device)
    return out


def _one_variant(gpt, device, batch, steps, options, micro_batches, use_no_sync) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
    model = make_model(gpt).to(device)
    calls = [0]  # forward calls of the blocks' Linear layers (recomputation calls them again)
    for m in model.blocks.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    model, optimizer = parallelize(model, "fsdp", units=list(model.blocks),
                                   optimizer=partial(torch.optim.AdamW, lr=1e-3, foreach=False),
                                   **options)
    ledger = model.fsdp_mini.comm.ledger

    def step(s, mem=None):
        x, y = batch(s)
        for i, (xm, ym) in enumerate(zip(x.chunk(micro_batches), y.chunk(micro_batches))):
            quiet = use_no_sync and i < micro_batches - 1
            with no_sync(model) if quiet else contextlib.nullcontext():
                (loss_of(model, xm, ym) / micro_batches).backward()
        optimizer.step()
        if mem is not None:
            mem.mark("after_step")
        optimizer.zero_grad()

    step(0)  # warm-up: Adam makes its state
    seconds = []
    for s in range(1, steps + 1):
        dist.barrier()
        start = time.perf_counter()
        step(s)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    fig = {"seconds": statistics.median(seconds)}
    if cuda:
        torch.cuda.synchronize()
        fig["cuda_kept"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
    calls[0] = 0
    dist.barrier()
    with track_memory(model, optimizer) as mem:
        step(steps + 1, mem)
    if cuda:
        fig["cuda_peak"] = torch.cuda.max_memory_allocated() - base
    after = next(s for s in mem.snapshots if s.label == "after_step").by_category
    fig.update(peak=mem.own_peak_bytes, at_peak=dict(mem.at_peak),
               peak_by_category=dict(mem.peak_by_category), linear_calls=calls[0],
               persistent={c: after[c] for c in ("params", "grads", "optimizer_state")},
               sent={op: t.sent_bytes for op, t in ledger.totals(ledger.step).items()},
               calls={op: t.calls for op, t in ledger.totals(ledger.step).items()})
    return fig


def _meta_init(gpt, device) -> dict:
    """The peak of parallelize for a GPT built on the meta device, against its whole size."""
    with torch.device("meta"):
        model = make_model(gpt)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    with track_memory(model) as mem:
        model, _ = parallelize(model, "fsdp", units=list(model.blocks), param_init_fn=gpt2_init,
                               device=device)
    shards = sum(p.numel() * p.element_size() for p in model.fsdp_mini.optimizer_params())
    return {"peak": mem.own_peak_bytes, "whole": whole, "shards": shards}


# -- the exercise: cheapest_fit -------------------------------------------------------------------

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")   # the less sharded first
PRECISIONS = ("fp32", "bf16-mixed")
GPT_1B = ModelShape(24, 2048, 16, 50304, 2048)    # a 1.3 B GPT (GPT-3 XL's shape)


@dataclass(frozen=True)
class Budget:
    """A model and the GPUs it must fit: ``gpu_mem_gib`` in GiB (2**30 B, as nvidia-smi says)."""

    model: str
    gpus: int
    gpu_mem_gib: float
    micro_batch: int

    @property
    def shape(self) -> ModelShape:
        return GPT_1B if self.model == "1.3b" else PRESETS[self.model]

    def __str__(self) -> str:
        return (f"{self.model} on {self.gpus} GPUs of {self.gpu_mem_gib:g} GiB, micro-batch "
                f"{self.micro_batch}")


# Note: chosen so that each mistake below gives a different set of answers, with a 7B, a 70B,
# one budget where nothing fits, and some where a few GiB decide.
BUDGETS = (Budget("1.3b", 2, 16, 4), Budget("7b", 2, 94, 1), Budget("7b", 8, 24, 1),
           Budget("7b", 8, 80, 4), Budget("70b", 16, 80, 1), Budget("70b", 4, 80, 1))

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
    "GiB": (
        ("you gave the planner GiB where it takes GB: your answers are a search on GPUs 7 % "
         "smaller than they are"),
        ("plan(gpu_mem_gb=...) takes GB (10⁹ B); the budget is in GiB (2³⁰ B): gpu_mem_gb = "
         "gpu_mem_gib * 2**30 / 1e9"),
    ),
}


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
    best, best_cost = None, None
    if mistake == "GiB":
        mem_bytes *= 1e9 / 2**30
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
            cost = (s.sent_bytes_per_step, ck, STRATEGIES.index(name))
            if used <= mem_bytes and (best_cost is None or cost < best_cost):
                best, best_cost = {"strategy": name, "precision": prec, "checkpointing": ck}, cost
    return best


def _smallest_peak(plans: dict) -> float:
    return min(s.peak_bytes for k, p in plans.items() if k[0] != "params"
               for s in p.strategies.values())


def describe(config) -> str:
    """``{"strategy": "fsdp", "precision": "bf16-mixed", "checkpointing": True}`` in words."""
    if config is None:
        return "nothing fits"
    ck = "with checkpointing" if config["checkpointing"] else "no checkpointing"
    return f"{config['strategy']}, {config['precision']}, {ck}"


def _valid(answer) -> str:
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


def _judge(result: CheckResult, budget: Budget, plans: dict, answer, want) -> None:
    mem = budget.gpu_mem_gib * 2**30
    if answer == want:
        if want is None:
            result.ok(f"{budget}: nothing fits, rightly (the smallest peak is "
                      f"{_smallest_peak(plans) / 2**30:.0f} GiB)")
            return
        s = plans[(want["precision"], want["checkpointing"])].strategies[want["strategy"]]
        result.ok(f"{budget}: {describe(want)}: peak {s.peak_bytes / 2**30:.1f} GiB, "
                  f"{s.sent_bytes_per_step / 1e9:.1f} GB sent per GPU per step")
        return
    if answer is None:
        result.wrong(f"{budget}: you found nothing, but {describe(want)} fits")
        return
    s = plans[(answer["precision"], answer["checkpointing"])].strategies[answer["strategy"]]
    if s.peak_bytes > mem:
        cats = ", ".join(f"{c} {b / 2**30:.1f}" for c, b in s.by_category.items() if b)
        why = (": ddp keeps the whole model state on every GPU" if answer["strategy"] == "ddp"
               else ": without its activations it would" if
               s.peak_bytes - s.by_category["activations"] <= mem else "")
        result.wrong(f"{budget}: {describe(answer)} does not fit: its planned peak is "
                     f"{s.peak_bytes / 2**30:.1f} GiB > {budget.gpu_mem_gib:g} GiB ({cats} GiB)"
                     + why)
        return
    w = plans[(want["precision"], want["checkpointing"])].strategies[want["strategy"]] \
        if want else None
    result.wrong(f"{budget}: {describe(answer)} fits, but sends {s.sent_bytes_per_step / 1e9:.1f} "
                 f"GB per step" + (f"; {describe(want)} fits too and sends "
                                   f"{w.sent_bytes_per_step / 1e9:.1f} GB"
                                   + (", the same bytes without recomputing"
                                      if w.sent_bytes_per_step == s.sent_bytes_per_step else "")
                                   if w else ""))


def check_cheapest_fit(fn, budgets=BUDGETS) -> CheckResult:
    """Check ``fn(model, gpus, gpu_mem_gib, micro_batch)`` on ``budgets``: the cheapest
    configuration (fewest bytes sent per step; then no checkpointing; then the less sharded
    strategy) among ddp/zero1/zero2/fsdp x fp32/bf16-mixed x checkpointing whose planned peak
    fits, or None. A set of answers that a known mistake gives is named."""
    result = CheckResult("your cheapest_fit")
    if not_written_yet(fn):
        return result.wrong("cheapest_fit is not written yet: write its body in the cell above",
                            hint="labs.show_solution('07_cheapest_fit') shows one way").finish()
    answers, wants, all_plans = [], [], []
    for b in budgets:
        try:
            answer = fn(b.shape, b.gpus, b.gpu_mem_gib, b.micro_batch)
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            return result.wrong(f"cheapest_fit({b.model!r} shape, {b.gpus}, {b.gpu_mem_gib}, "
                                f"{b.micro_batch}) raised {type(e).__name__}: {e}").finish()
        if (bad := _valid(answer)):
            return result.wrong(f"{b}: {bad}").finish()
        plans = _plans(b)
        want = _search(plans, b.gpu_mem_gib * 2**30)
        _judge(result, b, plans, answer, want)
        answers.append(answer)
        wants.append(want)
        all_plans.append(plans)
    if answers != wants:
        for mistake, (words, hint) in MISTAKES.items():
            if all(_search(p, b.gpu_mem_gib * 2**30, mistake) == a
                   for p, b, a in zip(all_plans, budgets, answers)):
                result.wrong(words, hint=hint)
    result.facts["answers"] = answers
    return result.finish()
