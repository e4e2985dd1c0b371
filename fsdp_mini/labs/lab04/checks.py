"""Lab 04's checks: your ZeRO class beside the reference on 1 to 4 ranks (rank r's net has seed
r), two small nets (59 parameters: N never divides them; 9: at N = 4 the last rank owns only
padding) and the lab's GPT, SGD + momentum and AdamW, four steps, every observable compared."""

from __future__ import annotations

import math
from collections import Counter

from ..common.checking import measure_strategies, missing_methods
from ..common.differential import Check, Hint, spread
from ..common.hints import DTYPE, ROUNDING, HANG, scale_hints
from ..common.exercise import load_solution
from ..common.observing import OPTIMIZERS, observe_memory, observe_training, runs_of
from ..common.report import CheckResult, verdict_of_check
from .scaffold import ZeroScaffold

__all__ = ["ZeroScaffold", "check_zero1", "check_zero2", "measure_strategies"]
STEPS, SGD = 4, "SGD+momentum"


def _train(cls, cfg, record) -> None:
    from ...api import parallelize
    for memory, net, batch, loss in runs_of(cfg, record.rank):
        net, opt = parallelize(net, cls, optimizer=OPTIMIZERS[cfg["optimizer"]],
                               check_collectives=not memory)
        zero, starts = net.fsdp_mini, []
        if memory:  # Note: alive once the update is done, before zero_grad frees the gradient
            observe_memory(record, net, opt, batch, STEPS, loss, before_zero_grad=True)
            continue
        record.see("slice", zero.slice, step=0)
        record.see("numel", zero.layout.numel, step=0)
        each = lambda step, z=zero, s=starts: s.append(len(z.comm.ledger.records)) or (  # noqa
            step > 1 and record.see("reduce_gradients", z.did, step=step - 1))
        observe_training(record, net, opt, batch, STEPS, loss, each_step=each)
        record.see("reduce_gradients", zero.did, step=STEPS)
        for step, (a, b) in enumerate(zip(starts, starts[1:] + [None]), start=1):
            late = [f"{r.op} {r.label!r}" for r in zero.comm.ledger.records[a:b] if math.isnan(
                r.seconds)]
            record.see("unwaited", ", ".join(late) or "none", step=step)


def _configs(world_size: int, model: str) -> list:
    f32 = {"dtype": ["float32"]}
    return spread(world_size=[1, 2, 3, 4], net=["mlp", "padding"], optimizer=[SGD, "AdamW"],
                  **f32) + \
        spread(world_size=[2, 3], net=["mlp"], optimizer=[SGD], dtype=["bfloat16"]) + \
        spread(world_size=[world_size], net=[model], optimizer=[SGD, "AdamW"], **f32)


def _slices(d) -> str:
    """Every rank's slice beside the reference's, and what they cover of the buffer."""
    n, (mine, want) = d.config["world_size"], d.table[d.config]
    got, ref = ([rec.get("slice", rank=r, step=0) for r in range(n)] for rec in (mine, want))
    numel, size, sizes = want.get("numel", step=0), ref[0][1] - ref[0][0], {b - a for a, b in got}
    owners = Counter(i for a, b in got for i in range(max(a, 0), min(b, n * size)))
    twice, none = [i for i in owners if owners[i] > 1], [i for i in range(numel) if not owners[i]]
    whole = n > 1 and min(sizes) >= numel
    return "; ".join([f"with N = {n}, {numel} parameters padded to {n * size}, your slices are "
                      f"{got}, the reference's {ref} (S = self.flat.numel() // N = {size})"] + [
        said for said, holds in [
            ("every rank owns the whole buffer: no optimizer state saved", whole),
            (f"element(s) {min(twice or [0])}..{max(twice or [0])} are updated by more than one "
             "rank", twice and not whole),
            (f"element(s) {(none or [0])[0]}..{(none or [0])[-1]} belong to no rank", none),
            (f"{numel} // {n} counts the parameters without the padding",
             sizes == {numel // n} != {size}),
            ("a Python slice [start, stop) holds stop - start elements: stop = start + S",
             sizes <= {size - 1, size + 1} and sizes != {numel // n}),
            ("rank r owns slice r: the all-gather puts rank r's part at position r",
             sorted(got) == sorted(ref))] if holds])


def _did(d, what) -> bool:
    return any(v for k, v in (d.table[d.config][0].get("reduce_gradients", **d.where) or {}
                              ).items() if what in k)


def _ops(d, of=0) -> set:
    """The collectives in the step that differs, of the answer's run (of=0) or the reference's."""
    return {op for op, _, _ in d.table[d.config][of].get("ledger", step=d.where.get("step", 1))
            or ()}


def _on(observable, test=lambda d: True):
    return lambda d: d.observable == observable and test(d)


REDUCE = {"all_reduce": "the gradients were all-reduced (2Ψ): each rank needs only the average "
          "of its own slice, which one reduce-scatter (Ψ) gives (ZeRO-2)",
          "reduce_scatter": "you reduce-scatter, ZeRO-2's move (the next exercise); ZeRO-1 is "
          "your DDP plus a sharded optimizer: all-reduce flat_grad (2Ψ) and keep it whole"}
KEEP = {True: "self.shard.grad is a view of flat_grad, and a view keeps the whole buffer alive "
        "(4Ψ, not ZeRO-2's 4Ψ/N): reduce-scatter into a new tensor the size of the shard "
        "(torch.empty_like(self.shard))", False: "self.shard.grad is a copy of your slice, so "
        "the rest of the average is freed: ZeRO-1 keeps the whole averaged gradient (4Ψ, as "
        "DDP; a slice only is ZeRO-2's saving): make self.shard.grad a view of your slice of it"}
HINTS = [
    DTYPE,
    ROUNDING,
    Hint(lambda d: d.raised and (d.raised[0] == "a hang" or "Mismatch" in d.raised[0]), HANG),
    Hint(lambda d: d.raised and "the full tensor has" in d.raised[1], "each rank's part (or "
         "output) of the flat buffer is self.flat.numel() // N elements, self.shard's size"),
    Hint(lambda d: d.raised and "created in no_grad mode" in d.raised[1], "after_step runs in "
         "grad mode: gather from a plain view, self.flat[start:stop], not from self.shard"),
    Hint(_on("slice"), _slices),
    Hint(_on("grads", lambda d: d.mine is None), "the optimizer got no gradient: "
         "reduce_gradients must set self.shard.grad"),
    Hint(lambda d: d.observable in ("grads", "reduce_gradients") and _did(d, "weights"),
         "reduce_gradients wrote into self.flat: you averaged the weights (the same on every "
         "rank), not the gradients, so each rank stepped on its own batch's gradient"),
    Hint(lambda d: d.observable in ("grads", "ledger") and not _ops(d) & set(REDUCE), "the "
         "gradients were never averaged over the ranks (no all-reduce or reduce-scatter in the "
         "step): each rank stepped on its own batch's gradient"),
    *scale_hints("grads"),
    Hint(_on("unwaited"), "a collective issued with async_op=True was never waited for: its "
         "output may be read before it is written; call .wait() on the handle it returns"),
    Hint(_on("ledger", lambda d: "all_gather" not in _ops(d)), "no all-gather after the step: "
         "each rank updated only its own slice, so the ranks drift apart; after_step must "
         "all-gather every rank's updated slice into self.flat"),
    Hint(_on("ledger", lambda d: _ops(d) & set(REDUCE) - _ops(d, 1)),
         lambda d: REDUCE[min(_ops(d) & set(REDUCE) - _ops(d, 1))]),
    Hint(lambda d: "view" in d.path or d.observable == "alive" and "grads" in d.path,
         lambda d: KEEP[d.mine > d.want]),
    Hint(_on("between steps", lambda d: d.mine > d.want), lambda d: f"after zero_grad, "
         f"between two steps, {d.mine - d.want:,} B of {d.path} are still alive that the "
         "reference has freed: a tensor kept on self (a buffer cached and reused) holds them. "
         "Make each step's buffers anew and keep no reference to them"),
    Hint(_on("alive", lambda d: d.mine > d.want), lambda d: f"after the step {d.mine - d.want:,} "
         f"B more of {d.path} are alive than in the reference{' (more every step)' * d.grows}: "
         f"your class keeps flat_grad, or a tensor made from it, so it is never freed"),
]
WORDS = {"slice": "rank {rank}'s my_slice()", "reduce_gradients": "rank {rank}'s "
         "reduce_gradients, in step {step},", "grads": "the gradient shard rank {rank}'s "
         "optimizer got in step {step}", "ledger": "rank {rank}'s collectives in step {step}",
         "unwaited": "rank {rank}'s collectives never waited for in step {step}",
         "alive": "rank {rank}'s bytes alive after step {step}",
         "between steps": "rank {rank}'s bytes alive after step {step}'s zero_grad"}
ORDER = ("start", "slice", "loss", "backward_weights", "grads", "ledger", "unwaited",
         "reduce_gradients", "weights", "alive", "peak", "between steps")
TOLERANCE = {"loss": 1e-5, "backward_weights": 1e-6, "grads": 1e-5, "weights": 1e-5, "peak": 0.25}
ZERO1, ZERO2 = (Check(f"your ZeRO-{k}", _train, [], ORDER, TOLERANCE, WORDS, HINTS, agreed=f"each "
                      f"rank owns slice r of the padded buffer, {what}, and trains like the "
                      f"reference", on_ranks=True) for k, what in (
    (1, "keeps the whole averaged gradient, all-reduces and all-gathers"),
    (2, "gets the average of its slice from one reduce-scatter, keeps only that")))
NAMES = {ZERO1.what: ("04_zero1", "MyZero1"), ZERO2.what: ("04_zero2", "MyZero2")}


@verdict_of_check
def check_zero1(cls, world_size: int = 2, model: str = "tiny") -> CheckResult:
    """Your ZeRO-1 (a :class:`ZeroScaffold`) beside the reference, on 1 to 4 ranks and on the
    ``model`` GPT ("tiny" or "default") at ``world_size``."""
    return _check(ZERO1, cls, world_size, model)


@verdict_of_check
def check_zero2(cls, world_size: int = 2, model: str = "tiny") -> CheckResult:
    """As :func:`check_zero1`, for your ZeRO-2."""
    return _check(ZERO2, cls, world_size, model)


def _check(check, cls, world_size, model) -> CheckResult:
    result = CheckResult(f"{check.what} ({getattr(cls, '__name__', cls)})")
    if not (isinstance(cls, type) and issubclass(cls, ZeroScaffold)):
        return result.wrong(f"expected a subclass of labs.ZeroScaffold, got {cls!r}").finish()
    todo = missing_methods(cls, ("my_slice", "reduce_gradients", "after_step"), ZeroScaffold)
    if todo:
        return result.wrong(f"not written yet: {', '.join(todo)} (still `...`)", hint=f"labs."
                            f"show_solution('{NAMES[check.what][0]}') shows one").finish()
    check(cls, load_solution(*NAMES[check.what]), result, _configs(world_size, model))
    return result.finish()


JUDGES = {NAMES[c.what][0]: (lambda answers, c=c: c.judge_many(  # the lab's size: 2 ranks
    answers, load_solution(*NAMES[c.what]), _configs(2, "tiny"))) for c in (ZERO1, ZERO2)}
