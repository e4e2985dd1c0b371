"""Lab 05's scaffolding: the kit's own FSDP (:mod:`fsdp_mini.fsdp`: flat groups, ``_Unflatten``,
the end-of-backward callback), its units gathered and freed by the learner's ``FSDPUnit``. What
those methods leave is checked before anything reads it, with a clear error: reading a view of
an emptied storage crashes the process, it does not raise."""

from __future__ import annotations

import torch

from ...comm.collectives import Tag
from ...fsdp.algorithm import FSDP, TrainingState, Unit


class FSDPUnit:
    """One unit: its parameters in one flat buffer padded to a multiple of N, sharded over ranks.
    Ready made: ``self.shard`` (this rank's 1/N; the optimizer updates it), ``self.full`` (a 1-D
    tensor of ``self.padded_numel`` elements whose *storage* is empty until you gather into it),
    ``self.comm``, ``self.is_root``, ``self.is_gathered``, ``self.numel`` (parameters, no
    padding) and ``self.tag()`` (a ledger label). Yours: ``unshard`` (called before forward),
    ``reshard``, ``post_forward`` (free the unit, but not the root) and ``pre_backward`` (gather
    it again). After its backward: ``reshard()``, then ``reduce_grad(flat_grad)`` (exercise 2).
    Example, N = 2, a unit of 5 parameters: ``full = [a b c d e 0]``, rank 0's shard ``[a b c]``.
    """

    def __init__(self, unit: "_Driven"):
        group = unit.group
        self._unit, self.name, self.phase, self._pending = unit, unit.name, "forward", []
        self.shard, self.full, self.comm = group.shard, group.gathered(), _Roomy(unit, self)
        self.numel, self.padded_numel = group.layout.numel, group.layout.padded_numel
        group._storage.resize_(0)  # Note: set_ (in gathered) gave the storage room: empty again

    is_root = property(lambda self: self._unit is self._unit.fsdp.root)
    is_gathered = property(lambda self: _bytes(getattr(self, "full", None)) > 0)

    def tag(self, phase: str | None = None) -> Tag:
        """A ledger label: this unit, and the phase (``forward``, ``backward``, ``grad``)."""
        return Tag(self.name, phase or self.phase)

    def reduce_grad(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """A stand-in (2Ψ): all-reduce, then keep a copy of this rank's slice of the average."""
        self.comm.all_reduce(flat_grad, label=self.tag("grad"))
        size = flat_grad.numel() // self.comm.world_size
        return flat_grad[self.comm.rank * size:][:size] / self.comm.world_size

    def unshard(self) -> None: ...  # yours, and the three below

    def reshard(self) -> None: ...

    def post_forward(self) -> None: ...

    def pre_backward(self) -> None: ...

    def _waited(self, where: str) -> None:
        if left := [h for h in self._pending if not h.done]:
            raise RuntimeError(f"unit {self.name!r}: your {left[0]._record.op} was issued with "
                               f"async_op=True and never waited ({where}): its output would be "
                               f"read before the collective wrote it. Call .wait() on the handle")
        self._pending = []


def _bytes(t) -> int:
    return t.untyped_storage().nbytes() if isinstance(t, torch.Tensor) else 0


class _Driven(Unit):
    """The engine's unit, gathered and freed by the learner's ``FSDPUnit`` (``self.mine``)."""

    def __init__(self, fsdp, module, name, slots, reshard_after_forward):
        super().__init__(fsdp, module, name, slots, reshard_after_forward)
        (self.group,) = self.groups  # Note: every parameter is trainable (FSDPScaffold checks)
        self.mine = fsdp.unit_class(self)

    def pre_forward(self, module, args):
        mine, padded = self.mine, self.group.layout.padded_numel
        mine.phase = "forward"
        mine.unshard()
        mine._waited("in unshard, before the forward")
        full = getattr(mine, "full", None)
        if _bytes(full) < self.padded_bytes or full.numel() != padded:
            raise RuntimeError(f"unit {self.name!r}: after unshard, self.full must hold the unit's "
                               f"{padded} elements, but " + (_room(full, mine.numel) if _bytes(
                                   full) else "its storage is empty (or it is gone)"))
        self.group._storage = full.untyped_storage()  # the buffer this forward reads
        return super().pre_forward(module, args)  # Note: gathered already: the engine only points

    def post_forward(self, module, args, output) -> None:
        keep, self.reshard_after_forward = self.reshard_after_forward, False
        try:  # Note: the engine hooks the backward and frees nothing; your post_forward decides
            super().post_forward(module, args, output)
        finally:
            self.reshard_after_forward = keep
        if self.state is TrainingState.WAITING_FOR_BACKWARD:
            self.mine.post_forward()
            self.group.point_modules_at(self.group.pieces.params)
            self.fsdp.note("after_forward", self, {"bytes still gathered": self._left(),
                                                   "self.is_gathered": self.mine.is_gathered})
            self.fsdp.mark(self.name, "resharded")

    def pre_backward(self, grad) -> None:
        if self.state is TrainingState.WAITING_FOR_BACKWARD:
            self.mine.phase = "backward"
            self.mine.pre_backward()
            self.mine._waited("in pre_backward, before the backward")
            full = getattr(self.mine, "full", None)
            if self._left() < self.padded_bytes:  # Note: backward would read freed memory
                raise RuntimeError(f"unit {self.name!r}: autograd saved views of the buffer "
                                   f"gathered in forward, and its storage is now empty. " + (
                    "You gathered again into a new tensor, which those views do not see: "
                    "resize the same storage back and all-gather into self.full." if _bytes(full)
                    else "Backward needs those parameters: gather it again in pre_backward."))
            self.fsdp.mark(self.name, "gathered")  # a dashboard samples memory at the marks
        super().pre_backward(grad)  # Note: gathered already: the engine only points at the views

    def backward_done(self) -> None:
        super().backward_done()  # Note: calls reshard below, once the unit's backward is over
        self.fsdp.note("after_backward", self, self._left())

    def reshard(self) -> None:
        if self.mine.is_gathered:
            self.mine.reshard()
        self.group.point_modules_at(self.group.pieces.params)  # outside forward: the pieces

    def _left(self) -> int:
        return self.group._storage.nbytes()  # the bytes of the buffer the last forward read


class _Roomy:
    """The kit's comm; it checks an output has room (writing past a storage corrupts memory)."""

    def __init__(self, unit, mine):
        self._comm, self._mine = unit.fsdp.comm, mine

    def __getattr__(self, op):
        if op not in ("all_gather", "reduce_scatter"):
            return getattr(self._comm, op)

        def run(t, other, label, async_op=False):
            if _bytes(t) < (t.storage_offset() + t.numel()) * t.element_size():
                raise RuntimeError(f"{op} into a tensor of {t.numel()} elements, but " + _room(
                    t, self._mine.numel if t.numel() == self._mine.padded_numel else None))
            handle = getattr(self._comm, op)(t, other, label, async_op)
            self._mine._pending += [handle] if handle is not None else []
            return handle
        return run


def _room(t: torch.Tensor, unpadded: int | None) -> str:
    es, numel = t.element_size(), t.numel()
    nbytes = _bytes(t) - t.storage_offset() * es
    return (f"its storage has {max(nbytes, 0)} B, room for {max(nbytes, 0) // es} elements of "
            f"{es} B. Hint: resize_ takes a number of bytes; the buffer is padded to {numel} "
            f"elements, a multiple of N" + (f" (the unit has {unpadded} parameters)" * bool(
                unpadded)) + ": size the storage for all of them")


class FSDPScaffold(FSDP):
    """A strategy of ``unit_class`` units: the ``units`` you list, plus the root for the rest."""

    strategy, traffic, unit_type, unit_class = "my_fsdp", "≈ 3Ψ", _Driven, FSDPUnit

    def __init__(self, module, comm, recorder=None, units=()):
        if not all(p.requires_grad for p in module.parameters()):
            raise ValueError(f"{self.strategy}: every parameter must be trainable")
        self.notes, self.step = [], 0  # what the scaffolding saw, for the checker
        super().__init__(module, comm, recorder, units=units)

    def note(self, what: str, unit: _Driven, value) -> None:
        self.notes.append((self.step, what, unit.name, value))

    def reduce_scatter_grad(self, group, flat_grad, absent) -> None:
        """The unit's backward is over: your ``reduce_grad`` gives this rank's gradient shard."""
        unit = next(u for u in self.units if u.group is group)
        before = len(self.comm.ledger.records)
        grad = unit.mine.reduce_grad(flat_grad)
        self.note("grad_labels", unit, ", ".join(sorted({  # Note: the ledger names each unit's
            r.label for r in self.comm.ledger.records[before:]})) or "none")  # reduction
        unit.mine._waited("in the gradient's reduction, before its shard is used")
        if not isinstance(grad, torch.Tensor) or grad.numel() != group.shard.numel():
            raise RuntimeError(f"unit {unit.name!r}: the gradient reduction returned "
                               f"{getattr(grad, 'shape', grad)}: return this rank's averaged "
                               f"shard, a tensor of {group.shard.numel()} elements")
        kept = grad.untyped_storage()._cdata
        self.note("grad_shard", unit, {
            "a view of flat_grad": kept == flat_grad.untyped_storage()._cdata,
            "shares its storage with": ", ".join(u.name for u in self.units if any(
                g.untyped_storage()._cdata == kept for g in u.group.pieces.grads())) or "none"})
        group.pieces.add_grads(grad.reshape(-1), absent)
