"""FSDP (ZeRO-3): shard parameters, gradients and optimizer state; gather a unit only to use it.

The model is cut into *units* (e.g. every transformer block, plus the root for what is left).
Each unit's parameters are laid end to end in one padded flat buffer (:mod:`fsdp_mini.flat`)
and every rank keeps only its 1/N *shard* of it. A unit is whole only while it computes:

    forward   unshard (all-gather)  ->  run the unit  ->  reshard (free the gathered buffer)
    backward  unshard (all-gather)  ->  run its backward  ->  reduce-scatter the gradient,
              reshard; each rank keeps the averaged gradient of its own shard
    step      the optimizer updates the shards only: nothing else to do

Example, N = 2, a unit with 4 parameters w, of which rank 0 keeps w[0:2] and rank 1 w[2:4]::

    idle             rank0 [w0 w1]              rank1 [w2 w3]            shards only
    unshard          rank0 [w0 w1 w2 w3]        rank1 [w0 w1 w2 w3]      all-gather
    backward         rank0 grad [a0 a1 a2 a3]   rank1 grad [b0 b1 b2 b3] from each local batch
    reduce-scatter   rank0 [(a0+b0)/2 (a1+b1)/2]  rank1 [(a2+b2)/2 (a3+b3)/2]
    reshard          rank0 [w0 w1] + grad shard   rank1 [w2 w3] + grad shard

Outside forward and backward, ``model.c.weight`` is this rank's *piece* of that weight: a 1-D
``nn.Parameter`` over the shard (possibly empty), which the optimizer updates and which
``model.zero_grad()``, ``requires_grad_()`` and ``print(model)`` see as usual. Inside a unit's
forward it is the whole weight, a view of the gathered buffer. To read whole weights outside,
use :func:`fsdp_mini.summon_full_params`.

Memory per rank (fp32, Adam): (4Ψ + 4Ψ + 8Ψ)/N plus the gathered unit(s) and the activations,
which no ZeRO stage shards. Traffic per step: all-gather Ψ (forward) + all-gather Ψ (backward,
for units freed after forward) + reduce-scatter Ψ = 3(N-1)/N x 4Ψ bytes per rank, 1.5x DDP.
``reshard_after_forward=False`` keeps units gathered from forward to backward: 2Ψ like DDP, more
memory. The root unit is never freed after forward: backward needs it again at once.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import nn
from torch.autograd import Variable
from torch.utils._pytree import tree_leaves

from .clip import GradWatch
from .comm import Comm, Reduction, Tag, broadcast_module_states
from .flat import FlatLayout, ParamSlot, ShardPieces
from .fsdp_units import assign_slots, check_units
from .fsdp_whole import WholeView
from .memory import allocating
from .strategy import Strategy


class TrainingState(Enum):
    """Where a unit is in the training step (FSDP2 calls this ``TrainingState`` too)."""

    IDLE = "idle"                          # between steps (or after a forward without grad)
    FORWARD = "forward"                    # its forward is running
    WAITING_FOR_BACKWARD = "waiting"       # forward done with grad; its backward is to come
    BACKWARD = "backward"                  # its backward is running


class FlatGroup:
    """One flat group of a unit's parameters: this rank's shard, and room for the whole group.

    The gathered buffer is one storage that is resized to full size by ``unshard`` and to zero by
    ``reshard``. Note: resizing the *storage* (rather than dropping the tensor) is what lets
    autograd keep the views it saved for backward; they become valid again at the next unshard.
    """

    def __init__(self, slots: list[ParamSlot], comm: Comm, label: str, trainable: bool):
        kinds = {(s.param.dtype, s.param.device) for s in slots}
        if len(kinds) > 1:
            raise ValueError(f"unit {label!r} mixes parameter dtypes/devices {sorted(map(str, kinds))}"
                             f"; one flat buffer needs one kind: move or cast the model first, or "
                             f"put the odd modules in a unit of their own")
        self.layout, self.comm, self.label = FlatLayout(slots, comm.world_size), comm, label
        self.trainable = trainable
        with torch.no_grad():
            full = self.layout.flatten([s.param.detach() for s in slots])
        for slot in slots:  # the original, full parameters are freed: only the shard stays
            slot.param.data = torch.empty(0, dtype=full.dtype, device=full.device)
            slot.param = None
        start, end = self.layout.shard_range(comm.rank)
        with allocating("params"):
            self.shard = full[start:end].clone()
        self.pieces = ShardPieces(self.layout, self.shard, comm.rank)
        with allocating("gathered_params"):
            self._storage = torch.empty_like(full).untyped_storage()
        self._full_nbytes = self._storage.nbytes()
        self._storage.resize_(0)

    @property
    def is_gathered(self) -> bool:
        return self._storage.nbytes() > 0

    def gathered(self) -> torch.Tensor:
        # A fresh tensor over the shared storage, with its own autograd version counter.
        empty = torch.empty(0, dtype=self.shard.dtype, device=self.shard.device)
        return empty.set_(self._storage, 0, (self.layout.padded_numel,))

    def unshard(self, phase: str, force: bool = False) -> None:
        if self.is_gathered and not force:
            return
        self._storage.resize_(self._full_nbytes)
        self.comm.all_gather(self.gathered(), self.shard, label=Tag(self.label, phase))

    def reshard(self) -> None:
        self._storage.resize_(0)
        self.point_modules_at(self.pieces.params)

    def point_modules_at(self, tensors) -> None:
        """Make each module attribute of the group (``block.mlp.weight``...) refer to ``tensors``.

        Note: written into ``_parameters`` directly: during forward the attribute is a view of
        the gathered buffer, which is not an ``nn.Parameter`` and which ``setattr`` would refuse.
        """
        for slot, t in zip(self.layout.slots, tensors):
            for module, attr in slot.owners:
                module._parameters[attr] = t

    def use_in_forward(self, unit: "Unit") -> None:
        """Point the modules' attributes at views of the gathered buffer for this forward.

        With grad enabled the views come out of one leaf tensor through :class:`_Unflatten`:
        once the unit's backward is over, autograd hands its gradient, as one flat tensor, to
        :meth:`BackwardCall.reduce_scatter`. A piece frozen since ``parallelize`` gets a
        detached view, so no gradient is made for it.
        """
        full = self.gathered()
        frozen = [not p.requires_grad for p in self.pieces.params]
        if self.trainable and torch.is_grad_enabled() and not all(frozen):
            full.requires_grad_(True)
            call = BackwardCall(unit, self)
            full.register_post_accumulate_grad_hook(call.reduce_scatter)
            views = [v.detach() if f else v
                     for v, f in zip(_Unflatten.apply(full, self.layout, call), frozen)]
            unit.backwards_to_come += 1
        else:
            views = self.layout.views(full)
        self.point_modules_at(views)


class BackwardCall:
    """One forward of a unit's trainable group with grad, seen from its backward."""

    def __init__(self, unit: "Unit", group: FlatGroup):
        self.unit, self.group, self.absent = unit, group, []

    def reduce_scatter(self, leaf: torch.Tensor) -> None:
        """The unit's flat gradient is complete: reduce-scatter it; each rank keeps its shard."""
        flat_grad, leaf.grad = leaf.grad, None
        self.unit.fsdp.reduce_scatter_grad(self.group, flat_grad, self.absent)
        self.unit.fsdp.mark(self.unit.name, "backward_done")


class _Unflatten(torch.autograd.Function):
    """Forward: the flat buffer -> one view per parameter. Backward: the gradients -> one flat
    gradient, ready to reduce-scatter (a parameter that got none is marked absent).

    Note: autograd runs this backward only once *every* gradient of the unit's parameters
    exists, i.e. once the unit's backward is over: the moment to free the gathered parameters,
    before the flat gradient is allocated.
    """

    @staticmethod
    def forward(ctx, flat, layout, call):
        ctx.set_materialize_grads(False)  # an unused parameter's gradient arrives as None
        ctx.layout, ctx.call, ctx.like = layout, call, flat.new_empty(0)
        return tuple(layout.views(flat))

    @staticmethod
    def backward(ctx, *grads):
        ctx.call.unit.backward_done()
        with allocating("comm_buffers"):
            flat, ctx.call.absent = ctx.layout.flatten_grads(list(grads), ctx.like)
        return flat, None, None


class Unit:
    """A module whose parameters are gathered together, used, and freed together."""

    def __init__(self, fsdp: "FSDP", module: nn.Module, name: str, slots: list[ParamSlot],
                 reshard_after_forward: bool):
        self.fsdp, self.module, self.name = fsdp, module, name or "root"
        self.reshard_after_forward = reshard_after_forward
        self.state = TrainingState.IDLE
        self.backwards_to_come = 0  # forwards with grad whose backward has not finished yet
        self.groups: list[FlatGroup] = []
        for trainable, suffix in ((True, ""), (False, "[frozen]")):
            mine = [s for s in slots if s.requires_grad == trainable]
            if mine:
                self.groups.append(FlatGroup(mine, fsdp.comm, self.name + suffix, trainable))
        for group in self.groups:  # the module tree now holds this rank's pieces
            group.point_modules_at(group.pieces.params)
        module.register_forward_pre_hook(self.pre_forward)
        module.register_forward_hook(self.post_forward)

    @property
    def padded_bytes(self) -> int:
        """Bytes of the whole unit once gathered (all its flat groups, padding included)."""
        return sum(g.layout.padded_numel * g.shard.element_size() for g in self.groups)

    def _enter(self, state: TrainingState, *allowed: TrainingState) -> None:
        assert self.state in allowed, f"unit {self.name}: {self.state.value} -> {state.value}"
        self.state = state

    # -- forward --------------------------------------------------------------------------------

    def pre_forward(self, module, args) -> None:
        self._enter(TrainingState.FORWARD, TrainingState.IDLE,
                    TrainingState.WAITING_FOR_BACKWARD)
        for group in self.groups:
            group.unshard("forward")
            group.use_in_forward(self)
        self.fsdp.mark(self.name, "gathered")

    def post_forward(self, module, args, output) -> None:
        grad = torch.is_grad_enabled()
        outputs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        for t in outputs if grad else ():
            t.register_hook(self.pre_backward)
        waiting = grad and bool(outputs)
        self._enter(TrainingState.WAITING_FOR_BACKWARD if waiting else TrainingState.IDLE,
                    TrainingState.FORWARD)
        if not waiting or (self.reshard_after_forward and self is not self.fsdp.root):
            self.reshard()
        self.fsdp.mark(self.name, "forward_done")

    # -- backward -------------------------------------------------------------------------------

    def pre_backward(self, grad: torch.Tensor) -> None:
        """A gradient reached one of the unit's outputs: its backward is next. Gather it again."""
        self._enter(TrainingState.BACKWARD, TrainingState.WAITING_FOR_BACKWARD,
                    TrainingState.BACKWARD)
        self.fsdp.backward_started()
        for group in self.groups:
            group.unshard("backward")

    def backward_done(self) -> None:
        """The unit's backward is over: free it, and finish the previous unit's reduce-scatter
        (it overlapped with this unit's backward) before this unit's flat gradient is made."""
        self.backwards_to_come -= 1
        if self.backwards_to_come == 0:
            self.reshard()
            self.state = TrainingState.IDLE
        self.fsdp.collect_grads()

    def reshard(self) -> None:
        for group in self.groups:
            group.reshard()


class FSDP(WholeView, Strategy):
    """The FSDP state of a module: its units and the reduce-scatters in flight."""

    strategy = "fsdp"
    sharded = ("params", "grads", "optim")
    traffic = "≈ 3Ψ"

    def __init__(self, module: nn.Module, comm: Comm, recorder=None, units=(),
                 reshard_after_forward: bool = True):
        super().__init__(module, comm, recorder)
        self.state_dict_keys = list(module.state_dict().keys())
        broadcast_module_states(module, comm)
        unit_names = check_units(module, units)
        slots_by_unit = assign_slots(module, unit_names)
        module.register_forward_pre_hook(self._check_no_unfrozen)
        self.root = None  # the last unit built; units compare themselves with it
        self.units = [Unit(self, m, unit_names.get(id(m), ""), slots_by_unit[id(m)],
                           reshard_after_forward) for m in list(units) + [module]]
        self.root = self.units[-1]
        self._pending: list[Reduction] = []
        self._backward_queued = False
        self.watch = GradWatch("fsdp", "this rank's shards of the averaged gradients")

    def groups(self) -> list[FlatGroup]:
        return [g for u in self.units for g in u.groups]

    def _check_no_unfrozen(self, module, args) -> None:
        for group in self.groups():
            if not group.trainable and any(p.requires_grad for p in group.pieces.params):
                name = next(s.names[0] for s, p in zip(group.layout.slots, group.pieces.params)
                            if p.requires_grad)
                raise RuntimeError(
                    f"fsdp: parameter {name!r} was frozen when parallelize ran and requires grad "
                    f"now; frozen parameters are sharded apart and never reduce-scattered. Set "
                    f"requires_grad before calling parallelize (freezing later is fine).")

    # -- backward -------------------------------------------------------------------------------

    def backward_started(self) -> None:
        if not self._backward_queued:
            self._backward_queued = True
            Variable._execution_engine.queue_callback(self._backward_end)

    def reduce_scatter_grad(self, group: FlatGroup, flat_grad: torch.Tensor, absent) -> None:
        with allocating("grads"):
            mine = torch.empty_like(group.shard)
        handle = self.comm.reduce_scatter(mine, flat_grad, label=Tag(group.label, "grad"),
                                          async_op=True)
        self._pending.append(Reduction(group, flat_grad, mine, handle, absent))

    def collect_grads(self) -> None:
        """Wait for the reduce-scatters in flight; each piece keeps its averaged gradient.

        Note: called as soon as the next unit's backward is over, so at most one unit's flat
        gradient waits at a time; keeping them all until the end would cost a whole model.
        """
        with torch.no_grad():
            for work in self._pending:
                work.target.pieces.add_grads(work.mean(self.comm.world_size), work.absent)
        self._pending.clear()

    def _backward_end(self) -> None:
        """Autograd has finished: collect the last gradients, free every unit."""
        self.collect_grads()
        for unit in self.units:
            unit.reshard()
            unit.backwards_to_come = 0
            unit.state = TrainingState.IDLE
        self._backward_queued = False
        self.watch.remember(self.grads_for_norm()[0])
        self.mark("", "backward_end")

    # -- around the optimizer step (called by the parallelized optimizer) ------------------------

    def before_step(self) -> None:
        self.watch.check()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.watch.remember(self.grads_for_norm()[0])  # the pieces are the module's parameters

    def grads_for_norm(self) -> tuple[list[torch.Tensor], bool]:
        """The averaged gradients this rank owns (disjoint across ranks): its pieces'."""
        return [g for group in self.groups() for g in group.pieces.grads()], True

    def after_clip(self) -> None:
        self.watch.remember(self.grads_for_norm()[0])

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        groups = self.groups()
        return {"params": [g.shard for g in groups],
                "gathered_params": [g._storage for g in groups],
                "grads": [t for g in groups for t in g.pieces.grads()]
                + [work.result for work in self._pending],
                "comm_buffers": [work.sent for work in self._pending]}
