"""Lab 03, DDP from scratch: your gradient hook, then your buckets, each plugged into the kit as a
strategy (``labs.ddp_strategy(wrap_ddp)``, ``labs.bucketed_ddp_strategy(Buckets)``), so the
ledger, the dashboard and the parity checks work on them. The checkers train the tiny GPT on N
ranks, rank r built with seed r (wrapping must broadcast rank 0's weights), with SGD + momentum
(linear in the gradient: a wrong scale shows) and AdamW (scale-invariant: it hides one), against
one process on the whole batch and against ``torch.nn.parallel.DistributedDataParallel``.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from ..buckets import BucketScheduler, grad_ready_order, split_into_buckets
from ..comm import broadcast_module_states
from ..launcher import LaunchError, launch
from ..models import GPTConfig, SyntheticText, make_model
from ..strategy import Strategy
from ..theory import ddp_sent_bytes
from ..training import train
from .exercise import not_written_yet
from .lab02 import _explain_failure
from .report import CheckResult

__all__ = ["bucketed_ddp_strategy", "check_buckets", "check_ddp", "ddp_strategy"]

CHECK_STEPS, TINY = 2, GPTConfig.tiny()  # the model every check trains
OPTIMIZERS = {"SGD with momentum": partial(torch.optim.SGD, lr=0.05, momentum=0.9),
              "AdamW": partial(torch.optim.AdamW, lr=1e-3)}


class _Watch:
    """The ``comm`` your code gets: the kit's Comm, plus notes on all-reduces for the checker."""

    def __init__(self, comm, strategy):
        self._comm, self._strategy, self.notes = comm, strategy, []

    def __getattr__(self, name):  # rank, world_size, ledger, broadcast, all_gather, ...
        return getattr(self._comm, name)

    def all_reduce(self, tensor, label="all_reduce", async_op=False, op="sum"):
        weights = any(p.data_ptr() == tensor.data_ptr() for p in self._strategy.module.parameters())
        note = {"weights": weights, "waited": not async_op, "step": self._comm.ledger.step,
                **self._strategy.launch_note(tensor)}
        self.notes.append(note)
        handle = self._comm.all_reduce(tensor, label, async_op=async_op, op=op)
        return handle and SimpleNamespace(  # Note: a handle that tells the checker it was waited
            wait=lambda: (handle.wait(), note.__setitem__("waited", True)))


def ddp_strategy(wrap_ddp, name: str = "my_ddp") -> type[Strategy]:
    """A Strategy class: ``parallelize(model, it)`` calls ``wrap_ddp(module, comm)`` to wrap."""

    class MyDDP(Strategy):
        strategy, traffic = name, "2Ψ"

        def __init__(self, module, comm, recorder=None):
            super().__init__(module, comm, recorder)
            self.watch = _Watch(comm, self)
            module.register_forward_hook(lambda *_: self.mark(name, "forward_done"))
            wrap_ddp(module, self.watch)

        launch_note = staticmethod(lambda tensor: {})  # what the checker learns of an all-reduce

        def sent_bytes_per_step(self) -> float:
            return ddp_sent_bytes(self.numel()[0], self.comm.world_size, self.element_size())

    return MyDDP


def bucketed_ddp_strategy(buckets_class, bucket_mb=0.03, name="my_bucket_ddp") -> type[Strategy]:
    """A Strategy class: rank 0's weights everywhere, buckets of about ``bucket_mb`` MiB (in the
    order gradients arrive) and your class: ``buckets_class(buckets, comm)``, ``.grad_ready(param)``
    as each gradient is accumulated, ``.backward_done()`` once backward is over."""

    class MyBucketDDP(ddp_strategy(broadcast_module_states, name)):  # Note: rank 0's weights

        def __init__(self, module, comm, recorder=None):
            super().__init__(module, comm, recorder)
            self.buckets = split_into_buckets(grad_ready_order(module), int(bucket_mb * 2**20))
            self.learner = buckets_class(self.buckets, self.watch)
            self._ready, self._launched, self._ending = set(), set(), False
            # Note: the kit's scheduler only hooks the gradients and finds the end of backward;
            # when to launch a bucket is for your class to decide (its on_ready does nothing).
            self.scheduler = BucketScheduler(self.buckets, lambda i: None, self._backward_end,
                                             self._grad_ready)

        def _grad_ready(self, i: int, j: int) -> None:
            self._ready.add(id(self.buckets[i][j]))
            self.learner.grad_ready(self.buckets[i][j])

        def _backward_end(self) -> None:
            self._ending = True
            self.mark(name, "backward_end")  # autograd is done; your backward_done runs now
            self.learner.backward_done()
            for note in self.watch.notes:
                note.setdefault("waited_in_time", note["waited"])
            self._ready, self._launched, self._ending = set(), set(), False
            self.mark(name, "grads_averaged")

        def launch_note(self, tensor) -> dict:
            """Which bucket an all-reduce of this size is, and how full it was at launch."""
            fits = [i for i, b in enumerate(self.buckets)
                    if i not in self._launched and sum(p.numel() for p in b) == tensor.numel()]
            i = next((i for i in fits if all(id(p) in self._ready for p in self.buckets[i])),
                     fits[0] if fits else None)
            if i is not None:
                self._launched.add(i)
                self.mark(f"bucket{i}", "launched")
            bucket = self.buckets[i] if i is not None else []
            return {"bucket": i, "ready": sum(id(p) in self._ready for p in bucket),
                    "of": len(bucket), "in_hook": not self._ending}

    return MyBucketDDP


def _batch(step, rank, world_size, global_batch):
    data = SyntheticText(TINY.vocab_size, TINY.block_size)
    return data.local_batch(step, global_batch, rank, world_size)


def _train(model, opt, batches, steps) -> dict:
    """Train; return the start, the gradients of the first step, the end, bytes sent per step."""
    run = {"start": {k: v.clone() for k, v in model.state_dict().items()}}
    opt.register_step_pre_hook(lambda *_: None if "grads" in run else run.update(grads={
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    run["sent"] = train(model, opt, batches, steps).sent_bytes
    return {**run, "state": model.state_dict()}


def _train_on_rank(rank, world_size, classes, steps, with_torch_ddp):
    """Train under each strategy class with each optimizer, from a rank-dependent start."""
    from ..api import parallelize
    out, batches = {"runs": []}, lambda step: _batch(step, rank, world_size, 4 * world_size)
    for cls in classes:
        out["runs"].append({})
        for opt_name, optimizer in OPTIMIZERS.items():
            model = make_model(TINY, seed=rank)  # Note: on purpose, not rank 0's
            model, opt = parallelize(model, cls, optimizer=optimizer, check_collectives=True)
            out["runs"][-1][opt_name] = {**_train(model, opt, batches, steps),
                                         "notes": model.fsdp_mini.watch.notes,
                                         "expected": model.fsdp_mini.sent_bytes_per_step(),
                                         "buckets": len(getattr(model.fsdp_mini, "buckets", []))}
    if with_torch_ddp:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(make_model(TINY, seed=0))
        train(model, OPTIMIZERS["SGD with momentum"](model.parameters()), batches, steps)
        out["torch_ddp"] = model.module.state_dict()
    out["reference"] = _reference(steps, world_size) if rank == 0 else None  # Note: 1 thread here
    return out


def _reference(steps, world_size) -> dict:
    """Single-process training on the whole global batch, from rank 0's weights."""
    models = {name: make_model(TINY, seed=0) for name in OPTIMIZERS}
    return {name: _train(m, OPTIMIZERS[name](m.parameters()),
                         lambda step: _batch(step, 0, 1, 4 * world_size), steps)
            for name, m in models.items()}


def _vec(d: dict, keys) -> torch.Tensor:
    return torch.cat([d[k].double().flatten() for k in keys])


def _rel(a: dict, b: dict) -> float:  # ||a - b|| / ||b|| over b's tensors (inf if a lacks one)
    return float("inf") if any(k not in a for k in b) else float(
        (_vec(a, b) - _vec(b, b)).norm() / _vec(b, b).norm())


def _explain_launch(result, err, timeout, hang_hint, none_hint) -> None:
    msg = str(err.message)
    if str(err.exc_type).endswith("CollectiveMismatchError"):
        result.wrong("the ranks issued different collectives: " + msg.split(". Every")[0],
                     hint="every rank must all-reduce every gradient, the same ones in the "
                          "same order; a rank that skips one leaves the others waiting (a hang)")
    else:  # Note: a None in the message is nearly always a gradient that does not exist yet
        _explain_failure(result, err, timeout, hang_hint, none_hint if "None" in msg else None)


def _judge(result, ranks, world_size, ref) -> None:
    """The lines both checkers share: start, what was reduced, gradients, parity, bytes."""
    sgd = "SGD with momentum"
    start = make_model(TINY, seed=0).state_dict()
    off = [r for r, out in enumerate(ranks) if _rel(out["runs"]["AdamW"]["start"], start)]
    result.check(not off, "every rank starts from rank 0's weights (rank r was built with seed r)",
                 f"rank {off[0] if off else 0} starts from other weights than rank 0",
                 "broadcast each parameter from rank 0 when wrapping: comm.broadcast(p.data, "
                 "label='sync', src=0)")
    if any(n["weights"] for out in ranks for n in out["runs"][sgd]["notes"] if n["step"] > 0):
        result.wrong("you all-reduced the weights, not the gradients",
                     hint="the hook receives the parameter; its gradient is param.grad")
    g_ref, grads = ref[sgd]["grads"], [out["runs"][sgd]["grads"] for out in ranks]
    err, spread = max(_rel(g, g_ref) for g in grads), max(_rel(g, grads[0]) for g in grads)
    ratio = float("nan") if err == float("inf") else float(
        _vec(grads[0], g_ref) @ _vec(g_ref, g_ref) / _vec(g_ref, g_ref).norm() ** 2)
    if err <= 1e-5:
        result.ok(f"after backward every rank holds the gradient of the whole global batch "
                  f"(relative difference {err:.1e})")
    elif spread > 1e-6:
        result.wrong(f"after backward the ranks hold different gradients (they differ by "
                     f"{spread:.1%}): they were not averaged over the ranks",
                     hint="all-reduce param.grad (the sum over ranks), then divide it by N")
    elif abs(ratio - world_size) < 0.01 * world_size:
        result.wrong(f"gradients are {ratio:.2f}x too large: did you divide by the world size?")
    elif abs(ratio * world_size - 1) < 0.01:
        result.wrong(f"gradients are {1 / ratio:.2f}x too small: did you average twice?",
                     hint="divide by N once, after one all-reduce of each gradient")
    else:
        result.wrong(f"gradients differ from single-process training by {err:.1%}")
    for opt_name in OPTIMIZERS:
        e = max(_rel(out["runs"][opt_name]["state"], ref[opt_name]["state"]) for out in ranks)
        result.check(e <= 1e-5, f"after {CHECK_STEPS} steps of {opt_name} the weights match "
                                f"single-process training (relative difference {e:.1e})",
                     f"after {CHECK_STEPS} steps of {opt_name} the weights differ from "
                     f"single-process training by {e:.1e}", "Adam divides by the gradient's "
                     "size, so it hides a wrong scale that SGD shows" if opt_name == sgd else "")
    if ranks[0]["torch_ddp"] is not None:
        e = max(_rel(out["runs"][sgd]["state"], out["torch_ddp"]) for out in ranks)
        result.check(e <= 1e-5, f"the same as torch's DistributedDataParallel on the same data "
                                f"(relative difference {e:.1e})",
                     f"differs from torch's DistributedDataParallel by {e:.1e}")
    sent, expected = ranks[0]["runs"][sgd]["sent"], ranks[0]["runs"][sgd]["expected"]
    result.check(all(s == expected for s in sent),
                 f"each rank sent 2(N-1)/N x 4Ψ = {expected:,.0f} B per step, as the formula says",
                 f"each rank sent {max(sent):,.0f} B in a step; the formula 2(N-1)/N x 4Ψ says "
                 f"{expected:,.0f} B ({max(sent) / expected:.2f}x)",
                 "the ledger counts only what goes through comm: use comm.all_reduce, not "
                 "dist.all_reduce" if max(sent) == 0 else "all-reduce each gradient once a step")
    result.facts.update(sent_per_step=sent, expected=expected)


def _judge_buckets(result, ranks) -> None:
    run = ranks[0]["runs"]["SGD with momentum"]
    notes, k = [n for n in run["notes"] if n["step"] > 0], run["buckets"]
    early = [n for n in notes if n.get("bucket") is not None and n["ready"] < n["of"]]
    if early:
        result.wrong(f"bucket {early[0]['bucket']} was all-reduced when only {early[0]['ready']} "
                     f"of its {early[0]['of']} gradients were ready, before backward had made "
                     f"the others", hint="launch a bucket once every gradient in it has arrived")
    else:
        result.check(len(notes) == k * CHECK_STEPS, f"one all-reduce per bucket ({k} buckets), "
                     f"each launched once it was full", f"{len(notes) / CHECK_STEPS:g} "
                     f"all-reduces per step for {k} buckets", "one flat tensor (torch.cat) each")
    during = sum(n.get("in_hook", False) for n in notes) / CHECK_STEPS
    result.check(during > 0, f"{during:g} of {k} buckets per step started while backward was "
                 f"still running (overlap)", "every bucket was launched after backward had "
                 "finished: nothing overlaps", "launch each bucket from grad_ready once full")
    late = [n for n in notes if not n.get("waited_in_time", True)]
    result.check(not late, "every all-reduce was waited for before backward ended",
                 f"{len(late) // CHECK_STEPS} all-reduce(s) per step were not waited for before "
                 f"backward ended", "call handle.wait() in backward_done before using the sum")


def check_ddp(wrap_ddp, average_gradient=None, world_size=2, timeout=20) -> CheckResult:
    """Your ``wrap_ddp`` (and the ``average_gradient`` it hooks) on ``world_size`` ranks."""
    return _check_many([(wrap_ddp, average_gradient)], world_size, timeout, **DDP)[0].finish()


def check_buckets(buckets_class, world_size=2, timeout=20, bucket_mb=0.03) -> CheckResult:
    """Your bucket logic (``buckets_class``) behind :func:`bucketed_ddp_strategy`."""
    return _check_many([buckets_class], world_size, timeout, **{
        **BUCKETS, "make": partial(bucketed_ddp_strategy, bucket_mb=bucket_mb)})[0].finish()


def _check_many(items, world_size, timeout, make, stubs, what, solution, torch_ddp, hang_hint,
                none_hint, judge_first=lambda result, ranks: None) -> list[CheckResult]:
    """Several learners' answers trained in one launch, each judged alone (the tests use it)."""
    results, todo = [CheckResult(what) for _ in items], [k for k, x in enumerate(items)
                                                         if not stubs(x)]
    for k in sorted(set(range(len(items))) - set(todo)):
        results[k].wrong(f"not written yet: {' and '.join(stubs(items[k]))} (still `...`)",
                         hint=f"labs.show_solution('{solution}') shows one")
    try:
        ranks = launch(_train_on_rank, world_size, [make(items[k]) for k in todo], CHECK_STEPS,
                       torch_ddp, backend="gloo", timeout=timeout) if todo else []
    except LaunchError as err:
        for k in todo:
            _explain_launch(results[k], err, timeout, hang_hint, none_hint)
        return results
    for j, k in enumerate(todo):
        mine = [{"runs": out["runs"][j], "torch_ddp": out.get("torch_ddp")} for out in ranks]
        judge_first(results[k], mine)
        _judge(results[k], mine, world_size, ranks[0]["reference"])
    return results


DDP = {"make": lambda pair: ddp_strategy(pair[0]), "what": "your DDP (wrap_ddp + average_gradient)",
       "stubs": lambda pair: [f.__name__ for f in pair if f and not_written_yet(f)],
       "solution": "03_ddp_hooks", "torch_ddp": True, "hang_hint": "a rank waits in an "
       "all-reduce another rank never makes: did a rank skip the all-reduce of a parameter?",
       "none_hint": "param.grad was None: the all-reduce ran before backward produced the "
       "gradient (a forward hook?); use register_post_accumulate_grad_hook"}
BUCKETS = {"make": bucketed_ddp_strategy, "what": "your buckets", "stubs": lambda c: [
    m for m in ("grad_ready", "backward_done") if not_written_yet(getattr(c, m))],
    "solution": "03_buckets", "torch_ddp": False, "judge_first": _judge_buckets,
    "hang_hint": "do all ranks launch the same buckets, and wait for each?", "none_hint": "a "
    "gradient was still None: launch a bucket once every gradient in it has arrived"}
