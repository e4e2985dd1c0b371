"""Lab 04: ZeRO-1 and ZeRO-2 grown from your DDP: the checkers and measurements (the
scaffolding is in ``scaffold.py``).

    class MyZero1(labs.ZeroScaffold):        # the flat buffer and the hooks are ready made
        def my_slice(self): ...              # you write: the slice this rank owns,
        def reduce_gradients(self, g): ...   # how the gradients are averaged,
        def after_step(self): ...            # how the updated slices come back together
    labs.check_zero1(MyZero1)                # ✔/✘ lines: slices, parity, drift, memory, bytes

The checkers (lab 05's use the same helpers) train a small net on 2 ranks with SGD + momentum and
AdamW, beside one process trained on the whole batch. Note: SGD, because AdamW divides each update
by the gradient's own size and so hides a gradient that is N times too large.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import torch

from ...buffers.flat import FlatLayout, ParamSlot
from ...memory import PERSISTENT
from ..common.checking import (OPTIMIZERS, compare_states, make_mlp, measure_strategies,
                               missing_methods, reference, rows_for, run_ranks, train_states)
from ..common.report import CheckResult
from .scaffold import ZeroScaffold, _as_range

__all__ = ["ZeroScaffold", "check_zero1", "check_zero2", "measure_strategies", "who_ran"]



def who_ran(zero1_passed: bool, zero2_passed: bool) -> str:
    """Whose code ran as ``my_zero1`` and ``my_zero2``, once the lab fell back to the reference
    solution of each exercise whose check failed. Example: ``who_ran(False, True)`` says that
    my_zero1 ran the reference and my_zero2 your ``reduce_gradients`` on top of it."""
    if zero1_passed and zero2_passed:
        return "my_zero1 and my_zero2 ran your code."
    if not zero2_passed:  # Note: the reference MyZero2 subclasses the reference MyZero1
        one = "your code" if zero1_passed else "the reference solution (yours does not pass yet)"
        return (f"my_zero1 ran {one}; my_zero2 ran the reference solution of exercise 2 (your "
                f"MyZero2 does not pass yet), built on the reference MyZero1.")
    return ("my_zero1 ran the reference solution (your MyZero1 does not pass yet); my_zero2 ran "
            "your reduce_gradients, on the reference MyZero1's my_slice and after_step.")


# -- the checkers of lab 04 -----------------------------------------------------------------------

def check_zero1(cls, world_size: int = 2) -> CheckResult:
    """Your ZeRO-1 (a :class:`ZeroScaffold`): its slices for N = 2, 3, 4 (with padding), then
    training on ``world_size`` ranks: ranks agree, match one process, Adam state Ψ/N, bytes."""
    return _check_zero(cls, 1, world_size)


def check_zero2(cls, world_size: int = 2) -> CheckResult:
    """As :func:`check_zero1`, and: one reduce-scatter (Ψ, not DDP's 2Ψ), a gradient shard only."""
    return _check_zero(cls, 2, world_size)


def _check_zero(cls, stage: int, world_size: int) -> CheckResult:
    result = CheckResult(f"your ZeRO-{stage} ({getattr(cls, '__name__', cls)})")
    if not (isinstance(cls, type) and issubclass(cls, ZeroScaffold)):
        return result.wrong(f"expected a subclass of labs.ZeroScaffold, got {cls!r}").finish()
    todo = missing_methods(cls, ("my_slice", "reduce_gradients", "after_step"), ZeroScaffold)
    if todo:
        return result.wrong(f"not written yet: {', '.join(todo)}", hint="replace each `...` with "
                            "your code, run the cell, then this check").finish()
    if not _check_slices(cls, result) or (runs := run_ranks(result, _zero_run, world_size, cls,
                                                            explain=_explain_error)) is None:
        return result.finish()
    if "weights" in runs[0]["AdamW"]["watched"]:
        result.wrong("reduce_gradients all-reduced self.flat, the weights: you averaged the "
                     "weights, not the gradients, so each rank stepped on its own batch's "
                     "gradient", hint="all-reduce flat_grad, the gradients, then "
                     "divide it by N; the weights stay as they are until the optimizer's step")
    for op, label in runs[0]["AdamW"]["unwaited"]:
        result.wrong(f"the {op} {label!r} was issued with async_op=True and never waited: the "
                     f"ranks used its output before the collective had written it",
                     hint="keep the handle it returns and call handle.wait() before the tensor "
                          "is read (or issue it without async_op)")
    init = make_mlp().state_dict()
    for name, ref in reference(rows=rows_for(world_size)).items():
        compare_states(result, name, [r[name]["states"] for r in runs], ref, init)
    run = runs[0]["AdamW"]
    _judge_memory(result, run, stage, world_size)
    _judge_bytes(result, run["sent"], run["expected"]["sent_bytes_per_step"], stage)
    result.facts.update(memory=run["memory"], sent=run["sent"], expected=run["expected"])
    return result.finish()


def _explain_error(message: str, frame) -> str | None:
    """The sentence naming a mistake behind an error a rank raised, or None."""
    sizes = re.search(r"(all_gather|reduce_scatter): the full tensor has (\d+) elements but \d+ "
                      r"shards of (\d+)", message)
    if sizes and sizes[2] == sizes[3]:
        return (f"the {'output of the reduce-scatter' if sizes[1] == 'reduce_scatter' else 'part you all-gather'}"
                f" has the whole buffer's {sizes[2]} elements, not the size of self.shard: "
                + ("each rank gets its 1/N slice of the sum (torch.empty_like(self.shard))"
                   if sizes[1] == "reduce_scatter" else "each rank sends its own slice, "
                   "self.flat[start:stop]"))
    if "created in no_grad mode and is being modified inplace" in message:
        line = frame[1] if frame else ""
        what = ("all-gathers from self.shard, the optimizer's nn.Parameter (it requires grad), "
                if "self.shard" in line else "writes a tensor that requires grad ")
        return (f"after_step {what}into views of self.flat made under no_grad: the lab's training "
                f"loop calls after_step in grad mode, where autograd refuses that in-place write. "
                f"Gather this rank's slice as a plain view of the buffer, self.flat[start:stop] "
                f"(or self.shard.detach())")
    return None


def _judge_memory(result: CheckResult, run: dict, stage: int, n: int) -> None:
    """Adam's state Ψ/N per rank; ZeRO-2 keeps a gradient shard only; the total as the formula."""
    padded, es, mem = run["padded"], run["element_size"], run["memory"]
    optim, grads = mem["optimizer_state"], mem["grads"]
    result.check(abs(optim - 2 * es * padded / n) <= 64,
                 f"optimizer state: {optim} B per rank ≈ 8Ψ/N = {2 * es * padded // n} B (Adam's "
                 f"two moments of this rank's slice only; the few bytes more are Adam's step "
                 f"counter)",
                 f"optimizer state: {optim} B per rank, but 8Ψ/N = {2 * es * padded // n} B" +
                 (": every rank keeps Adam state for the whole model" if optim > es * padded else ""))
    if stage == 1 and grads < es * padded:
        how = ("you reduce-scatter into a new shard: that is ZeRO-2, the next exercise"
               if "reduce_scatter" in run["sent"] else "self.shard.grad is a copy of your slice "
               "(a .clone(), or what `/ N` on the slice returns), so the rest of the average is "
               "freed on return")
        result.wrong(f"gradients kept after the step: {grads} B per rank, this rank's slice only, "
                     f"but ZeRO-1 keeps the whole averaged gradient, 4Ψ = {es * padded} B: {how}",
                     hint="ZeRO-1 shards the optimizer state only. Like DDP, every rank keeps the "
                     "whole averaged gradient (the kit's zero1 accumulates micro-batches in it), "
                     "as the formula 8Ψ + 8Ψ/N counts; keeping only a slice is ZeRO-2's saving. "
                     "Keep the whole average (divide flat_grad itself) and make self.shard.grad "
                     "a view of your slice of it")
        return
    if stage == 2 and grads > es * padded / n:
        view = (": self.shard.grad is a view of flat_grad, which keeps the whole gradient alive"
                if run["grad_was_view"] else "")
        result.wrong(f"gradients kept after the step: {grads} B per rank, but ZeRO-2 keeps only "
                     f"this rank's shard, 4Ψ/N = {es * padded // n} B{view}", hint="reduce-scatter into "
                     "a new tensor the size of the shard (torch.empty_like(self.shard)); a slice "
                     "of a whole gradient buffer keeps the whole buffer alive")
        return
    extra = {c: b for c, b in mem.items() if c not in PERSISTENT and b}
    if sum(extra.values()) > 64:
        # Note: after the step only the model state should be alive: flat_grad is a
        # communication buffer, freed when reduce_gradients returns unless the class keeps it.
        what = ", ".join(f"{b} B of " + ("other tensors" if c == "activations" else
                                        c.replace("_", " ")) for c, b in extra.items())
        result.wrong(f"after the step {what} are still alive on each rank, beyond the model "
                     f"state (4Ψ = {es * padded} B is one whole gradient): your class keeps a "
                     f"reference to flat_grad, or to a copy of it, so it is never freed"
                     + (" and ZeRO-2's saving is lost" if stage == 2 else ""),
                     hint="do not store flat_grad (or a tensor made from it) on self: keep only "
                     "what the formula counts, and let flat_grad be freed when "
                     "reduce_gradients returns")
        return
    state, want = mem["params"] + grads + optim, run["expected"]["persistent_bytes"]
    more = (f" (+{state - want:.0f} B: the buffers padded to a multiple of N, and Adam's step "
            f"counter)" if state > want else "")
    result.check(abs(state - want) <= 64, f"model state per rank: {state} B, the formula says "
                 f"{want:.0f} B{more}", f"model state per rank: {state} B, but the formula says "
                 f"{want:.0f} B")


def _judge_bytes(result: CheckResult, ops: dict, want: float, stage: int) -> None:
    """The bytes of one step, by collective, against the formula; what a difference means."""
    said = ", ".join(f"{op} {b:.0f} B" for op, b in ops.items()) or "nothing"
    if abs(sum(ops.values()) - want) <= 1e-6:
        result.ok(f"bytes sent per rank per step: {said}, as the formula says")
    elif "all_gather" not in ops or not {"all_reduce", "reduce_scatter"} & set(ops):
        if not {"all_reduce", "reduce_scatter"} & set(ops):
            result.wrong(f"bytes sent per rank per step: {said}: the gradients were never averaged "
                         f"over the ranks, so each rank stepped on its own batch's gradient",
                         hint="in reduce_gradients, " + ("all-reduce flat_grad and divide by N"
                              if stage == 1 else "reduce-scatter flat_grad into this rank's shard "
                              "and divide by N"))
        if "all_gather" not in ops:
            result.wrong(f"bytes sent per rank per step: {said}: no all-gather of the parameters",
                         hint="after the step, all-gather every rank's updated slice")
    elif stage == 1 and "reduce_scatter" in ops and "all_reduce" not in ops:
        result.wrong(f"bytes sent per rank per step: {said}: you reduce-scatter, ZeRO-2's move "
                     f"(the next exercise). This ZeRO-1 is your DDP plus a sharded optimizer: "
                     f"all-reduce 2Ψ + all-gather Ψ = {want:.0f} B, which the lab measures next",
                     hint="in reduce_gradients, all-reduce flat_grad as your DDP did, divide it by "
                     "N and keep it whole")
    elif stage == 2 and "all_reduce" in ops:
        result.wrong(f"bytes sent per rank per step: {said}, {sum(ops.values()) / want:.2f}x the "
                     f"ZeRO-2 formula: the gradients were all-reduced (2Ψ)", hint="each rank needs "
                     "only the average of its own slice: a reduce-scatter (Ψ) gives exactly that")
    else:
        result.wrong(f"bytes sent per rank per step: {said}; the formula says {want:.0f} B")


def _check_slices(cls, result: CheckResult) -> bool:
    """Call ``my_slice`` as each rank r of N = 2, 3, 4, in this process (no collective)."""
    module = make_mlp()
    for n in (2, 3, 4):
        fake = object.__new__(cls)
        fake.module, fake.comm, fake.params = module, SimpleNamespace(world_size=n), list(module.parameters())
        fake.layout = FlatLayout([ParamSlot(p, [], []) for p in fake.params], n)
        fake.flat = fake.layout.flatten([p.detach() for p in fake.params])
        numel, padded, got = fake.layout.numel, fake.layout.padded_numel, []
        for fake.comm.rank in range(n):
            try:
                got.append(_as_range(cls.my_slice(fake)))
            except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
                result.wrong(f"my_slice raised {type(e).__name__}: {e} (as rank {fake.comm.rank} "
                             f"of {n})")
                return False
        size = padded // n
        want = [(r * size, (r + 1) * size) for r in range(n)]
        if got == want:
            continue
        owned = torch.zeros(padded, dtype=torch.long)
        for a, b in got:
            owned[max(a, 0):max(min(b, padded), 0)] += 1
        orphans = (owned[:numel] == 0).nonzero().flatten().tolist()
        rank = next(r for r, g in enumerate(got) if g != want[r])
        if all(b - a >= numel for a, b in got):
            result.wrong(f"every rank owns the whole buffer ({got[0]} on each of {n} ranks): every "
                         f"optimizer would keep state for all Ψ elements, not Ψ/N: no memory saved",
                         hint="rank r owns only [r·S, (r+1)·S), S = self.flat.numel() // N")
        elif got[rank] in want:
            result.wrong(f"with {n} ranks, rank {rank} would update elements [{got[rank][0]}, "
                         f"{got[rank][1]}), which are rank {want.index(got[rank])}'s slice",
                         hint="the all-gather puts rank r's part at position r: rank r owns "
                              "[r·S, (r+1)·S)")
        elif [a for a, _ in got] == [a for a, _ in want] and len({b - a for a, b in got}) == 1 \
                and abs(got[0][1] - got[0][0] - size) == 1:
            more = got[0][1] - got[0][0] > size
            shared = [b - 1 for a, b in got[:-1]] if more else [b for a, b in got]
            result.wrong(f"slice end off by one: with {n} ranks your slices are {got}, "
                         f"{size + (1 if more else -1)} elements each, not S = {size}: " +
                         (f"element(s) {shared} are updated by two ranks (the end is inclusive)"
                          if more else f"element(s) {shared} belong to no rank: never updated"),
                         hint="a Python slice excludes its end: [start, stop) holds stop - start "
                              "elements, so stop = start + S")
        elif (owned > 1).any():
            twice = (owned > 1).nonzero().flatten().tolist()
            result.wrong(f"with {n} ranks your slices {got} overlap: element(s) "
                         f"{twice[0]}..{twice[-1]} are updated by more than one rank",
                         hint="rank r owns [r·S, (r+1)·S): the slices must not overlap")
        elif orphans:
            result.wrong(f"padding: with Ψ = {numel} elements on {n} ranks your slices hold "
                         f"{sorted({b - a for a, b in got})} elements, and element(s) "
                         f"{orphans[0]}..{orphans[-1]} belong to no rank: never updated",
                         hint=f"self.flat is padded to {padded} = {n} × {size}: S = "
                              f"self.flat.numel() // N, not the number of parameters // N")
        else:
            result.wrong(f"with {n} ranks your slices are {got}; rank r owns [r·S, (r+1)·S): {want}")
        return False
    return result.ok("my_slice: rank r owns [r·S, (r+1)·S), S = padded Ψ / N (checked for N = "
                     "2, 3, 4 with Ψ = 59, padded to 60)") is not None


def _zero_run(rank, world_size, cls):
    from ...api import expected_costs, parallelize
    out = {}
    for name, factory in OPTIMIZERS.items():
        model, optimizer = parallelize(make_mlp(), cls, optimizer=factory, check_collectives=True)
        model.fsdp_mini.watched = []
        ledger = model.fsdp_mini.comm.ledger
        ledger.next_step()
        tracked = []  # Note: the last step only, as the lab's measurements (section 4) run it
        states = train_states(model, optimizer, rank, world_size, rows_for(world_size), tracked)
        mem = tracked[0]
        out[name] = {"states": states, "expected": expected_costs(model),
                     "unwaited": list(dict.fromkeys((r.op, r.label) for r in ledger.records
                                                    if math.isnan(r.seconds))),
                     "grad_was_view": model.fsdp_mini.grad_was_view,
                     "watched": model.fsdp_mini.watched,
                     "sent": {op: t.sent_bytes for op, t in ledger.totals(step=ledger.step).items()},
                     "memory": next(s.by_category for s in mem.snapshots if s.label == "after_step"),
                     "padded": model.fsdp_mini.padded_numel(),
                     "element_size": model.fsdp_mini.element_size()}
    return out
