"""A unit's flat parameter group under FSDP: this rank's shard, and the whole group when gathered.

:class:`FlatGroup` does the three things FSDP does to memory, for the parameters of one unit:

    shard      at wrap time: lay the parameters end to end (padded), keep this rank's 1/N
    unshard    all-gather the shards into one buffer; the module's attributes become views of it
    reshard    free that buffer (its storage is resized to 0); the attributes become the pieces

Example, N = 2, a group of one 2x2 weight w = [[a b] [c d]]::

    shard      rank0 shard [a b]            rank1 shard [c d]
    unshard    both ranks: buffer [a b c d], module.weight = buffer.view(2, 2)
    reshard    rank0 module.weight = piece [a b]   rank1 module.weight = piece [c d]

With grad enabled, the views come out of :class:`_Unflatten`, whose backward gathers the
parameters' gradients into one flat gradient and hands it to :class:`BackwardCall`, which asks
the strategy to reduce-scatter it (see :mod:`fsdp_mini.fsdp.algorithm`).
"""

from __future__ import annotations

import torch

from ..buffers.flat import FlatLayout, ParamSlot, ShardPieces
from ..buffers.offload import to_host
from ..comm.collectives import Comm, Tag
from ..memory import allocating
from ..precision.policy import cast


class FlatGroup:
    """One flat group of a unit's parameters: this rank's shard, and room for the whole group.

    The gathered buffer is one storage that is resized to full size by ``unshard`` and to zero by
    ``reshard``. Note: resizing the *storage* (rather than dropping the tensor) is what lets
    autograd keep the views it saved for backward; they become valid again at the next unshard.
    It holds ``param_dtype`` (bf16 in mixed precision: half the bytes); the shard keeps its own.
    """

    def __init__(self, slots: list[ParamSlot], comm: Comm, label: str, trainable: bool,
                 param_dtype: torch.dtype | None = None, offload: bool = False):
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
        self.device = full.device  # where the unit computes; with offload the shard is on the CPU
        with allocating("params"):
            self.shard = to_host(full[start:end]) if offload else full[start:end].clone()
        self.pieces = ShardPieces(self.layout, self.shard, comm.rank)
        self.param_dtype = param_dtype or full.dtype  # what forward and backward compute in
        with allocating("gathered_params"):
            self._storage = torch.empty_like(full, dtype=self.param_dtype).untyped_storage()
        self._full_nbytes = self._storage.nbytes()
        self._storage.resize_(0)
        self._in_flight = None  # a prefetched all-gather not waited for yet

    @property
    def is_gathered(self) -> bool:
        return self._storage.nbytes() > 0

    def gathered(self) -> torch.Tensor:
        # A fresh tensor over the shared storage, with its own autograd version counter.
        empty = torch.empty(0, dtype=self.param_dtype, device=self.device)
        return empty.set_(self._storage, 0, (self.layout.padded_numel,))

    def send_buffer(self) -> torch.Tensor:
        """What this rank contributes to the all-gather: its shard, cast to ``param_dtype``
        (in mixed precision a copy, counted as comm_buffers; an asynchronous all-gather's work
        holds it until done)."""
        return cast(self.shard.to(self.device, non_blocking=True), self.param_dtype)

    def unshard(self, phase: str, force: bool = False) -> None:
        """Make the whole group available: all-gather it, or wait for its prefetched gather."""
        if not self.is_gathered or force:
            self._storage.resize_(self._full_nbytes)
            self.comm.all_gather(self.gathered(), self.send_buffer(), label=Tag(self.label, phase))
        self.wait_for_prefetch()

    def prefetch(self, phase: str) -> None:
        """Issue the all-gather now and return at once; ``unshard`` waits for it later."""
        if self.is_gathered:
            return
        self._storage.resize_(self._full_nbytes)
        self._in_flight = self.comm.all_gather(self.gathered(), self.send_buffer(),
                                               label=Tag(self.label, phase), async_op=True)

    def wait_for_prefetch(self) -> None:
        if self._in_flight is not None:
            self._in_flight.wait()
            self._in_flight = None

    def reshard(self) -> None:
        self.wait_for_prefetch()  # Note: never free a buffer that a collective still writes
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

    def use_in_forward(self, unit) -> None:
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
        self.forward_views = views
        self.point_modules_at(views)


class BackwardCall:
    """One forward of a unit's trainable group with grad, seen from its backward."""

    def __init__(self, unit, group: FlatGroup):  # unit: an fsdp.Unit
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
