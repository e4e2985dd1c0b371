"""Lab 03, DDP from scratch: your gradient hook, then your buckets, each plugged into the kit as a
strategy (``labs.ddp_strategy(wrap_ddp)``, ``labs.bucketed_ddp_strategy(Buckets)``), so the
ledger, the dashboard and the checks work on them.

Both checks train your strategy beside the reference solution's on 1 to 4 ranks (rank r builds
its net with seed r: wrapping must broadcast rank 0's weights), on small nets of odd sizes and on
the lab's GPT, with SGD + momentum (linear in the gradient: a wrong scale shows) and AdamW, for
four steps, and compare every step: the start, the weights after backward, the gradients, the
collectives, the weights after the step; for the buckets also when each all-reduce was launched
and waited for, and the memory still alive after each step.
"""

from __future__ import annotations

from ...comm.ledger import ring_bytes
from ...models import GPTConfig, SyntheticText, make_model
from ..common.differential import Check, Config, Hint, spread
from ..common.hints import TRAINING_HINTS
from ..common.checking import missing_methods
from ..common.exercise import load_solution, not_written_yet
from ..common.observing import (NETS, OPTIMIZERS, batches_for, observe_memory,
                                observe_training, small_net)
from ..common.report import CheckResult, verdict_of_check
from .scaffold import bucketed_ddp_strategy, ddp_strategy

__all__ = ["bucketed_ddp_strategy", "check_buckets", "check_ddp", "ddp_strategy"]

STEPS = 4
SGD = "SGD+momentum"


def _net(cfg, rank):
    """(net built with seed ``rank``, this rank's batches, the loss) for the configuration."""
    n = cfg["world_size"]
    if cfg["net"] in ("tiny", "default"):
        gpt = GPTConfig.sized(cfg["net"])
        data = SyntheticText(gpt.vocab_size, gpt.block_size)
        return (make_model(gpt, seed=rank), lambda step: data.local_batch(step, 4 * n, rank, n),
                lambda net, x, y: net(x, y)[1])
    from ..common.observing import mse
    return small_net(cfg["net"], seed=rank), batches_for(cfg["net"], rank, n), mse


def _train(strategy, cfg, record) -> None:
    from ...api import parallelize
    # Note: memory (a tracker that counts every tensor of the process first) with SGD only, at
    # an even and an odd world size and on the lab's own model: a leak shows in any of them
    watched = cfg["optimizer"] == SGD and (cfg["world_size"] in (1, 3) or cfg["net"] not in NETS)
    for memory in (False, True) if watched else (False,):
        net, batch, loss = _net(cfg, record.rank)
        made = strategy(cfg) if callable(strategy) and not isinstance(strategy, type) else strategy
        net, opt = parallelize(net, made, optimizer=OPTIMIZERS[cfg["optimizer"]],
                               check_collectives=True)
        if memory:
            observe_memory(record, net, opt, batch, STEPS, loss)
        else:
            watch = net.fsdp_mini.watch
            observe_training(record, net, opt, batch, STEPS, loss,
                             each_step=lambda step: setattr(watch, "step", step))
            notes = watch.notes
            for step in range(1, STEPS + 1) if not hasattr(net.fsdp_mini, "buckets") else ():
                record.see("reduced", sorted(_what_was_reduced(n) for n in notes
                                             if n["step"] == step), step=step)
            for step, launched in _launches(notes).items():
                record.see("launches", launched, step=step)


def _what_was_reduced(note) -> str:
    """What a hook handed to all_reduce, as the scaffold saw it."""
    if note["weights"]:
        return "a weight"
    if not note["of_grad"]:
        return "a copy"
    return "a gradient" if note["waited"] else "a gradient, never waited for"


def _launches(notes) -> dict:
    """The all-reduces of each step as the scaffold saw them launched and waited for."""
    out = {}
    for n in notes:
        if n["step"] > 0 and "bucket" in n:
            out.setdefault(n["step"], []).append({
                "bucket": n["bucket"], "full": n["ready"] == n["of"], "in_hook": n["in_hook"],
                "async": n["async"], "overlapped": n["hidden"], "in_flight": n["in_flight"],
                "waited": n.get("waited_in_time", n["waited"])})
    return {s: sorted(v, key=lambda d: str(d["bucket"])) for s, v in out.items()}


def _configs(world_size: int, model: str) -> list[Config]:
    return spread(world_size=[1, 2, 3, 4], net=["mlp", "twins"], optimizer=[SGD, "AdamW"]) + \
        spread(world_size=[world_size], net=[model], optimizer=[SGD, "AdamW"])


def _reduced(d, *what) -> bool:
    return d.observable == "reduced" and (d.mine in what or any(w in str(d.mine) for w in what))


def _count(d, relation) -> bool:
    """The first step made more (or fewer) of ``d.observable`` than the reference."""
    mine, want = (len(x) if isinstance(x, list) else 0 for x in d.whole)
    return not d.from_a_later_step and relation(mine, want)


HINTS = [
    Hint(lambda d: _reduced(d, "a weight"), "you all-reduced a weight (param.data), not its "
         "gradient: the hook receives the parameter; reduce param.grad"),
    Hint(lambda d: _reduced(d, "a copy"), "you all-reduced a copy of the gradient: all_reduce "
         "works in place, so the copy got the sum and param.grad kept this rank's own"),
    Hint(lambda d: _reduced(d, "never waited"), "an all_reduce(..., async_op=True) whose handle "
         "was never waited for: the division and the optimizer may read param.grad before the "
         "sum has arrived; wait for it, or leave async_op out"),
    Hint(lambda d: d.observable == "reduced" and not d.whole[0], "your hooks all-reduced "
         "nothing through the comm they were given: reduce with comm.all_reduce (the kit's "
         "ledger and checks see only what goes through it), every gradient on every rank"),
    Hint(lambda d: d.observable == "reduced" and _count(d, int.__gt__), "more all-reduces than "
         "the reference: each gradient once a step (one hook per parameter)"),
    Hint(lambda d: d.observable == "reduced" and _count(d, int.__lt__), "fewer all-reduces than "
         "the reference: every gradient must be all-reduced, every step"),
    Hint(lambda d: d.observable == "backward_weights", "backward changed the weights, which only "
         "the optimizer may: the hook receives the parameter; what you reduce is its .grad"),
    Hint(lambda d: d.observable == "launches" and "full" in d.path,
         "a bucket was all-reduced before every gradient in it was ready: launch it once full"),
    Hint(lambda d: d.observable == "launches" and "in_hook" in d.path,
         "buckets launched in backward_done, after autograd had finished: nothing overlaps; "
         "launch each from grad_ready once it is full"),
    Hint(lambda d: d.observable == "launches" and "async" in d.path,
         "blocking all-reduces stop backward for each bucket: comm.all_reduce(flat, label=..., "
         "async_op=True) returns a handle at once; wait for it in backward_done"),
    Hint(lambda d: d.observable == "launches" and "overlapped" in d.path,
         "you waited for each bucket right after launching it, so backward stopped: keep the "
         "handles, wait for them in backward_done"),
    Hint(lambda d: d.observable == "launches" and "in_flight" in d.path,
         lambda d: f"{d.mine} all-reduce(s) in flight at once where the reference has {d.want}: "
                   f"each bucket goes out once full while the earlier ones still travel; wait "
                   f"for them all in backward_done, not one before the next"),
    Hint(lambda d: d.observable == "launches" and "waited" in d.path,
         "an all-reduce not waited for by the end of backward_done: the optimizer may read the "
         "gradient before the sum has arrived"),
    Hint(lambda d: d.observable == "launches" and _count(d, int.__ne__),
         lambda d: f"{len(d.whole[0] or ())} all-reduces for {len(d.whole[1])} buckets: one "
                   f"all-reduce per bucket, of one flat tensor (torch.cat of its gradients), once "
                   f"it is full"),
    *TRAINING_HINTS,
]

WORDS = {"start": "rank {rank}'s weights after wrapping", "loss": "rank {rank}'s loss in step "
         "{step}", "backward_weights": "rank {rank}'s weights after backward in step {step}",
         "grads": "rank {rank}'s gradient in step {step}", "ledger": "rank {rank}'s collectives "
         "in step {step}", "weights": "rank {rank}'s weights after step {step}", "launches":
         "rank {rank}'s bucket all-reduces in step {step}", "reduced": "what rank {rank}'s "
         "all-reduces were given in step {step}", "alive": "rank {rank}'s bytes alive "
         "after step {step}", "peak": "rank {rank}'s bytes at the peak of step {step}"}
ORDER = ("start", "loss", "reduced", "launches", "backward_weights", "grads", "ledger",
         "weights", "peak", "alive")
DDP = Check("your DDP (wrap_ddp + average_gradient)", _train, [], ORDER,
            tolerance={"loss": 1e-5, "backward_weights": 1e-6, "grads": 1e-5, "weights": 1e-5,
                       "peak": 0.15},
            words=WORDS, hints=HINTS, on_ranks=True, agreed="every rank starts from rank 0's "
            "weights, averages every gradient and steps like the reference, with the same "
            "all-reduces")
BUCKETS = Check("your buckets", _train, [], ORDER, tolerance=DDP.tolerance, words=WORDS,
                hints=HINTS, on_ranks=True, agreed="one all-reduce per bucket, launched once "
                "full while backward runs, waited for in backward_done; the same gradients, "
                "weights and memory as the reference")


@verdict_of_check
def check_ddp(wrap_ddp, average_gradient=None, world_size=2, timeout=20,
              model="tiny") -> CheckResult:
    """Your ``wrap_ddp`` (and the ``average_gradient`` it hooks) beside the reference, on 1 to
    4 ranks and on the ``model`` GPT ("tiny" or "default") at ``world_size``."""
    result = CheckResult(DDP.what)
    stubs = [f.__name__ for f in (wrap_ddp, average_gradient) if f and not_written_yet(f)]
    if stubs:
        return result.wrong(f"not written yet: {' and '.join(stubs)} (still `...`)",
                            hint="labs.show_solution('03_ddp_hooks') shows one").finish()
    DDP.timeout = timeout
    DDP(ddp_strategy(wrap_ddp), _ddp_reference(), result, configs=_configs(world_size, model))
    _sent(result, world_size, model)
    return result.finish()


@verdict_of_check
def check_buckets(buckets_class, world_size=2, timeout=20, bucket_mb=None,
                  model="tiny") -> CheckResult:
    """Your bucket logic (``buckets_class``) behind :func:`bucketed_ddp_strategy`, beside the
    reference's, on 1 to 4 ranks and the ``model`` GPT. Buckets are a third of each net (the
    GPT's: ``bucket_mb``, by default a quarter of it, the size lab 03 then trains with)."""
    result = CheckResult(BUCKETS.what)
    stubs = missing_methods(buckets_class, ("__init__", "grad_ready", "backward_done"), object)
    if stubs:
        return result.wrong(f"not written yet: {', '.join(stubs)} (still `...`)",
                            hint="labs.show_solution('03_buckets') shows one").finish()
    BUCKETS.timeout = timeout
    mb = bucket_mb or (0.03 if model == "tiny" else
                       make_model(GPTConfig.sized(model)).num_params() / 2**20)
    BUCKETS(_bucketed(buckets_class), _bucketed(_buckets_reference()), result,
            configs=_bucket_configs(world_size, model, mb))
    _sent(result, world_size, model)
    return result.finish()


def _bucket_configs(world_size: int, model: str, bucket_mb: float) -> list[Config]:
    """The DDP check's configurations, each with its bucket size: a third of a small net,
    ``bucket_mb`` for the lab's GPT."""
    third = {"mlp": 96, "twins": 128}
    return [Config(**c, bucket_bytes=third.get(c["net"], round(bucket_mb * 2**20)))
            for c in _configs(world_size, model)]


def _bucketed(cls):
    """A strategy per configuration: ``cls`` with buckets of the configuration's size."""
    return lambda cfg: bucketed_ddp_strategy(cls, bucket_mb=cfg["bucket_bytes"] / 2**20)


def _ddp_reference():
    return ddp_strategy(load_solution("03_ddp_hooks", "wrap_ddp"))


def _buckets_reference():
    return load_solution("03_buckets", "Buckets")


# What tests/wrong_answers/ judges many answers with (the lab's own size: 2 ranks, tiny GPT)
JUDGES = {
    "03_ddp_hooks": lambda pairs: DDP.judge_many(
        [ddp_strategy(wrap) for wrap, _ in pairs], _ddp_reference(), _configs(2, "tiny")),
    "03_buckets": lambda classes: BUCKETS.judge_many(
        [_bucketed(c) for c in classes], _bucketed(_buckets_reference()),
        _bucket_configs(2, "tiny", 0.03))}


def _sent(result: CheckResult, world_size: int, model: str) -> None:
    """The lab's own run: bytes each rank sent per step, from your run's ledger."""
    table = result.facts.get("records")
    mine = next((m for c, (m, _) in (table or {}).items() if c["world_size"] == world_size
                 and c["net"] == model and c["optimizer"] == SGD), None)
    if mine is not None:
        result.facts["sent_per_step"] = [
            sum(ring_bytes(op, size, world_size) for op, size, _ in mine.get(
                "ledger", step=s) or ()) for s in range(1, STEPS + 1)]
