"""Lab 05's checks: your unit (driving the kit's FSDP) beside the reference on 1 to 4 ranks (rank
r's net has seed r): with SGD + momentum three small nets (59 parameters: N never divides them; 9:
at N = 4 the last rank holds only padding; two units of equal size), with AdamW the equal units,
and the lab's GPT (every block a unit) with both; four steps, every observable (ORDER) compared."""

from __future__ import annotations

from collections import Counter

from ..common.checking import missing_methods, unwritten
from ..common.differential import Check, Hint, spread
from ..common.hints import DTYPE, ROUNDING, HANG, scale_hints
from ..common.exercise import load_solution
from ..common.observing import (NETS, OPTIMIZERS, observe_memory, observe_training, runs_of,
                                units_of)
from ..common.report import CheckResult, verdict_of_check
from .scaffold import FSDPScaffold, FSDPUnit

__all__ = ["FSDPScaffold", "FSDPUnit", "check_reduce_scatter_grad", "check_unit"]
STEPS, SGD = 4, "SGD+momentum"


def _train(unit_cls, cfg, record) -> None:
    from ...api import parallelize
    for memory, net, batch, loss in runs_of(cfg, record.rank):
        # Note: in a small net the root holds the last layer; in the GPT every block is a unit
        units = units_of(net)[:-1] if cfg["net"] in NETS else list(net.blocks)
        net, opt = parallelize(net, type("Checked", (FSDPScaffold,), {"unit_class": unit_cls}),
                               units=units, optimizer=OPTIMIZERS[cfg["optimizer"]],
                               check_collectives=not memory)
        if not memory:
            observe_training(record, net, opt, batch, STEPS, loss,
                             each_step=lambda step, f=net.fsdp_mini: setattr(f, "step", step))
            for step, what, unit, value in net.fsdp_mini.notes:
                record.see(what, value, step=step, unit=unit)
            continue
        # Note: alive once the update is done, before zero_grad frees the gradient shards
        observe_memory(record, net, opt, batch, STEPS, loss, before_zero_grad=True, also={
            "peak_gathered": lambda mem: mem.peak_by_category["gathered_params"]})


def _configs(world_size: int, model: str) -> list:
    f32 = {"dtype": ["float32"]}
    return spread(world_size=[1, 2, 3, 4], net=["mlp", "padding", "twins"], optimizer=[SGD],
                  **f32) + \
        spread(world_size=[1, 2, 3, 4], net=["twins"], optimizer=["AdamW"], **f32) + \
        spread(world_size=[2, 3], net=["mlp"], optimizer=[SGD], dtype=["bfloat16"]) + \
        spread(world_size=[world_size], net=[model], optimizer=[SGD, "AdamW"], **f32)


def _ops(d, of=0, op="all_gather") -> Counter:
    """Sizes of ``op`` in the step that differs, of the answer's run (of=0) or the reference's."""
    return Counter(s for o, s, _ in d.table[d.config][of].get("ledger", step=d.where.get(
        "step", 1)) or () if o == op)


def _on(observable, test=lambda d: True):
    return lambda d: d.observable == observable and test(d)


FREE = ("free the storage itself, self.full.untyped_storage().resize_(0): the tensor and "
        "autograd's views of it stay valid, and unshard refills the same storage")
HINTS = [
    DTYPE,
    ROUNDING,
    Hint(lambda d: d.raised and (d.raised[0] == "a hang" or "Mismatch" in d.raised[0]), HANG),
    Hint(lambda d: d.raised and "the full tensor has" in d.raised[1], "all_gather(output, "
         "shard) and reduce_scatter(output, full): the unit's whole buffer has N times the "
         "elements of each rank's part (flat_grad.numel() // N, self.shard)"),
    Hint(_on("loss", lambda d: d.where["step"] == 1), "the first forward already differs: the "
         "units computed with other weights than their shards; unshard must fill self.full with "
         "every rank's shard, self.comm.all_gather(self.full, self.shard, ...)"),
    Hint(_on("after_forward", lambda d: d.whole[0]["bytes still gathered"] and not d.whole[0][
        "self.is_gathered"]), f"you dropped self.full (del, or a new tensor), but autograd holds "
         f"the buffer for backward (its saved weights are views of it): nothing freed; {FREE}"),
    Hint(_on("after_forward", lambda d: d.mine > d.want), f"post_forward must free (reshard) "
         f"every unit but the root, and reshard must {FREE}"),
    Hint(_on("after_forward"), "the root was freed after forward, to be all-gathered again at "
         "once: its backward starts right after its forward. Reshard only when not is_root"),
    Hint(_on("after_backward"), f"the unit was still gathered after its backward: {FREE}"),
    Hint(_on("ledger", lambda d: _ops(d) - _ops(d, 1)), lambda d: "your unshard all-gathers "
         f"more than the reference ({', '.join(map(str, (_ops(d) - _ops(d, 1)).elements()))} B "
         f"more): return at once when the unit is gathered already"),
    Hint(lambda d: d.observable in ("grads", "ledger") and not (_ops(d, 0, "all_reduce") or _ops(
        d, 0, "reduce_scatter")), "the gradients were never averaged over the ranks (no "
         "all-reduce or reduce-scatter in the step): each rank stepped on its own gradient"),
    Hint(_on("ledger", lambda d: _ops(d, 0, "all_reduce") - _ops(d, 1, "all_reduce")), "the "
         "gradient was all-reduced (2Ψ): each rank keeps only its shard: one reduce-scatter (Ψ)"),
    *scale_hints("grads"),
    Hint(lambda d: "view" in d.path or d.observable == "alive" and "grads" in d.path and
         d.mine > d.want, "the shard returned is a slice (a view) of flat_grad, and a view keeps "
         "the unit's whole gradient alive: return a new tensor of flat_grad.numel() // N"),
    Hint(_on("grad_labels", lambda d: d.mine != "none"), "your gradient's collective is "
         "labelled {mine!r}, the label reduce_scatter_grad was given is {want!r}: pass `label` "
         "on to the collective, so the ledger and the dashboard name each unit's reduction"),
    Hint(_on("grad_shard"), "two units' gradient shards share one storage (a buffer kept and "
         "reused): the later unit's reduction overwrites the earlier one's; use a new tensor"),
    Hint(_on("peak_gathered", lambda d: d.mine > d.want), "more of the net was gathered at once "
         "than in the reference: gather a unit only for its own forward and backward"),
    Hint(_on("alive", lambda d: d.mine > d.want), lambda d: f"after the step {d.mine - d.want:,} "
         f"B more of {d.path} are alive than in the reference{' (more every step)' * d.grows}: "
         f"a tensor kept on self (a buffer cached and reused, or a step's output) holds them"),
    Hint(_on("between steps", lambda d: d.mine > d.want), lambda d: f"after zero_grad, between "
         f"two steps, {d.mine - d.want:,} B of {d.path} are still alive that the reference has "
         "freed: a tensor kept on self (a buffer cached and reused) holds them. Make each "
         "step's buffers anew and keep no reference to them"),
]
WORDS = {k: f"unit {{unit!r}} {v} on rank {{rank}} in step {{step}}" for k, v in {
    "after_forward": "after its post_forward", "grad_shard": "(its gradient shard)",
    "after_backward": "after its backward: bytes still gathered",
    "grad_labels": "(the labels of its gradient's collectives)"}.items()}
WORDS.update(ledger="rank {rank}'s collectives in step {step}", grads="rank {rank}'s gradient "
             "shards in step {step}", alive="rank {rank}'s bytes alive after step {step}",
             **{"between steps": "rank {rank}'s bytes alive after step {step}'s zero_grad"})
ORDER = ("start", "loss", "after_forward", "after_backward", "grad_shard", "backward_weights",
         "grads", "ledger", "grad_labels", "weights", "peak_gathered", "alive", "peak",
         "between steps")
TOLERANCE = {"loss": 1e-5, "backward_weights": 1e-6, "grads": 1e-5, "weights": 1e-5, "peak": 0.25}
UNIT, GRAD = (Check(what, _train, [], ORDER, TOLERANCE, WORDS, HINTS, agreed=agreed,
                    on_ranks=True) for what, agreed in (
    ("your FSDP unit", "every unit but the root freed after its forward (storage resized to 0), "
     "gathered again before its backward, freed after it; the same collectives, gradients, "
     "weights and memory as the reference"),
    ("your reduce_scatter_grad", "each rank keeps the average of its own shard, from one "
     "reduce-scatter per unit, in a tensor of its own; it trains like the reference")))


def _with(fn, unit_cls):
    """``unit_cls`` whose ``reduce_grad`` is ``fn(flat_grad, comm, label)``."""
    return type(unit_cls.__name__, (unit_cls,), {"reduce_grad": lambda self, flat_grad: fn(
        flat_grad, self.comm, self.tag("grad"))})


@verdict_of_check
def check_unit(unit_cls, world_size: int = 2, model: str = "tiny") -> CheckResult:
    """Exercise 1: your unit beside the reference, on 1 to 4 ranks and on the ``model`` GPT at
    ``world_size`` (gradients reduced the stand-in way, 2Ψ, until exercise 2)."""
    result = CheckResult(f"{UNIT.what} ({getattr(unit_cls, '__name__', unit_cls)})")
    if not (isinstance(unit_cls, type) and issubclass(unit_cls, FSDPUnit)):
        return result.wrong(f"expected a subclass of labs.FSDPUnit, got {unit_cls!r}").finish()
    todo = missing_methods(unit_cls, ("unshard", "reshard", "post_forward", "pre_backward"),
                           FSDPUnit)
    if todo:
        return result.wrong(f"not written yet: {', '.join(todo)} (still `...`)",
                            hint="labs.show_solution('05_my_unit') shows one").finish()
    UNIT(unit_cls, _unit(), result, _configs(world_size, model))
    return result.finish()


@verdict_of_check
def check_reduce_scatter_grad(fn, unit_cls, world_size: int = 2, model: str = "tiny"):
    """Exercise 2, inside ``unit_cls``: beside the reference reduction in the reference unit."""
    result = CheckResult(f"{GRAD.what} ({getattr(fn, '__name__', fn)})")
    if unwritten(fn):
        return result.wrong("not written yet (still `...`)",
                            hint="labs.show_solution('05_reduce_scatter_grad') shows one").finish()
    GRAD(_with(fn, unit_cls), _with(_reduce(), _unit()), result, _configs(world_size, model))
    return result.finish()


_unit = lambda: load_solution("05_my_unit", "MyUnit")  # noqa: E731
_reduce = lambda: load_solution("05_reduce_scatter_grad", "reduce_scatter_grad")  # noqa: E731
JUDGES = {"05_my_unit": lambda classes: UNIT.judge_many(classes, _unit(), _configs(2, "tiny")),
          "05_reduce_scatter_grad": lambda fns: GRAD.judge_many(
              [_with(f, _unit()) for f in fns], _with(_reduce(), _unit()),
              _configs(2, "tiny"))}
