"""Fresh wrong answers for lab 05 (FSDP from scratch): 05_my_unit and 05_reduce_scatter_grad.

Every wrong answer starts from the reference solution and changes one thing, as a learner would
in the notebook's exercise cell. Classes and functions are top-level so the checker's ranks can
import them.
"""

import torch

from wrong_answers.round2 import Case
from fsdp_mini import labs

WORLD_SIZE = 2   # labs.lab_config() under CI: world_size=2, model="tiny"


# ---------------------------------------------------------------------------------------------
# Exercise 1: 05_my_unit
# ---------------------------------------------------------------------------------------------

class MyUnit(labs.FSDPUnit):
    """The learner's working unit (as the reference): used by the exercise-2 cases as UnitUsed."""

    def unshard(self):
        if self.is_gathered:
            return
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        self.comm.all_gather(self.full, self.shard, label=self.tag())

    def reshard(self):
        self.full.untyped_storage().resize_(0)

    def post_forward(self):
        if not self.is_root:
            self.reshard()

    def pre_backward(self):
        self.unshard()


class UnitNoGuard(MyUnit):
    """Forgot the early return: the root, still gathered from its forward, is gathered again."""

    def unshard(self):
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        self.comm.all_gather(self.full, self.shard, label=self.tag())


class UnitFourBytes(MyUnit):
    """Sizes the storage as 4 bytes per element (fp32 assumed): twice the room in bfloat16."""

    def unshard(self):
        if self.is_gathered:
            return
        self.full.untyped_storage().resize_(self.full.numel() * 4)
        self.comm.all_gather(self.full, self.shard, label=self.tag())


class UnitFreesRoot(MyUnit):
    """Frees every unit after forward, the root too: the root is gathered again for backward."""

    def post_forward(self):
        self.reshard()


class UnitInvertedRoot(MyUnit):
    """The root test inverted: frees only the root after forward, keeps every block gathered."""

    def post_forward(self):
        if self.is_root:
            self.reshard()


class UnitRootInReshard(MyUnit):
    """The root exception put inside reshard: the root is never freed, not even after backward."""

    def reshard(self):
        if not self.is_root:
            self.full.untyped_storage().resize_(0)

    def post_forward(self):
        self.reshard()


class UnitStagingCopy(MyUnit):
    """Gathers into a temporary tensor, then copies its storage into self.full (as section 2's
    demo did by hand): a second unit-sized buffer alive during every gather."""

    def unshard(self):
        if self.is_gathered:
            return
        staging = torch.empty(self.full.numel(), dtype=self.full.dtype, device=self.full.device)
        self.comm.all_gather(staging, self.shard, label=self.tag())
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        self.full.untyped_storage().copy_(staging.untyped_storage())


class UnitKeptStaging(MyUnit):
    """Same staging gather, but the staging buffer is kept on the unit to be reused next time:
    every unit keeps a whole gathered copy alive between steps."""

    def unshard(self):
        if self.is_gathered:
            return
        if getattr(self, "_staging", None) is None:
            self._staging = torch.empty(self.full.numel(), dtype=self.full.dtype,
                                        device=self.full.device)
        self.comm.all_gather(self._staging, self.shard, label=self.tag())
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        self.full.untyped_storage().copy_(self._staging.untyped_storage())


class UnitSwapData(MyUnit):
    """Frees by swapping an empty tensor into self.full (.data =) instead of emptying the
    storage: autograd's saved views keep the old bytes alive until backward."""

    def reshard(self):
        self.full.data = torch.empty(self.full.numel(), dtype=self.full.dtype,
                                     device=self.full.device)
        self.full.untyped_storage().resize_(0)


class UnitNewTensor(MyUnit):
    """Gathers into a brand-new tensor assigned to self.full instead of refilling the storage:
    the views autograd saved in forward do not see the backward's gather."""

    def unshard(self):
        if self.is_gathered:
            return
        self.full = torch.empty(self.padded_numel, dtype=self.full.dtype, device=self.full.device)
        self.comm.all_gather(self.full, self.shard, label=self.tag())


# ---------------------------------------------------------------------------------------------
# Exercise 2: 05_reduce_scatter_grad
# ---------------------------------------------------------------------------------------------

def rs_divide_by_two(flat_grad, comm, label):
    """Divides by a literal 2 (the lab's world size) instead of comm.world_size."""
    mine = torch.empty(flat_grad.numel() // comm.world_size, dtype=flat_grad.dtype,
                       device=flat_grad.device)
    comm.reduce_scatter(mine, flat_grad, label=label)
    return mine.div_(2)


def rs_no_average(flat_grad, comm, label):
    """Returns the sum over the ranks: forgot to divide by N."""
    mine = torch.empty(flat_grad.numel() // comm.world_size, dtype=flat_grad.dtype,
                       device=flat_grad.device)
    comm.reduce_scatter(mine, flat_grad, label=label)
    return mine


def rs_all_reduce_slice(flat_grad, comm, label):
    """Lab 04 habit: all-reduces the whole gradient, then copies out this rank's slice."""
    comm.all_reduce(flat_grad, label=label)
    n = flat_grad.numel() // comm.world_size
    return flat_grad[comm.rank * n:(comm.rank + 1) * n].clone().div_(comm.world_size)


def rs_all_reduce_view(flat_grad, comm, label):
    """All-reduces in place and returns a view of this rank's slice: the shard is a view that
    keeps the unit's whole gradient alive."""
    comm.all_reduce(flat_grad, label=label)
    flat_grad.div_(comm.world_size)
    n = flat_grad.numel() // comm.world_size
    return flat_grad[comm.rank * n:(comm.rank + 1) * n]


_out_buffers = {}


def rs_cached_by_size(flat_grad, comm, label):
    """Reuses one output buffer per size (to avoid allocating every time): two units of the same
    size get the same tensor as their gradient shard."""
    n = flat_grad.numel() // comm.world_size
    key = (n, flat_grad.dtype, flat_grad.device)
    if key not in _out_buffers:
        _out_buffers[key] = torch.empty(n, dtype=flat_grad.dtype, device=flat_grad.device)
    mine = _out_buffers[key]
    comm.reduce_scatter(mine, flat_grad, label=label)
    return mine.div_(comm.world_size)


def rs_float32(flat_grad, comm, label):
    """Reduces in float32 "for precision" whatever the gradient's dtype: a bfloat16 unit gets a
    float32 gradient shard, and a float32 copy of the whole gradient is made."""
    full = flat_grad.float()
    mine = torch.empty(full.numel() // comm.world_size, dtype=torch.float32, device=full.device)
    comm.reduce_scatter(mine, full, label=label)
    return mine.div_(comm.world_size)


def rs_divide_first(flat_grad, comm, label):
    """Averages before the collective, out of place: a second whole-unit gradient is allocated
    (flat_grad / N) just to be reduce-scattered."""
    scaled = flat_grad / comm.world_size
    mine = torch.empty(flat_grad.numel() // comm.world_size, dtype=flat_grad.dtype,
                       device=flat_grad.device)
    comm.reduce_scatter(mine, scaled, label=label)
    return mine


def rs_fixed_label(flat_grad, comm, label):
    """Ignores the label it was given and tags every reduce-scatter "grad"."""
    mine = torch.empty(flat_grad.numel() // comm.world_size, dtype=flat_grad.dtype,
                       device=flat_grad.device)
    comm.reduce_scatter(mine, flat_grad, label="grad")
    return mine.div_(comm.world_size)


# ---------------------------------------------------------------------------------------------

def _unit(cls):
    return lambda: labs.check_unit(cls, world_size=WORLD_SIZE)


def _grad(fn):
    return lambda: labs.check_reduce_scatter_grad(fn, MyUnit, world_size=WORLD_SIZE)


CASES = [
    Case("05_my_unit", "unshard has no early return when already gathered: the root is "
         "all-gathered a second time for backward", _unit(UnitNoGuard)),
    Case("05_my_unit", "storage sized as numel * 4 bytes (fp32 assumed): twice the bytes for a "
         "bfloat16 unit", _unit(UnitFourBytes)),
    Case("05_my_unit", "post_forward frees the root too, so the root is gathered again for "
         "backward", _unit(UnitFreesRoot)),
    Case("05_my_unit", "root test inverted in post_forward: frees only the root, keeps every "
         "block gathered until backward", _unit(UnitInvertedRoot)),
    Case("05_my_unit", "root exception written inside reshard: the root is never freed, not even "
         "after backward", _unit(UnitRootInReshard)),
    Case("05_my_unit", "gathers into a temporary tensor then copies its storage into self.full: "
         "a second unit-sized buffer at every gather", _unit(UnitStagingCopy)),
    Case("05_my_unit", "keeps a per-unit staging buffer for the gather: a whole copy of every unit "
         "stays allocated between steps", _unit(UnitKeptStaging)),
    Case("05_my_unit", "reshard swaps an empty tensor into self.full.data instead of emptying its "
         "storage: saved views keep the old bytes alive", _unit(UnitSwapData)),
    Case("05_my_unit", "unshard gathers into a new tensor assigned to self.full: autograd's saved "
         "views never see the backward gather", _unit(UnitNewTensor)),
    Case("05_reduce_scatter_grad", "divides by a hard-coded 2 instead of comm.world_size",
         _grad(rs_divide_by_two)),
    Case("05_reduce_scatter_grad", "returns the sum over ranks, never divides by N",
         _grad(rs_no_average)),
    Case("05_reduce_scatter_grad", "all-reduces the whole gradient then copies out its slice "
         "(2x the traffic, a whole gradient averaged)", _grad(rs_all_reduce_slice)),
    Case("05_reduce_scatter_grad", "all-reduces in place and returns a view of its slice: the "
         "shard keeps the whole unit gradient alive", _grad(rs_all_reduce_view)),
    Case("05_reduce_scatter_grad", "caches the output buffer by size: units of equal size share "
         "one gradient shard tensor", _grad(rs_cached_by_size)),
    Case("05_reduce_scatter_grad", "reduces in float32 whatever the gradient's dtype: bf16 units "
         "get a float32 shard and an extra fp32 copy", _grad(rs_float32)),
    Case("05_reduce_scatter_grad", "divides out of place before the collective: an extra "
         "whole-unit gradient tensor is allocated", _grad(rs_divide_first)),
    Case("05_reduce_scatter_grad", "ignores the label argument and tags every reduce-scatter "
         "'grad'", _grad(rs_fixed_label)),
]
