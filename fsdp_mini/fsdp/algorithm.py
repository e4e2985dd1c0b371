"""FSDP (ZeRO-3): shard parameters, gradients and optimizer state; gather a unit only to use it.

The model is cut into *units* (e.g. every transformer block, plus the root for what is left).
Each unit's parameters are laid end to end in one padded flat buffer (:mod:`fsdp_mini.buffers.flat`)
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
``prefetch=k`` issues the next k units' all-gathers before a unit computes (same bytes, k more
units whole at a time; :mod:`fsdp_mini.fsdp.prefetch`). ``activation_checkpointing=True``
recomputes each unit's activations in backward, while it is gathered for backward anyway.

Mixed precision: with ``param_dtype=torch.bfloat16`` units are gathered and computed in bf16
while the shards stay fp32; gradients are reduce-scattered in ``reduce_dtype`` (default fp32)
(:mod:`fsdp_mini.precision.policy`). Under ``fsdp_mini.no_sync`` a unit's flat gradient is kept
whole and summed over micro-batches, then reduce-scattered once
(:mod:`fsdp_mini.buffers.accumulate`). ``offload=True`` keeps shards, gradients and optimizer state
on the CPU (:mod:`fsdp_mini.buffers.offload`).
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import nn
from torch.autograd import Variable
from torch.utils._pytree import tree_leaves

from ..buffers.accumulate import LocalGradients, check_synced
from ..buffers.flat import ParamSlot
from ..buffers.offload import check_offload
from ..clip import GradWatch
from ..comm.collectives import Comm, Reduction, Tag, broadcast_module_states
from ..memory import allocating
from ..precision.policy import MixedPrecision, cast, cast_grad
from ..strategy import Strategy
from .group import FlatGroup
from .meta_init import MetaInit
from .prefetch import Prefetcher
from .units import assign_slots, check_units, checkpoint_forward
from .whole import WholeView


class TrainingState(Enum):
    """Where a unit is in the training step (FSDP2 calls this ``TrainingState`` too)."""

    IDLE = "idle"                          # between steps (or after a forward without grad)
    FORWARD = "forward"                    # its forward is running
    WAITING_FOR_BACKWARD = "waiting"       # forward done with grad; its backward is to come
    BACKWARD = "backward"                  # its backward is running


class Unit:
    """A module whose parameters are gathered together, used, and freed together."""

    def __init__(self, fsdp: "FSDP", module: nn.Module, name: str, slots: list[ParamSlot],
                 reshard_after_forward: bool):
        self.fsdp, self.module, self.name = fsdp, module, name or "root"
        self.reshard_after_forward = reshard_after_forward
        self.state = TrainingState.IDLE
        self.backwards_to_come = 0  # forwards with grad whose backward has not finished yet
        self.groups: list[FlatGroup] = []
        if fsdp.meta_init is not None:  # a meta model: this unit gets its values now, then shards
            new = fsdp.meta_init.materialize(module)
            for slot in slots:
                slot.param = new.get(id(slot.param), slot.param)
        for trainable, suffix in ((True, ""), (False, "[frozen]")):
            mine = [s for s in slots if s.requires_grad == trainable]
            if mine:
                self.groups.append(FlatGroup(mine, fsdp.comm, self.name + suffix, trainable,
                                             fsdp.precision.param_dtype, fsdp.offload))
        for group in self.groups:  # the module tree now holds this rank's pieces
            group.point_modules_at(group.pieces.params)
        module.register_forward_pre_hook(self.pre_forward)
        module.register_forward_hook(self.post_forward)

    @property
    def padded_bytes(self) -> int:
        """Bytes of the whole unit once gathered (all its flat groups, padding included)."""
        return sum(g.layout.padded_numel * g.param_dtype.itemsize for g in self.groups)

    def _enter(self, state: TrainingState, *allowed: TrainingState) -> None:
        assert self.state in allowed, f"unit {self.name}: {self.state.value} -> {state.value}"
        self.state = state

    # -- forward --------------------------------------------------------------------------------

    def pre_forward(self, module, args) -> tuple | None:
        if self.fsdp.in_backward and self.backwards_to_come:
            return self.pre_recompute(args)
        self._enter(TrainingState.FORWARD, TrainingState.IDLE,
                    TrainingState.WAITING_FOR_BACKWARD)
        for group in self.groups:
            group.unshard("forward")
        if not self.fsdp.in_backward:  # Note: a recomputation's next unit is done with backward
            self.fsdp.prefetch_after(self, "forward")  # its gather overlaps with this unit
        for group in self.groups:
            group.use_in_forward(self)
        self.fsdp.mark(self.name, "gathered")
        return self.fsdp.precision.cast_inputs(args)  # Note: bf16 weights need bf16 inputs

    def post_forward(self, module, args, output) -> None:
        if self.state is not TrainingState.FORWARD:
            return  # a recomputation ends (pre_recompute): its backward goes on, nothing to free
        grad = torch.is_grad_enabled()
        outputs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        for t in outputs if grad else ():
            t.register_hook(self.pre_backward)
        waiting = grad and bool(outputs)
        self._enter(TrainingState.WAITING_FOR_BACKWARD if waiting else TrainingState.IDLE,
                    TrainingState.FORWARD)
        # Note: a forward inside backward is a recomputation whose backward comes next (reentrant
        # checkpointing): freeing the unit now would only gather it again at once.
        if not waiting or (self.reshard_after_forward and self is not self.fsdp.root
                           and not self.fsdp.in_backward):
            self.reshard()
        if self is self.fsdp.root:
            self.fsdp.forward_finished()
        self.fsdp.mark(self.name, "forward_done")

    # -- backward -------------------------------------------------------------------------------

    def pre_backward(self, grad: torch.Tensor) -> None:
        """A gradient reached one of the unit's outputs: its backward is next. Gather it again."""
        self._enter(TrainingState.BACKWARD, TrainingState.WAITING_FOR_BACKWARD,
                    TrainingState.BACKWARD)
        self.fsdp.backward_started()
        for group in self.groups:
            group.unshard("backward")
            group.point_modules_at(group.forward_views)  # a recomputation reads them (below)
        self.fsdp.prefetch_after(self, "backward")

    def pre_recompute(self, args) -> tuple | None:
        """Activation checkpointing from outside the kit (``torch.utils.checkpoint`` around the
        unit's call) runs the unit's forward again inside backward, hooks included, to recompute
        what the first forward did not keep. The unit stays in its backward: it is gathered (if
        its backward has not gathered it yet), and the forward reads the same views of the
        gathered buffer that the first forward used, so the recomputed tensors are those
        autograd expects and the gradients still flow to the first forward's flat gradient.

        (Checkpointing that wraps only ``forward``, as the kit's own and Hugging Face's do,
        calls no hook: the recomputation then reads the views ``pre_backward`` pointed at.)
        Note: the state is left as it is, and ``post_forward`` knows the recomputation by that;
        it may not even be called, as torch stops a recomputation once it has what it needs.
        """
        for group in self.groups:
            group.unshard("backward")  # Note: nothing to do once its backward gathered it
            group.point_modules_at(group.forward_views)
        return self.fsdp.precision.cast_inputs(args)

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
    materializes_units = True  # a meta model is materialised one unit at a time (meta_init)
    unit_type = Unit  # the class of its units (lab 05's scaffold drives its own subclass)

    def __init__(self, module: nn.Module, comm: Comm, recorder=None, units=(),
                 reshard_after_forward: bool = True, param_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype | None = None, prefetch: int | bool = False,
                 activation_checkpointing: bool = False, offload: bool = False,
                 meta_init: MetaInit | None = None):
        super().__init__(module, comm, recorder)
        self.meta_init = meta_init  # set by parallelize for a meta model (fsdp_mini.fsdp.meta_init)
        self.precision = MixedPrecision(param_dtype, reduce_dtype).check_effect(module, "fsdp")
        self.offload = offload and check_offload(module)
        self.state_dict_keys = list(module.state_dict().keys())
        self.broadcast_initial_states(module)
        unit_names = check_units(module, units)
        slots_by_unit = assign_slots(module, unit_names)
        module.register_forward_pre_hook(self._check_no_unfrozen)
        self.root = None  # the last unit built; units compare themselves with it
        self.units = [self.unit_type(self, m, unit_names.get(id(m), ""), slots_by_unit[id(m)],
                           reshard_after_forward) for m in list(units) + [module]]
        self.root = self.units[-1]
        ahead = int(prefetch)  # True means one unit ahead
        self.prefetcher = Prefetcher(ahead) if ahead else None
        self.activation_checkpointing = activation_checkpointing
        for unit in self.units[:-1] if activation_checkpointing else ():
            checkpoint_forward(unit.module)  # the root's forward is the whole model: not it
        self._pending: list[Reduction] = []
        self.local_grads = LocalGradients()  # whole flat gradients kept under no_sync
        self._backward_queued = False
        self.watch = GradWatch("fsdp", "this rank's shards of the averaged gradients")

    def broadcast_initial_states(self, module: nn.Module) -> None:
        """Make every rank start from rank 0's parameters and buffers (HSDP: over the world,
        not only over its shard group)."""
        broadcast_module_states(module, self.comm)

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

    # -- prefetch (see prefetch.py) ------------------------------------------------------------

    def prefetch_after(self, unit: Unit, direction: str) -> None:
        """``unit`` is gathered and about to compute: issue the gathers of the units after it."""
        if self.prefetcher is None:
            return
        order = self.prefetcher
        if direction == "forward" and unit is self.root:
            order.forward_started()
            ahead = order.first_in_forward()
        elif direction == "forward":
            ahead = order.next_in_forward(unit)
        else:  # only units whose backward is still to come
            ahead = [u for u in order.next_in_backward(unit)
                     if u.state is TrainingState.WAITING_FOR_BACKWARD]
        for later in ahead:
            for group in later.groups:
                group.prefetch(direction)

    def forward_finished(self) -> None:
        """The root's forward is over: free units prefetched for a forward that skipped them."""
        if self.prefetcher is not None:
            for unit in self.prefetcher.forward_finished():
                if unit.state is TrainingState.IDLE:
                    unit.reshard()

    # -- backward -------------------------------------------------------------------------------

    @property
    def in_backward(self) -> bool:
        """A backward has reached a unit and not finished (``_backward_end`` is queued)."""
        return self._backward_queued

    def backward_started(self) -> None:
        if not self._backward_queued:
            self._backward_queued = True
            Variable._execution_engine.queue_callback(self._backward_end)

    def reduce_scatter_grad(self, group: FlatGroup, flat_grad: torch.Tensor, absent) -> None:
        flat_grad = cast_grad(flat_grad, self.precision.reduce(group.shard.dtype))  # bf16 -> fp32
        if not self.sync_gradients:
            self.local_grads.keep(group, flat_grad, absent)  # no_sync: sent by a later backward
            return
        flat_grad, absent = self.local_grads.take(group, flat_grad, absent)
        with allocating("grads"):
            mine = torch.empty(group.shard.numel(), dtype=flat_grad.dtype, device=flat_grad.device)
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
                mean = self.reduce_shard_grad(work.target, work.mean(self.comm.world_size))
                mean = cast(mean, work.target.shard.dtype, "grads")
                mean = mean.to(work.target.shard.device)  # offload: the gradient shard goes home
                work.target.pieces.add_grads(mean, work.absent)
                work.free_sent()  # the unit's flat gradient: read, so freed now
        self._pending.clear()

    def reduce_shard_grad(self, group: FlatGroup, mean: torch.Tensor) -> torch.Tensor:
        """This rank's averaged gradient shard of ``group``, once its reduce-scatter is done.
        FSDP keeps it as it is; HSDP averages it over the replicas (:mod:`fsdp_mini.fsdp.hsdp`)."""
        return mean

    def _backward_end(self) -> None:
        """Autograd has finished: collect the last gradients, free every unit."""
        if self.sync_gradients:  # units kept under no_sync that this backward did not use
            for group, flat_grad, absent in self.local_grads.leftovers(self.groups()):
                self.reduce_scatter_grad(group, flat_grad, absent)
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
        check_synced("fsdp", self.local_grads.owed)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.local_grads.clear()
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
                + [work.result for work in self._pending] + self.local_grads.tensors(),
                "comm_buffers": [work.sent for work in self._pending]}
