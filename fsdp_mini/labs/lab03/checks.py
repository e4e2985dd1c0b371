"""Lab 03, DDP from scratch: your gradient hook, then your buckets, each plugged into the kit as a
strategy (``labs.ddp_strategy(wrap_ddp)``, ``labs.bucketed_ddp_strategy(Buckets)``), so the
ledger, the dashboard and the parity checks work on them. The checkers train the tiny GPT on N
ranks, rank r built with seed r (wrapping must broadcast rank 0's weights), with SGD + momentum
(linear in the gradient: a wrong scale shows) and AdamW (scale-invariant: it hides one), against
one process on the whole batch and against ``torch.nn.parallel.DistributedDataParallel``.
"""

from __future__ import annotations

from functools import partial

import torch

from ...launcher import LaunchError, launch
from ...models import GPTConfig, SyntheticText, make_model
from ...training import train
from ..common.checking import explain_failure, forget_logs
from ..common.exercise import not_written_yet
from ..common.report import CheckResult
from .scaffold import bucketed_ddp_strategy, ddp_strategy

__all__ = ["bucketed_ddp_strategy", "check_buckets", "check_ddp", "ddp_strategy"]

CHECK_STEPS, TINY, SGD = 2, GPTConfig.tiny(), "SGD with momentum"  # what every check trains
OPTIMIZERS = {SGD: partial(torch.optim.SGD, lr=0.05, momentum=0.9),
              "AdamW": partial(torch.optim.AdamW, lr=1e-3)}


def _config(model: str) -> GPTConfig:
    return TINY if model == "tiny" else GPTConfig()


def _batches(rank, world_size, global_batch, config=TINY):
    data = SyntheticText(config.vocab_size, config.block_size)
    return lambda step: data.local_batch(step, global_batch, rank, world_size)


def _train(model, opt, batches, steps) -> dict:
    """Train; return the start, each step's gradients and bytes sent (this rank), the end."""
    run = {"start": {k: v.clone() for k, v in model.state_dict().items()}, "grads": [], "sent": []}
    opt.register_step_pre_hook(lambda *_: run["grads"].append(
        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    ours = getattr(model, "fsdp_mini", None)
    for step in range(steps):  # Note: one at a time, so that a step that sends nothing shows 0 B
        if ours is not None:
            ours.watch.step, before = step + 1, ours.comm.ledger.sent_bytes()
        train(model, opt, lambda _, step=step: batches(step), 1)
        run["sent"].append(ours.comm.ledger.sent_bytes() - before if ours else 0.0)
    return {**run, "state": model.state_dict()}


def _train_on_rank(rank, world_size, classes, steps, with_torch_ddp, model="tiny"):
    """Train under each strategy class with each optimizer, from a rank-dependent start."""
    from ...api import parallelize
    config = _config(model)
    out, batches = {"runs": []}, _batches(rank, world_size, 4 * world_size, config)
    for cls in classes:
        out["runs"].append({})
        for opt_name, optimizer in OPTIMIZERS.items():
            net = make_model(config, seed=rank)  # Note: on purpose, not rank 0's
            net, opt = parallelize(net, cls, optimizer=optimizer, check_collectives=True)
            out["runs"][-1][opt_name] = {**_train(net, opt, batches, steps),
                                         "notes": net.fsdp_mini.watch.notes,
                                         "expected": net.fsdp_mini.sent_bytes_per_step(),
                                         "buckets": len(getattr(net.fsdp_mini, "buckets", []))}
    if with_torch_ddp:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(make_model(config, seed=0))
        train(net, OPTIMIZERS[SGD](net.parameters()), batches, steps)
        out["torch_ddp"] = net.module.state_dict()
    out["reference"] = _reference(steps, world_size, config) if rank == 0 else None  # 1 thread
    return out


def _reference(steps, world_size, config=TINY) -> dict:
    """Single-process training on the whole global batch, from rank 0's weights."""
    models = {name: make_model(config, seed=0) for name in OPTIMIZERS}
    return {name: _train(m, OPTIMIZERS[name](m.parameters()),
                         _batches(0, 1, 4 * world_size, config),
                         steps) for name, m in models.items()}


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
        explain_failure(result, err, timeout, hang_hint, none_hint if "None" in msg else None)


def _judge(result, ranks, world_size, ref, config=TINY) -> None:
    """The lines both checkers share: start, what was reduced, gradients, parity, bytes."""
    start, runs = make_model(config, seed=0).state_dict(), [out["runs"] for out in ranks]
    off = [r for r, run in enumerate(runs) if _rel(run["AdamW"]["start"], start)]
    result.check(not off, "every rank starts from rank 0's weights (rank r was built with seed r)",
                 f"rank {off[0] if off else 0} starts from other weights than rank 0",
                 "broadcast each parameter from rank 0 when wrapping: comm.broadcast(p.data, "
                 "label='sync', src=0)")
    if any(n["weights"] for run in runs for n in run[SGD]["notes"] if n["step"] > 0):
        result.wrong("you all-reduced the weights, not the gradients",
                     hint="the hook receives the parameter; its gradient is param.grad")
    k = runs[0][SGD]["buckets"]  # Note: 0 for the DDP exercise
    all_out = [sum(n["step"] == s + 1 for n in runs[0][SGD]["notes"]) == k > 0
               for s in range(CHECK_STEPS)]
    scaled = _judge_grads(result, [run[SGD]["grads"] for run in runs], world_size,
                          ref[SGD]["grads"], all_out)
    for opt_name in OPTIMIZERS:
        e = max(_rel(run[opt_name]["state"], ref[opt_name]["state"]) for run in runs)
        result.check(e <= 1e-5, f"after {CHECK_STEPS} steps of {opt_name} the weights match "
                                f"single-process training (relative difference {e:.1e})",
                     f"after {CHECK_STEPS} steps of {opt_name} the weights differ from single-"
                     f"process training by {e:.1e}", "Adam divides by the gradient's size, so it "
                     "hides a wrong scale that SGD shows" if scaled and opt_name == SGD else "")
    if ranks[0]["torch_ddp"] is not None:
        e = max(_rel(run[SGD]["state"], out["torch_ddp"]) for run, out in zip(runs, ranks))
        result.check(e <= 1e-5, f"the same as torch's DistributedDataParallel on the same data "
                                f"(relative difference {e:.1e})",
                     f"differs from torch's DistributedDataParallel by {e:.1e}")
    sent, expected = runs[0][SGD]["sent"], runs[0][SGD]["expected"]
    s = next((s for s, x in enumerate(sent) if x != expected), 0)
    result.check(all(x == expected for x in sent), f"each rank sent 2(N-1)/N x 4Ψ = "
                 f"{expected:,.0f} B in every step, as the formula says", f"in step {s + 1} each "
                 f"rank sent {sent[s]:,.0f} B; the formula 2(N-1)/N x 4Ψ says {expected:,.0f} B "
                 f"({sent[s] / expected:.2f}x)", "the ledger counts only what goes through comm: "
                 "use comm.all_reduce, not dist.all_reduce" if max(sent) == 0 else
                 "all-reduce each gradient once a step")
    result.facts.update(sent_per_step=sent, expected=expected)


def _judge_grads(result, grads, world_size, g_ref, buckets_all_out=()) -> bool:
    """Each step's gradients (``grads[rank][step]``) against one process's; True when the fault
    is the scale (2 ranks, the sum not divided: "gradients are 2.00x too large")."""
    errs = [max(_rel(g[s], want) for g in grads) for s, want in enumerate(g_ref)]
    s = next((s for s, e in enumerate(errs) if e > 1e-5), None)
    if s is None:
        result.ok(f"after backward, in each of the {len(errs)} steps, every rank holds the "
                  f"gradient of the whole global batch (relative difference {max(errs):.1e})")
        return False
    mine, want, when = [g[s] for g in grads], g_ref[s], f" of step {s + 1} (step 1 was right)" * s
    spread, ratio = max(_rel(g, mine[0]) for g in mine), float("nan") if errs[s] == float(
        "inf") else float(_vec(mine[0], want) @ _vec(want, want) / _vec(want, want).norm() ** 2)
    scaled = spread <= 1e-6 and min(abs(ratio / world_size - 1), abs(ratio * world_size - 1)) < .01
    if spread > 1e-6 and s < len(buckets_all_out) and buckets_all_out[s]:
        result.wrong(f"after the backward{when}, the ranks hold different gradients (they differ "
                     f"by {spread:.1%}): they were not averaged over the ranks, though every "
                     f"bucket was all-reduced", hint="the flat tensor torch.cat made is a copy: "
                     "after the wait and the division, copy it back into each p.grad")
    elif spread > 1e-6:
        result.wrong(f"after the backward{when}, the ranks hold different gradients (they differ "
                     f"by {spread:.1%}): they were not averaged over the ranks",
                     hint="all-reduce param.grad (the sum over ranks), then divide it by N")
    elif scaled and ratio > 1:
        result.wrong(f"gradients are {ratio:.2f}x too large: did you divide by the world size?")
    elif scaled:
        result.wrong(f"gradients are {1 / ratio:.2f}x too small: did you average twice?",
                     hint="divide by N once, after one all-reduce of each gradient")
    else:
        result.wrong(f"after the backward{when}, the gradients differ from one process's by "
                     f"{errs[s]:.1%}")
    return scaled


def _judge_buckets(result, ranks) -> None:
    """How rank 0 sent its buckets, step by step: each once, when full, while backward ran."""
    run, k = ranks[0]["runs"][SGD], ranks[0]["runs"][SGD]["buckets"]
    notes = [[n for n in run["notes"] if n["step"] == s + 1] for s in range(CHECK_STEPS)]
    count = [len(ns) for ns in notes]
    early = [[n for n in ns if n["ready"] < n["of"]] for ns in notes]
    bad = [c != k or bool(e) for c, e in zip(count, early)]
    hidden = [sum(n["in_hook"] and n["hidden"] for n in ns) for ns in notes]
    least = notes[hidden.index(min(hidden))]  # Note: the step that overlapped least
    if not bad[0] and any(bad):  # Note: right in step 1 only: what it counts is not reset
        s = bad.index(True)
        result.wrong(f"your buckets launch right in the first step but not later: step {s + 1} "
                     f"made {count[s]} all-reduce(s) for {k} buckets" + ", some before they were"
                     " full" * bool(early[s]), hint="reset what you count in backward_done, so "
                     "that the next step starts afresh")
    elif any(early):
        n = next(e for e in early if e)[0]
        result.wrong(f"bucket {n['bucket']} was all-reduced when only {n['ready']} of its "
                     f"{n['of']} gradients were ready, before backward had made the others",
                     hint="launch a bucket once every gradient in it has arrived")
    elif count[0] != k:
        result.wrong(f"{count[0]} all-reduce(s) in the first step for {k} buckets", hint="one "
                     "all-reduce of one flat tensor (torch.cat) per bucket, once it is full")
    elif min(hidden):
        result.ok(f"{min(hidden)} of {k} buckets per step were launched once full, with "
                  f"async_op=True, while backward was still running (overlap)")
    elif not any(n["in_hook"] for n in least):
        result.wrong("every bucket was launched in backward_done, after autograd had finished: "
                     "nothing overlaps", hint="launch each bucket from grad_ready once full")
    elif not any(n["async"] for n in least):
        result.wrong("your all-reduces block (async_op=False): backward stopped for each bucket, "
                     "nothing overlaps", hint="comm.all_reduce(flat, label=..., async_op=True) "
                     "returns a handle at once; wait for it in backward_done")
    else:
        result.wrong("you waited for each bucket right after launching it: backward stopped for "
                     "it, nothing overlaps", hint="keep the handles, wait in backward_done")
    late = max(sum(not n.get("waited_in_time", True) for n in ns) for ns in notes)
    result.check(not late, "every all-reduce was waited for by the end of backward_done, before "
                 "the optimizer used the gradients", f"{late} all-reduce(s) per step were not "
                 "waited for in backward_done", "call handle.wait() in backward_done before "
                 "using the sum")


def check_ddp(wrap_ddp, average_gradient=None, world_size=2, timeout=20,
              model="tiny") -> CheckResult:
    """Your ``wrap_ddp`` (and the ``average_gradient`` it hooks) on ``world_size`` ranks, training
    the ``model`` GPT ("tiny" or "default", as ``cfg.model``)."""
    return _check_many([(wrap_ddp, average_gradient)], world_size, timeout, **DDP,
                       model=model)[0].finish()


def check_buckets(buckets_class, world_size=2, timeout=20, bucket_mb=None,
                  model="tiny") -> CheckResult:
    """Your bucket logic (``buckets_class``) behind :func:`bucketed_ddp_strategy`, training the
    ``model`` GPT. ``bucket_mb`` defaults to a quarter of the model's bytes (0.03 MiB for the
    tiny GPT: 5 buckets), the size lab 03 then trains your buckets with."""
    if bucket_mb is None:
        bucket_mb = 0.03 if model == "tiny" else make_model(_config(model)).num_params() / 2**20
    return _check_many([buckets_class], world_size, timeout, **{
        **BUCKETS, "make": partial(bucketed_ddp_strategy, bucket_mb=bucket_mb)},
        model=model)[0].finish()


def _check_many(items, world_size, timeout, make, stubs, what, solution, torch_ddp, hang_hint,
                none_hint, judge_first=lambda result, ranks: None,
                model="tiny") -> list[CheckResult]:
    """Several learners' answers trained in one launch, each judged alone (the tests use it)."""
    results, todo = [CheckResult(what) for _ in items], [k for k, x in enumerate(items)
                                                         if not stubs(x)]
    for k in sorted(set(range(len(items))) - set(todo)):
        *most, last = stubs(items[k])  # Note: every one of them, so that none is a surprise
        results[k].wrong(f"not written yet: {', '.join(most) + ' and ' * bool(most)}{last} "
                         f"(still `...`)", hint=f"labs.show_solution('{solution}') shows one")
    try:
        ranks = launch(_train_on_rank, world_size, [make(items[k]) for k in todo], CHECK_STEPS,
                       torch_ddp, model, backend="gloo", timeout=timeout) if todo else []
    except LaunchError as err:
        for k in todo:
            _explain_launch(results[k], err, timeout, hang_hint, none_hint)
        forget_logs(err)
        return results
    for j, k in enumerate(todo):
        mine = [{"runs": out["runs"][j], "torch_ddp": out.get("torch_ddp")} for out in ranks]
        judge_first(results[k], mine)
        _judge(results[k], mine, world_size, ranks[0]["reference"], _config(model))
    return results


def _judge_ddp_calls(result, ranks) -> None:
    """What the hooks handed to all_reduce: a copy of the gradient, a handle never waited for."""
    notes = [n for out in ranks for n in out["runs"][SGD]["notes"] if n["step"] > 0]
    if any(not n["weights"] and not n.get("of_grad", True) for n in notes):
        result.wrong("you all-reduced a copy of the gradient (param.grad.clone(), or a new "
                     "tensor): all_reduce works in place on the tensor you pass, so the copy got "
                     "the sum and param.grad kept this rank's own gradient",
                     hint="comm.all_reduce(param.grad, label='grad'), then divide param.grad")
    if any(n["async"] and not n["waited"] for n in notes):
        result.wrong("you called comm.all_reduce(..., async_op=True) and never waited for its "
                     "handle: the division and the optimizer may read param.grad before the sum "
                     "has arrived", hint="in the hook leave async_op out (or keep the handle and "
                     "call handle.wait() before using param.grad)")


DDP = {"make": lambda pair: ddp_strategy(pair[0]), "what": "your DDP (wrap_ddp + average_gradient)",
       "judge_first": _judge_ddp_calls,
       "stubs": lambda pair: [f.__name__ for f in pair if f and not_written_yet(f)],
       "solution": "03_ddp_hooks", "torch_ddp": True, "hang_hint": "a rank waits in an "
       "all-reduce another rank never makes: did a rank skip the all-reduce of a parameter?",
       "none_hint": "param.grad was None: the all-reduce ran before backward produced the "
       "gradient (a forward hook?); use register_post_accumulate_grad_hook"}
BUCKETS = {"make": bucketed_ddp_strategy, "what": "your buckets", "stubs": lambda c: [
    m for m in ("__init__", "grad_ready", "backward_done") if not_written_yet(getattr(c, m))],
    "solution": "03_buckets", "torch_ddp": False, "judge_first": _judge_buckets,
    "hang_hint": "do all ranks launch the same buckets, and wait for each?", "none_hint": "a "
    "gradient was still None: launch a bucket once every gradient in it has arrived"}
