"""The assessment, task 4: the bytes one rank sends per step in a configuration, from the model's
units (:func:`fsdp_mini.planner.units.units_of`), beside the reference on every strategy x
precision x checkpointing, 1 to 64 ranks, three kinds of units; then the stand-in's ledger and
the planner at the job's scale. Ring, N ranks, 4 B a value in fp32, 2 in bf16-mixed: ddp
2(N−1)/N × Ψ; zero (N−1)/N × Ψ × 2; fsdp per unit two all-gathers and a reduce-scatter, the root
gathered once. Example, fsdp fp32, 2 ranks, a unit of 1000 and a root of 200: 6800 B.
"""

from __future__ import annotations

from ...planner.shapes import ModelShape
from ...planner.units import units_of
from ..common.configurations import PRECISIONS, STRATEGIES, describe
from ..common.differential import Check, Hint
from ..common.exercise import load_solution, not_written_yet
from ..common.records import Config
from ..common.report import CheckResult, verdict_of_check
from ..common.facts import constant_ratio, fit_terms, number, pairs, right_only_with, same_as_at
from ..common.facts import only_at_two_words, right_only_at_two
from .fit import JOB_BUDGET, FitBudget, planned
from .runs import JOB_GPT

__all__ = ["bytes_model", "check_bytes_per_step", "units_of"]

GROUP = ("strategy", "precision", "checkpointing")
UNITS = {"equal": {"blocks.0": 4096, "blocks.1": 4096, "blocks.2": 4096, "root": 4096},
         "unequal": {"blocks.0": 1001, "blocks.1": 1001, "root": 6007},
         "one block": {"blocks.0": 50_000, "root": 301}}
KINDS = tuple(UNITS)   # Note: the spread's units; a check's own (_named) join UNITS, not the spread
WHY = {"ddp": "an all-reduce of every gradient: 2 passes (a reduce-scatter, then an all-gather)",
       "fsdp": "each block gathered twice (forward, backward) and its gradient reduce-scattered, "
               "the root gathered once (it stays gathered for backward)"}
AXIS = {"strategy": "FSDP sends two all-gathers and a reduce-scatter of every unit (the root "
        "gathered once), ZeRO a reduce-scatter and an all-gather of Ψ, DDP one all-reduce",
        "precision": "in bf16-mixed parameters and gradients alike travel in 2 bytes",
        "checkpointing": "checkpointing changes no byte: the recomputation runs while the unit "
                         "is gathered for its backward anyway"}


def bytes_model(config: dict, units: dict, world_size: int) -> float:
    """The kit's answer (the reference solution)."""
    return _reference()(config, units, world_size)


def _per_element(d, c):
    """(yours, the reference's) bytes per element x (N−1)/N in ``c``'s configuration, fitted
    over its ranks and units: per block and per root element for fsdp, else per element."""
    def row(x):
        r, u = (x["world_size"] - 1) / x["world_size"], UNITS[x["units"]]
        return {"element": r * sum(u.values())} if c["strategy"] != "fsdp" else {
            "block element": r * (sum(u.values()) - u["root"]), "root element": r * u["root"]}
    same = [(x, m, w) for x, m, w in pairs(d, "bytes") if x["world_size"] > 1 and
            x["units"] in UNITS and all(x[k] == c[k] for k in GROUP)]
    fits = [fit_terms([(row(x), v[i]) for x, *v in same], 1e-4) for i in (0, 1)]
    return fits if all(fits) and fits[0] != fits[1] else None


def _fit_words(d) -> str:
    for c in d.differ:
        if found := _per_element(d, c):
            return (f"{describe(c)}: you count " + ", ".join(
                f"{found[0][k]:g} B per {k} (the reference {v:g})" for k, v in found[1].items())
                + f", times (N−1)/N: {WHY.get(c['strategy'], AXIS['strategy'])}; "
                f"{2 if c['precision'] == 'bf16-mixed' else 4} B a value in {c['precision']}")
    return ""


def _ring(d) -> bool:
    return all(abs(m * (c["world_size"] - 1) / c["world_size"] / w - 1) < 1e-6
               for c, m, w in pairs(d, "bytes") if c["world_size"] > 1 and w)


HINTS = [
    Hint(lambda d: d.raised is not None, "config is {{strategy, precision, checkpointing}}, "
         "units {{name: elements}}, world_size N; return the bytes one rank sends in a step"),
    Hint(lambda d: not number(d.mine), "return the number of bytes (an int or a float)"),
    Hint(lambda d: constant_ratio(d, "bytes") == 8, "every answer is 8x the reference's: bits; "
         "the ledger counts bytes"),
    Hint(_ring, "yours is N/(N−1) times the reference's: the (N−1)/N is missing: one rank "
         "sends (N−1)/N of each payload (2(N−1)/N in an all-reduce)"),
    *[Hint(lambda d, a=a: same_as_at(d, "bytes", a), lambda d, a=a: "your {0} bytes are the "
           "reference's {1}: ".format(*same_as_at(d, "bytes", a)) + AXIS[a]) for a in GROUP],
    Hint(lambda d: right_only_with(d, "checkpointing", lambda v: not v),
         f"right without checkpointing only: {AXIS['checkpointing']}"),
    Hint(right_only_at_two, only_at_two_words("a ring share (N−1)/N")),
    Hint(_fit_words, _fit_words),
]

CHECK = Check("task 4: your bytes_per_step", lambda fn, c, r: r.see("bytes", fn(
    {k: c[k] for k in GROUP}, dict(UNITS[c["units"]]), c["world_size"])), [], ("bytes",),
    tolerance={"bytes": 1e-6}, hints=HINTS, words={"bytes": "the bytes of one step"},
    agreed="the reference's bytes per step for every strategy, precision and checkpointing")


def configs(own: list = ()) -> list[Config]:
    return [Config(strategy=s, precision=p, checkpointing=ck, world_size=n, units=u)
            for n in (1, 2, 3, 8, 64) for u in KINDS for s in STRATEGIES for p in PRECISIONS
            for ck in (False, True)] + list(own)


def _own(runs: dict, n: int, shape, gpus: int) -> list[tuple[str, Config, float]]:
    """(where, configuration, the bytes it sends): each run's ledger, the planner's at scale."""
    small, job = (_named(who, units_of(s)) for who, s in (
        ("the stand-in's", ModelShape.from_gpt(JOB_GPT)), ("the job's", shape)))
    big = FitBudget("job", shape, gpus, 80, 1, 0.1)
    configs = {describe(r["config"]): r["config"] for r in runs.values()}
    return [(f"the stand-in's ledger, {k} on {n} ranks", Config(
        **{g: r["config"][g] for g in GROUP}, world_size=n, units=small), r["sent_bytes"])
        for k, r in runs.items()] + [(f"the planner, the job's model on {gpus} GPUs", Config(
            **c, world_size=gpus, units=job), planned(big, c).sent_bytes_per_step)
            for c in configs.values()]


def _named(who: str, units: dict) -> str:
    """A name for ``units`` that says what they are (a configuration is known by its words)."""
    name = f"{who} ({len(units)} units, Ψ = {sum(units.values()):,})"
    UNITS[name] = units
    return name


def _reference():
    return load_solution("11_bytes_per_step", "bytes_per_step")


JUDGES = {"11_bytes_per_step": lambda answers: CHECK.judge_many(answers, _reference(), configs())}


@verdict_of_check
def check_bytes_per_step(fn, runs: dict, world_size: int, shape: ModelShape | None = None,
                         gpus: int | None = None) -> CheckResult:
    """Check ``fn(config, units, world_size)`` beside the reference (:func:`configs`, then each
    run of ``runs`` and the job's model on its GPUs); then against each run's ledger and the
    planner (``shape``, ``gpus``: the job's by default)."""
    result = CheckResult(CHECK.what)
    if not_written_yet(fn):
        result.facts["verdict"] = "bytes_per_step is not written yet"
        return result.wrong("bytes_per_step is not written yet: write its body in the cell "
                            "above", hint="sum, over the step's collectives, (N−1)/N × payload "
                            "(2(N−1)/N for an all-reduce)").finish()
    own = _own(runs, world_size, shape or JOB_BUDGET.shape, gpus or JOB_BUDGET.gpus)
    CHECK(fn, _reference(), result, configs=configs([c for _, c, _ in own]))
    for where, c, truth in own if result.passed else ():
        got = result.facts["records"][c][0].get("bytes")
        result.check(abs(got / truth - 1) <= 1e-3, f"{where}: {describe(c)}: {truth:,.0f} B per "
                     f"step", f"{where}: {describe(c)}: you say {got:,.0f} B, it sends "
                     f"{truth:,.0f} B (x{got / truth:.4f})")
    wrong = [msg for ok, msg, _ in result.lines if not ok]
    result.facts["verdict"] = wrong[0] if wrong else (f"the bytes per step of all "
                                                      f"{len(result.facts['records'])} "
                                                      f"configurations, the ledger's and the "
                                                      f"planner's")
    return result.finish()
