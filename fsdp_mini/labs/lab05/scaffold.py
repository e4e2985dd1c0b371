"""The scaffolding of lab 05: a unit with its flat buffer, hooks and autograd plumbing ready
made, so the learner writes only when and how it is gathered and freed (``FSDPUnit``), and the
strategy that builds such units over a model (``FSDPScaffold``).

The scaffolding watches the learner's methods and raises a clear error before anything reads
freed memory: reading a view of an emptied storage crashes the process, it does not raise.
"""

from __future__ import annotations

import weakref

import torch
from torch.autograd import Variable
from torch.utils._pytree import tree_leaves

from ...buffers.flat import FlatLayout, ShardPieces
from ...comm.collectives import Tag, broadcast_module_states
from ...comm.ledger import ring_bytes
from ...fsdp.units import assign_slots, check_units
from ...memory import allocating
from ...strategy import Strategy
from ...theory import UnitSize, fsdp_sent_bytes


class FSDPUnit:
    """One unit: its parameters in one flat buffer padded to a multiple of N, sharded over ranks.

    Ready made: ``self.shard`` (this rank's 1/N; the optimizer updates it, one piece per
    parameter), ``self.full`` (a 1-D tensor of ``self.padded_numel`` elements whose *storage* is
    empty until you gather into it), ``self.comm``, ``self.is_root``, ``self.is_gathered``,
    ``self.numel`` (parameters, no padding) and ``self.tag()`` (a ledger label). One step::

        pre_forward    unshard()                          given
        post_forward   reshard(), except the root         yours
        pre_backward   unshard() again                    yours
        post_backward  reshard(); reduce_grad(flat_grad)  given (reduce_grad: exercise 2)

    Example, N = 2, a unit of 5 parameters: ``full = [a b c d e 0]``, rank 0's shard ``[a b c]``.
    """

    def __init__(self, fsdp, module, name, slots, is_root):
        self.fsdp, self.comm, self.name, self.is_root = fsdp, _Roomy(fsdp.comm, self), name, is_root
        self.layout = FlatLayout(slots, self.comm.world_size)
        self.numel, self.padded_numel = self.layout.numel, self.layout.padded_numel
        with torch.no_grad():
            values = self.layout.flatten([s.param.detach() for s in slots])
        for slot in slots:  # the whole parameters are freed: only the shard stays
            slot.param.data, slot.param = values.new_empty(0), None
        start = self.comm.rank * self.layout.shard_numel
        with allocating("params"):
            self.shard = values[start:start + self.layout.shard_numel].clone()
        self.pieces = ShardPieces(self.layout, self.shard, self.comm.rank)
        with allocating("gathered_params"):
            self.full = torch.empty_like(values)
        self.full.untyped_storage().resize_(0)
        self.phase, self._saved, self._in_backward = "forward", None, False
        self._pending = []  # handles of collectives the learner issued with async_op=True
        self._point_at(self.pieces.params)
        module.register_forward_pre_hook(self._pre_forward)
        module.register_forward_hook(self._post_forward)

    @property
    def is_gathered(self) -> bool:
        return getattr(self, "full", None) is not None and self.full.untyped_storage().nbytes() > 0

    @property
    def padded_bytes(self) -> int:
        return self.padded_numel * self.shard.element_size()

    def tag(self, phase: str | None = None) -> Tag:
        """A ledger label: this unit, and the phase (``forward``, ``backward``, ``grad``)."""
        return Tag(self.name, phase or self.phase)

    def pre_forward(self) -> None:
        self.unshard()

    def post_backward(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """The unit's backward is over: free it; return this rank's averaged gradient shard."""
        self.reshard()
        return self.reduce_grad(flat_grad)

    def reduce_grad(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """A stand-in (2Ψ): all-reduce, then keep a copy of this rank's slice of the average (4Ψ/N)."""
        self.comm.all_reduce(flat_grad, label=self.tag("grad"))
        size = self.layout.shard_numel
        return flat_grad[self.comm.rank * size:][:size] / self.comm.world_size

    def unshard(self) -> None:
        raise NotImplementedError("write unshard in your subclass")

    def reshard(self) -> None:
        raise NotImplementedError("write reshard in your subclass")

    def post_forward(self) -> None:
        raise NotImplementedError("write post_forward in your subclass")

    def pre_backward(self) -> None:
        raise NotImplementedError("write pre_backward in your subclass")

    # -- the scaffolding: hooks that call the schedule above, and check what it did -------------

    def _point_at(self, tensors) -> None:
        for slot, t in zip(self.layout.slots, tensors):
            for module, attr in slot.owners:
                module._parameters[attr] = t  # Note: a view is no nn.Parameter; setattr refuses

    def _check_waited(self, where: str) -> None:
        """Raise before anything reads a collective's output that was never waited for."""
        left = [h for h in self._pending if not h.done]
        self._pending.clear()
        if left:
            r = left[0]._record
            raise RuntimeError(f"unit {self.name!r}: your {r.op} was issued with async_op=True "
                               f"and never waited ({where}): its output would be read before the "
                               f"collective wrote it. Call .wait() on the handle it returns (or "
                               f"issue it without async_op)")

    def _pre_forward(self, module, args) -> None:
        self.phase = "forward"
        self.pre_forward()
        self._check_waited("in unshard, before the forward")
        full = getattr(self, "full", None)
        if full is None or full.numel() != self.padded_numel:
            raise RuntimeError(f"unit {self.name!r}: after unshard, self.full must still be the "
                               f"scaffold's tensor of {self.padded_numel} elements: gather into it")
        if full.untyped_storage().nbytes() < self.padded_bytes:
            raise RuntimeError(f"unit {self.name!r}: after unshard, self.full holds "
                               f"{full.numel()} elements but " + _room_problem(full, self.numel))
        self._saved = weakref.ref(full.untyped_storage())
        # Note: a fresh tensor over the same storage, with its own version counter: the
        # all-gather before backward writes into self.full, which autograd must not take for an
        # in-place change of the views it saved.
        leaf = full.new_empty(0).set_(full.untyped_storage(), 0, full.shape)
        grad = torch.is_grad_enabled()
        self._point_at(_Unflatten.apply(leaf.requires_grad_(), self) if grad
                       else self.layout.views(leaf))
        self.fsdp.mark(self.name, "gathered")

    def _post_forward(self, module, args, output) -> None:
        outputs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        self._point_at(self.pieces.params)  # outside forward a weight is this rank's piece
        if not (torch.is_grad_enabled() and outputs):
            self.reshard()  # no backward will come (evaluation)
        else:
            for t in outputs:
                t.register_hook(self._pre_backward)
            self.post_forward()
            saved = self._saved()
            left = 0 if saved is None else saved.nbytes()
            same = left and self.is_gathered and self.full.untyped_storage()._cdata == saved._cdata
            if self.is_root and not left:
                self.fsdp.notes.append(("root_freed", self.name, 0))
            elif left and not self.is_root:
                self.fsdp.notes.append(("kept" if same else "dropped", self.name, left))
        self.fsdp.mark(self.name, "forward_done")

    def _pre_backward(self, grad) -> None:
        if self._in_backward:
            return
        self._in_backward, self.phase = True, "backward"
        self.fsdp.queue_backward_end()
        self.pre_backward()
        self._check_waited("in pre_backward, before the backward")
        saved = self._saved()
        if saved is not None and saved.nbytes() < self.padded_bytes:
            elsewhere = self.is_gathered and self.full.untyped_storage()._cdata != saved._cdata
            raise RuntimeError(
                f"unit {self.name!r}: autograd saved views of the buffer gathered in forward, and "
                f"its storage is now empty. " + (
                    "You gathered again into a new tensor, which those views do not see: backward "
                    "would read freed memory. Resize the same storage back "
                    "(self.full.untyped_storage().resize_(...)) and all-gather into self.full."
                    if elsewhere else "Backward needs those parameters: gather the unit again in "
                    "pre_backward (unshard)."))
        self.fsdp.mark(self.name, "gathered")

    def _post_backward(self, flat_grad) -> None:
        grad = self.post_backward(flat_grad)
        self._check_waited("in the gradient's reduction, before its shard is used")
        if grad is None:
            raise RuntimeError(f"unit {self.name!r}: the gradient reduction returned nothing "
                               f"(None): return this rank's averaged shard, a tensor of "
                               f"{self.shard.numel()} elements")
        if not isinstance(grad, torch.Tensor) or grad.numel() != self.shard.numel():
            raise RuntimeError(f"unit {self.name!r}: the gradient shard should have "
                               f"{self.shard.numel()} elements (padded_numel / N), got "
                               f"{getattr(grad, 'shape', type(grad).__name__)}")
        if grad.untyped_storage().data_ptr() == flat_grad.untyped_storage().data_ptr():
            # Note: a view of the unit's whole gradient; it keeps all of it alive (for the checker)
            self.fsdp.grad_views.append((self.name, flat_grad.numel() * flat_grad.element_size()))
        self.pieces.add_grads(grad.reshape(-1), [])
        self.fsdp.mark(self.name, "backward_done")


class _Roomy:
    """The kit's comm; it checks an output has room (writing past a storage corrupts memory)."""

    def __init__(self, comm, unit):
        self._comm, self._unit = comm, unit

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def all_gather(self, output, shard, label, async_op=False):
        self._check_room(output, "all_gather")
        return self._kept(self._comm.all_gather(output, shard, label, async_op))

    def reduce_scatter(self, output, full, label, async_op=False):
        self._check_room(output, "reduce_scatter")
        return self._kept(self._comm.reduce_scatter(output, full, label, async_op))

    def _kept(self, handle):
        if handle is not None:  # async_op=True: the scaffold checks it is waited for
            self._unit._pending.append(handle)
        return handle

    def _check_room(self, t: torch.Tensor, op: str) -> None:
        if t.untyped_storage().nbytes() < (t.storage_offset() + t.numel()) * t.element_size():
            unpadded = self._unit.numel if t.numel() == self._unit.padded_numel else None
            raise RuntimeError(f"{op} into a tensor of {t.numel()} elements, but "
                               + _room_problem(t, unpadded))


def _room_problem(t: torch.Tensor, unpadded: int | None = None) -> str:
    """Why ``t``'s storage is too small, with a hint (not the code): bytes sized in elements
    (36 B for 36 float32), the padding left out (room for 35 of 36), or anything else."""
    es, numel = t.element_size(), t.numel()
    room = (nbytes := t.untyped_storage().nbytes() - t.storage_offset() * es) // es
    if es > 1 and nbytes in (numel, unpadded):
        return (f"its storage has {nbytes} B, room for {room} elements of {es} B: resize_ takes "
                f"a number of bytes, not of elements. Hint: how many bytes is one element?")
    if room == unpadded:
        return (f"its storage has room for {room} elements, the unit's parameters without the "
                f"padding. Hint: the buffer is padded to {numel} elements, a multiple of N (every "
                f"rank's shard the same size): size the storage for all of them")
    return f"its storage has room for {max(room, 0)} of them. Hint: size it for all, in bytes"


class _Unflatten(torch.autograd.Function):
    """Forward: the gathered flat buffer -> one view per parameter. Backward, once every view has
    its gradient (the unit's backward is over): one flat gradient -> ``_post_backward``."""

    @staticmethod
    def forward(ctx, flat, unit):
        ctx.set_materialize_grads(False)
        ctx.unit, ctx.like = unit, flat.new_empty(0)
        return tuple(unit.layout.views(flat))

    @staticmethod
    def backward(ctx, *grads):
        with allocating("comm_buffers"):
            flat = ctx.like.new_zeros(ctx.unit.padded_numel)
        for g, view in zip(grads, ctx.unit.layout.views(flat)):
            if g is not None:
                view.copy_(g)
        ctx.unit._post_backward(flat)
        return None, None


class FSDPScaffold(Strategy):
    """A strategy of ``unit_class`` units: the ``units`` you list, plus the root for the rest."""

    strategy, sharded, traffic = "my_fsdp", ("params", "grads", "optim"), "≈ 3Ψ"
    unit_class = FSDPUnit

    def __init__(self, module, comm, recorder=None, units=()):
        super().__init__(module, comm, recorder)
        if not all(p.requires_grad for p in module.parameters()):
            raise ValueError(f"{self.strategy}: every parameter must be trainable")
        self.state_dict_keys = list(module.state_dict())
        broadcast_module_states(module, comm)
        names = check_units(module, list(units))
        slots = assign_slots(module, names)
        self.notes: list[tuple] = []  # what the scaffolding saw your methods do, for the checker
        self.grad_views: list[tuple] = []  # units whose gradient shard was a view of flat_grad
        self._queued = False
        self.units = [self.unit_class(self, m, names.get(id(m), "root"), slots[id(m)], m is module)
                      for m in list(units) + [module]]

    def queue_backward_end(self) -> None:
        if not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._backward_end)

    def _backward_end(self) -> None:
        for unit in self.units:
            if unit.is_gathered:
                unit.reshard()
            unit._in_backward = False
        self._queued = False
        self.mark("", "backward_end")

    def optimizer_params(self):
        return [p for u in self.units for p in u.pieces.params]

    def grads_for_norm(self):
        return [g for u in self.units for g in u.pieces.grads()], True

    def memory_categories(self):
        return {"params": [u.shard for u in self.units],
                "gathered_params": [getattr(u, "full", None) for u in self.units],
                "grads": [g for u in self.units for g in u.pieces.grads()]}

    def full_state_dict(self):
        out = {k: b.detach().clone() for k, b in self.module.named_buffers()}
        for u in self.units:
            full = u.shard.new_empty(u.padded_numel)
            self.comm.all_gather(full, u.shard, label=u.tag("state_dict"))
            for slot, view in zip(u.layout.slots, u.layout.views(full)):
                out.update({name: view.clone() for name in slot.names})
        return {k: out[k] for k in self.state_dict_keys}

    def numel(self):
        return sum(u.numel for u in self.units), 0

    def padded_numel(self):
        return sum(u.padded_numel for u in self.units)

    def element_size(self):
        return self.units[0].shard.element_size()

    def sent_bytes_per_step(self):
        n, es = self.comm.world_size, self.element_size()
        sizes = [UnitSize(u.padded_numel, 0, not u.is_root) for u in self.units]
        if self.unit_class.reduce_grad is not FSDPUnit.reduce_grad:
            return fsdp_sent_bytes(sizes, n, es)
        return (ring_bytes("all_reduce", self.padded_numel() * es, n) + sum(
            ring_bytes("all_gather", u.trainable * es, n) * (1 + u.gathered_in_backward) for u in sizes))
