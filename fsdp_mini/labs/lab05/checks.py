"""Lab 05: FSDP from scratch: the checkers (the unit's scaffolding is in ``scaffold.py``).

    class MyUnit(labs.FSDPUnit):        # flat buffer, hooks, autograd plumbing: ready made
        def unshard(self): ...          # you write: gather the unit,
        def reshard(self): ...          # free it (storage resize),
        def post_forward(self): ...     # when to free it,
        def pre_backward(self): ...     # when to gather it again
    labs.check_unit(MyUnit)

The checkers train a small net (units ``first`` 4→7 and ``middle`` 7→4; the root holds ``head``
4→3) in this process first (N = 1: what your methods do, and when), then on 2 ranks with SGD +
momentum and AdamW, beside one process and the kit's ``fsdp``. The scaffolding watches your
methods and raises a clear error before anything reads freed memory: reading a view of an
emptied storage crashes the process, it does not raise.
"""

from __future__ import annotations

import re
import traceback

import torch
import torch.distributed as dist
from torch import nn

from ...comm.ledger import ring_bytes
from ..common.checking import (OPTIMIZERS, compare_states, missing_methods, reference, rows_for,
                               run_ranks, train_states, unwritten, where)
from ..common.report import CheckResult
from .scaffold import FSDPScaffold, FSDPUnit

__all__ = ["FSDPScaffold", "FSDPUnit", "UnitNet", "check_reduce_scatter_grad", "check_unit"]


class UnitNet(nn.Module):
    """``first`` (4→7, 35 parameters) and ``middle`` (7→4, 32) are units; the root keeps ``head``
    (4→3, 15). At N = 2, ``first`` and the root need padding."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.first, self.middle, self.head = nn.Linear(4, 7), nn.Linear(7, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.middle(torch.tanh(self.first(x)))))


class _ReduceWith:
    """Mixed into a unit class: ``reduce_grad`` calls a function written in the notebook."""

    def reduce_grad(self, flat_grad):
        return type(self).reduce_fn(flat_grad, self.comm, self.tag("grad"))


def check_unit(unit_cls, world_size: int = 2) -> CheckResult:
    """Exercise 1: each unit freed after forward by storage resize (the root kept), gathered
    again before backward, the right all-gathers; then parity with one process and with the kit's
    ``fsdp`` (gradients reduced the lab-04 way until exercise 2), and the bytes."""
    result = CheckResult(f"your FSDP unit ({getattr(unit_cls, '__name__', unit_cls)})")
    if not (isinstance(unit_cls, type) and issubclass(unit_cls, FSDPUnit)):
        return result.wrong(f"expected a subclass of labs.FSDPUnit, got {unit_cls!r}").finish()
    todo = missing_methods(unit_cls, ("unshard", "reshard", "post_forward", "pre_backward"), FSDPUnit)
    if todo:
        return result.wrong(f"not written yet: {', '.join(todo)}", hint="replace each `...` with "
                            "your code, run the cell, then this check").finish()
    return _check_fsdp(result, unit_cls, world_size)


def check_reduce_scatter_grad(fn, unit_cls, world_size: int = 2) -> CheckResult:
    """Exercise 2, inside ``unit_cls``: each rank gets the average of its own shard, from one
    reduce-scatter (Ψ), not an all-reduce (2Ψ)."""
    result = CheckResult(f"your {getattr(fn, '__name__', 'reduction')}")
    if unwritten(fn):
        return result.wrong("not written yet", hint="replace `...` with your code, run the cell, "
                            "then this check").finish()
    return _check_fsdp(result, type(unit_cls.__name__, (_ReduceWith, unit_cls),
                                    {"reduce_fn": staticmethod(fn)}), world_size, fn)


def _fsdp_run(rank, world_size, unit_cls, kinds=("mine", "kit"), optimizers=tuple(OPTIMIZERS)):
    from ...api import expected_costs, parallelize
    strategy = type("CheckedFSDP", (FSDPScaffold,), {"unit_class": unit_cls})
    out = {}
    for kind in kinds:
        for name in optimizers:
            net = UnitNet()
            net, opt = parallelize(net, strategy if kind == "mine" else "fsdp", units=[net.first,
                                   net.middle], optimizer=OPTIMIZERS[name],
                                   check_collectives=kind == "mine")
            first = net.fsdp_mini.comm.ledger.next_step()
            tracked = [] if kind == "mine" else None   # the last step, as the lab measures it
            states = train_states(net, opt, rank, world_size, rows_for(world_size), tracked)
            records = [r for r in net.fsdp_mini.comm.ledger.records
                       if r.step > first and r.phase != "state_dict"]
            last = max(r.step for r in records)  # Note: step `first` holds the first forward only
            out[kind, name] = {"states": states, "notes": getattr(net.fsdp_mini, "notes", []),
                               "ops": [(r.op, r.payload_bytes, r.sent_bytes) for r in records
                                       if r.step == last], "expected": expected_costs(net)}
            if kind == "mine":
                out[kind, name].update(
                    memory=next(m.by_category for m in tracked[0].snapshots
                                if m.label == "after_step"),
                    grad_views=list(dict.fromkeys(net.fsdp_mini.grad_views)),
                    padded=net.fsdp_mini.padded_numel(), element_size=net.fsdp_mini.element_size())
                out["units"] = {u.name: u.padded_bytes for u in net.fsdp_mini.units}
    return out


def _check_fsdp(result, unit_cls, world_size, reduce_fn=None) -> CheckResult:
    # Note: first in this process at N = 1 (no collective can hang), for what the methods do.
    if dist.is_initialized():
        return result.wrong("run the check from a notebook, outside torch.distributed").finish()
    try:
        _judge_schedule(result, _fsdp_run(0, 1, unit_cls, ("mine",), ("SGD+momentum",)), world_size)
    except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
        result.wrong(f"{type(e).__name__}: {e}" + where(traceback.format_exc()))
    if not result.passed or (runs := run_ranks(result, _fsdp_run, world_size, unit_cls,
                                               explain=_explain_error)) is None:
        return result.finish()
    reduced = any(op in ("all_reduce", "reduce_scatter") for op, _, _ in runs[0]["mine", "AdamW"]["ops"])
    init = UnitNet().state_dict()
    for name, ref in reference(UnitNet, rows_for(world_size)).items():
        states = [r["mine", name]["states"] for r in runs]
        if compare_states(result, name, states, ref, init, guess=reduced):
            kit = runs[0]["kit", name]["states"][-1]
            diff = max((states[0][-1][k] - v).abs().max().item() for k, v in kit.items())
            result.check(diff < 1e-5, f"{name}: the same weights as the kit's fsdp (largest "
                         f"difference {diff:.1e})", f"{name}: differs from the kit's fsdp by {diff:.2g}")
    _judge_memory(result, runs[0]["mine", "AdamW"], world_size)
    mine = runs[0]["mine", "SGD+momentum"]
    ops = {}
    for op, _, sent in mine["ops"]:
        ops[op] = ops.get(op, 0.0) + sent
    said, want = ", ".join(f"{op} {b:.0f} B" for op, b in ops.items()), mine["expected"]
    if reduce_fn is not None and not {"all_reduce", "reduce_scatter"} & set(ops):
        result.wrong(f"bytes sent per rank per step: {said}: the gradients were never averaged over "
                     f"the ranks, so each rank stepped on its own batch's gradient",
                     hint="reduce-scatter flat_grad into a new tensor of this rank's shard, then "
                          "divide it by N")
    elif reduce_fn is not None and "all_reduce" in ops:
        result.wrong(f"bytes sent per rank per step: {said}: the gradient was all-reduced (2Ψ)",
                     hint="each rank keeps only its shard: one reduce-scatter (Ψ) gives just that")
    else:
        result.check(abs(sum(ops.values()) - want["sent_bytes_per_step"]) <= 1e-6,
                     f"bytes sent per rank per step: {said}, as the formula says", f"bytes sent "
                     f"per rank per step: {said}; the formula says {want['sent_bytes_per_step']:.0f} B")
    result.facts.update(sent=ops, expected=want, units=runs[0]["units"])
    return result.finish()


def _explain_error(message: str, frame) -> str | None:
    """The sentence naming a mistake behind an error a rank raised, or None."""
    sizes = re.search(r"reduce_scatter: the full tensor has (\d+) elements but \d+ shards of (\d+)",
                      message)
    if sizes and sizes[1] == sizes[2]:
        return (f"the output of the reduce-scatter has the whole unit's {sizes[1]} elements, not "
                f"flat_grad.numel() // N: each rank gets only its 1/N slice of the sum")
    return None


def _judge_memory(result, run: dict, n: int) -> None:
    """After the step: a gradient shard only (4Ψ/N), and the model state of the formula, 16Ψ/N."""
    mem, es, padded = run["memory"], run["element_size"], run["padded"]
    grads, want_grads = mem["grads"], es * padded / n
    if run["grad_views"] or grads > want_grads + 64:
        units = ", ".join(repr(u) for u, _ in run["grad_views"])
        why = (f": the shard returned for unit(s) {units} is a slice (a view) of flat_grad, and a "
               f"view keeps the unit's whole gradient alive" if units else "")
        result.wrong(f"gradients kept after the step: {grads} B per rank, but FSDP keeps only this "
                     f"rank's shard, 4Ψ/N = {want_grads:.0f} B{why}", hint="return a new tensor "
                     "of flat_grad.numel() // N elements (reduce-scatter into torch.empty(...)), "
                     "so flat_grad is freed when the unit's backward is done")
        return
    state = mem["params"] + grads + mem["optimizer_state"]
    want = run["expected"]["persistent_bytes"]
    result.check(abs(state - want) <= 64 * 3, f"model state per rank after the step: {state} B, "
                 f"the formula 16Ψ/N says {want:.0f} B", f"model state per rank after the step: "
                 f"{state} B, but the formula 16Ψ/N says {want:.0f} B")


def _judge_schedule(result, probe: dict, world_size: int) -> None:
    """What the unit's methods did in one process: freed, kept, gathered how often."""
    mine, units = probe["mine", "SGD+momentum"], probe["units"]  # at N = 1: no padding
    root = -(-units["root"] // (4 * world_size)) * world_size * 4  # float32, padded at N
    extra = ring_bytes("all_gather", root, world_size)
    for kind, unit, nbytes in dict.fromkeys(mine["notes"]):
        if kind == "root_freed":
            result.wrong(f"the root was freed after forward and all-gathered again before backward:"
                         f" {extra:.0f} B more sent per rank per step at N = {world_size}, for "
                         f"nothing (its backward starts right after the forward)",
                         hint="in post_forward, reshard only when not self.is_root")
        elif kind == "kept":
            result.wrong(f"unit {unit!r} was still gathered after its forward ({nbytes} B): "
                         f"post_forward must free every unit but the root")
        else:
            result.wrong(f"unit {unit!r}: its gathered parameters ({nbytes} B) were still alive "
                         f"after reshard. You dropped the tensor (del, or a new tensor), but "
                         f"autograd holds it for backward (the weights it saved are views of it), "
                         f"so nothing was freed", hint="free the storage itself: "
                         "self.full.untyped_storage().resize_(0); the tensor and autograd's views "
                         "stay valid, and unshard refills the same storage")
    gathers = [payload for op, payload, _ in mine["ops"] if op == "all_gather"]
    if mine["notes"]:
        return
    if gathers.count(units["root"]) > 1:
        result.wrong(f"your unshard all-gathered the root again before backward, though it was "
                     f"still gathered: {extra:.0f} B more per rank per step at N = {world_size}",
                     hint="return at once when self.is_gathered")
    else:
        result.check(all(gathers.count(b) == 1 + (u != "root") for u, b in units.items()),
                     "every unit but the root freed after its forward (storage resized to 0), "
                     "gathered again before its backward; the root gathered once per step",
                     f"all-gathers in one step, by unit size: {sorted(gathers)}; expected each "
                     f"unit twice (forward, backward) and the root once")
