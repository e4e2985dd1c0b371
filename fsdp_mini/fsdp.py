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

Memory per rank (fp32, Adam): (4Ψ + 4Ψ + 8Ψ)/N plus the gathered unit(s) and the activations,
which no ZeRO stage shards. Traffic per step: all-gather Ψ (forward) + all-gather Ψ (backward,
for units freed after forward) + reduce-scatter Ψ = 3(N-1)/N x 4Ψ bytes per rank, 1.5x DDP.
``reshard_after_forward=False`` keeps units gathered from forward to backward: 2Ψ like DDP, more
memory. The root unit is never freed after forward: backward needs it again at once.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from torch.autograd import Variable
from torch.utils._pytree import tree_leaves

from .comm import Comm
from .ddp import broadcast_module_states
from .flat import FlatLayout, ParamSlot, param_slots
from .memory import allocating


class FlatShard:
    """One flat group of a unit's parameters: this rank's shard, and room for the whole group.

    The gathered buffer is one storage that is resized to full size by ``unshard`` and to zero by
    ``reshard``. Note: resizing the *storage* (rather than dropping the tensor) is what lets
    autograd keep the views it saved for backward; they become valid again at the next unshard.
    """

    def __init__(self, slots: list[ParamSlot], comm: Comm, label: str, requires_grad: bool):
        kinds = {(s.param.dtype, s.param.device) for s in slots}
        if len(kinds) > 1:
            raise ValueError(f"unit {label!r} mixes parameter dtypes/devices {sorted(map(str, kinds))}"
                             f"; one flat buffer needs one kind: move or cast the model first, or "
                             f"put the odd modules in a unit of their own")
        self.layout, self.comm, self.label = FlatLayout(slots, comm.world_size), comm, label
        with torch.no_grad():
            full = self.layout.flatten([s.param.detach() for s in slots])
        for slot in slots:  # the original, full parameters are freed: only the shard stays
            slot.param.data = torch.empty(0, dtype=full.dtype, device=full.device)
            slot.param = None
        start, end = self.layout.shard_range(comm.rank)
        with allocating("params"):
            self.shard = nn.Parameter(full[start:end].clone(), requires_grad=requires_grad)
        with allocating("gathered_params"):
            self._storage = torch.empty_like(full).untyped_storage()
        self._full_nbytes = self._storage.nbytes()
        self._storage.resize_(0)

    @property
    def is_gathered(self) -> bool:
        return self._storage.nbytes() > 0

    def _gathered(self) -> torch.Tensor:
        # A fresh tensor over the shared storage, with its own autograd version counter.
        empty = torch.empty(0, dtype=self.shard.dtype, device=self.shard.device)
        return empty.set_(self._storage, 0, (self.layout.padded_numel,))

    def unshard(self, phase: str) -> None:
        if self.is_gathered:
            return
        self._storage.resize_(self._full_nbytes)
        self.comm.all_gather(self._gathered(), self.shard.detach(), label=f"{self.label}/{phase}")

    def reshard(self) -> None:
        self._storage.resize_(0)

    def use_in_forward(self, unit: "Unit") -> None:
        """Point the modules' attributes at views of the gathered buffer for this forward.

        With grad enabled the views come out of one leaf tensor through :class:`_Unflatten`:
        once the unit's backward is over it calls ``unit.backward_done()``, then autograd hands
        the unit's gradient, as one flat tensor, to ``unit.post_backward(leaf)``.
        """
        full = self._gathered()
        if self.shard.requires_grad and torch.is_grad_enabled():
            full.requires_grad_(True)
            full.register_post_accumulate_grad_hook(unit.post_backward)
            unit.in_flight += 1
            views = _Unflatten.apply(full, self.layout, unit.backward_done)
        else:
            views = self.layout.views(full)
        for slot, view in zip(self.layout.slots, views):
            for module, attr in slot.owners:
                setattr(module, attr, view)


class _Unflatten(torch.autograd.Function):
    """Forward: the flat buffer -> one view per parameter. Backward: the gradients -> one flat
    gradient, ready to reduce-scatter.

    Note: autograd runs this backward only once *every* gradient of the unit's parameters
    exists, i.e. once the unit's backward is over: the moment to free the gathered parameters,
    before the flat gradient is allocated.
    """

    @staticmethod
    def forward(ctx, flat, layout, backward_done):
        ctx.layout, ctx.backward_done = layout, backward_done
        return tuple(layout.views(flat))

    @staticmethod
    def backward(ctx, *grads):
        ctx.backward_done()
        with allocating("comm_buffers"):
            return ctx.layout.flatten(list(grads)), None, None


class Unit:
    """A module whose parameters are gathered together, used, and freed together."""

    def __init__(self, fsdp: "FSDP", module: nn.Module, name: str, slots: list[ParamSlot],
                 reshard_after_forward: bool):
        self.fsdp, self.module, self.name = fsdp, module, name or "root"
        self.reshard_after_forward = reshard_after_forward
        self.in_flight = 0  # forwards with grad whose backward has not finished yet
        self.groups: list[FlatShard] = []
        for trainable, suffix in ((True, ""), (False, "[frozen]")):
            mine = [s for s in slots if s.requires_grad == trainable]
            if mine:
                self.groups.append(FlatShard(mine, fsdp.comm, self.name + suffix, trainable))
        for group in self.groups:
            for slot in group.layout.slots:
                for owner, attr in slot.owners:
                    del owner._parameters[attr]
            module.register_parameter("flat_shard" if group.shard.requires_grad
                                      else "flat_shard_frozen", group.shard)
        module.register_forward_pre_hook(self.pre_forward)
        module.register_forward_hook(self.post_forward)

    @property
    def padded_bytes(self) -> int:
        """Bytes of the whole unit once gathered (all its flat groups, padding included)."""
        return sum(g.layout.padded_numel * g.shard.element_size() for g in self.groups)

    # -- forward --------------------------------------------------------------------------------

    def pre_forward(self, module, args) -> None:
        for group in self.groups:
            group.unshard("forward")
            group.use_in_forward(self)
        self.fsdp.mark(f"{self.name}/gathered")

    def post_forward(self, module, args, output) -> None:
        if torch.is_grad_enabled():
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self.pre_backward)
        if not torch.is_grad_enabled() or (self.reshard_after_forward and self is not self.fsdp.root):
            self.reshard()
        self.fsdp.mark(f"{self.name}/forward_done")

    # -- backward -------------------------------------------------------------------------------

    def pre_backward(self, grad: torch.Tensor) -> None:
        """A gradient reached one of the unit's outputs: its backward is next. Gather it again."""
        self.fsdp.backward_started()
        for group in self.groups:
            group.unshard("backward")

    def backward_done(self) -> None:
        """The unit's backward is over: free it, and finish the previous unit's reduce-scatter
        (it overlapped with this unit's backward) before this unit's flat gradient is made."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self.reshard()
        self.fsdp.collect_grads()

    def post_backward(self, leaf: torch.Tensor) -> None:
        """The unit's flat gradient is complete: reduce-scatter it; each rank keeps its shard."""
        group = next(g for g in self.groups if g.shard.requires_grad)
        flat_grad, leaf.grad = leaf.grad, None
        self.fsdp.reduce_scatter_grad(group, flat_grad)
        self.fsdp.mark(f"{self.name}/backward_done")

    def reshard(self) -> None:
        for group in self.groups:
            group.reshard()


class FSDP:
    """The FSDP state of a module: its units and the reduce-scatters in flight."""

    strategy = "fsdp"

    def __init__(self, module: nn.Module, comm: Comm, units=(), reshard_after_forward: bool = True,
                 recorder=None):
        self.module, self.comm, self.recorder = module, comm, recorder
        self.state_dict_keys = list(module.state_dict().keys())
        broadcast_module_states(module, comm)
        unit_names = _check_units(module, list(units))
        slots_by_unit = _assign_slots(module, unit_names)
        self.root = None  # the last unit built; units compare themselves with it
        self.units = [Unit(self, m, unit_names.get(id(m), ""), slots_by_unit[id(m)],
                           reshard_after_forward) for m in list(units) + [module]]
        self.root = self.units[-1]
        self._pending = []
        self._backward_queued = False

    def mark(self, label: str) -> None:
        if self.recorder is not None:
            self.recorder.mark(label)

    def backward_started(self) -> None:
        if not self._backward_queued:
            self._backward_queued = True
            Variable._execution_engine.queue_callback(self._backward_end)

    def reduce_scatter_grad(self, group: FlatShard, flat_grad: torch.Tensor) -> None:
        with allocating("grads"):
            mine = torch.empty_like(group.shard)
        handle = self.comm.reduce_scatter(mine, flat_grad, label=f"{group.label}/grad",
                                          async_op=True)
        self._pending.append((group, flat_grad, mine, handle))

    def collect_grads(self) -> None:
        """Wait for the reduce-scatters in flight; each shard keeps its averaged gradient.

        Note: called as soon as the next unit's backward is over, so at most one unit's flat
        gradient waits at a time; keeping them all until the end would cost a whole model.
        """
        with torch.no_grad():
            for group, _, mine, handle in self._pending:
                handle.wait()
                mine.div_(self.comm.world_size)
                if group.shard.grad is None:
                    group.shard.grad = mine
                else:
                    group.shard.grad.add_(mine)  # gradient accumulation over micro-batches
        self._pending.clear()

    def _backward_end(self) -> None:
        """Autograd has finished: collect the last gradients, free every unit."""
        self.collect_grads()
        for unit in self.units:
            unit.reshard()
            unit.in_flight = 0
        self._backward_queued = False
        self.mark("backward_end")

    def full_state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """Every parameter gathered, under its original name; collective: all ranks call it."""
        tensors: dict[str, torch.Tensor] = {}
        for unit in self.units:
            for group in unit.groups:
                full = torch.empty(group.layout.padded_numel, dtype=group.shard.dtype,
                                   device=group.shard.device)
                self.comm.all_gather(full, group.shard.detach(), label=f"{group.label}/state_dict")
                for slot, view in zip(group.layout.slots, group.layout.views(full)):
                    value = view.clone()
                    for name in slot.names:
                        tensors[name] = value
        for name, buf in self.module.named_buffers():
            tensors[name] = buf.detach().clone()
        return OrderedDict((k, tensors[k]) for k in self.state_dict_keys)

    def memory_categories(self) -> dict[str, list[torch.Tensor]]:
        groups = [g for u in self.units for g in u.groups]
        return {"params": [g.shard for g in groups],
                "gathered_params": [g._storage for g in groups],
                "grads": [g.shard.grad for g in groups] + [m for _, _, m, _ in self._pending],
                "comm_buffers": [fg for _, fg, _, _ in self._pending]}


def _check_units(module: nn.Module, units: list[nn.Module]) -> dict[int, str]:
    """Names of the unit modules; a clear error if one is not a submodule or units overlap."""
    names = {id(m): name for name, m in module.named_modules()}
    found: dict[int, str] = {}
    for u in units:
        if not isinstance(u, nn.Module):
            raise TypeError(f"units must be nn.Modules, got a {type(u).__name__}")
        if u is module:
            raise ValueError("the root module is always a unit; list only its submodules in units=")
        if isinstance(u, (nn.ModuleList, nn.ModuleDict)):
            raise ValueError(f"unit {names.get(id(u), type(u).__name__)!r} is a "
                             f"{type(u).__name__}, which is never called, so it would never be "
                             f"gathered; pass the modules inside it, e.g. units=list(model.blocks)")
        if id(u) not in names:
            raise ValueError(f"unit {type(u).__name__} is not a submodule of the model; pass "
                             f"modules reached from it, e.g. units=list(model.blocks)")
        if id(u) in found:
            raise ValueError(f"unit {names[id(u)]!r} is listed twice in units=")
        found[id(u)] = names[id(u)]
    for a in found.values():
        for b in found.values():
            if a != b and b.startswith(a + "."):
                raise ValueError(f"units overlap: {b!r} is inside {a!r}; a parameter must belong "
                                 f"to exactly one unit, so list either the outer or the inner ones")
    return found


def _assign_slots(module: nn.Module, unit_names: dict[int, str]) -> dict[int, list[ParamSlot]]:
    """Give every parameter to the innermost unit that holds it (the root for the rest)."""
    prefixes = {name: uid for uid, name in unit_names.items()}
    by_unit: dict[int, list[ParamSlot]] = {uid: [] for uid in unit_names}
    by_unit[id(module)] = []

    def unit_of(param_name: str) -> int:
        for prefix, uid in prefixes.items():
            if param_name.startswith(prefix + "."):
                return uid
        return id(module)

    for slot in param_slots(module):
        owners = {unit_of(n) for n in slot.names}
        if len(owners) > 1:
            raise ValueError(f"parameter shared by several units (tied weights): "
                             f"{', '.join(slot.names)}; put the modules that share it in one "
                             f"unit, e.g. leave them all in the root (not in units=)")
        by_unit[owners.pop()].append(slot)
    return by_unit
