"""Lab 05's wrong answers: a unit that gathers and frees itself, and the post-backward
reduce-scatter, each with one slip, as a learner writes them.

The units are small subclasses of the reference unit; the reductions variants of the reference
function. The checker runs them as the lab's later cells do (grad mode, forward and backward, the
optimizer's step, the tracker on the last step only) and asserts the lab's formulas (bytes per
step, 16Ψ/N of model state, a gradient shard of 4Ψ/N) on the learner's own objects.
"""

import torch

from fsdp_mini import labs

from . import Wrong

Unit = labs.load_solution("05_my_unit", "MyUnit")
reduce_scatter_grad = labs.load_solution("05_reduce_scatter_grad", "reduce_scatter_grad")


def unit(cls):
    return lambda: labs.check_unit(cls)


def reduction(fn):
    return lambda: labs.check_reduce_scatter_grad(fn, Unit)


# -- exercise 1: the unit -------------------------------------------------------------------------

class Del(Unit):
    def unshard(self):
        if not self.is_gathered:
            self.full = torch.empty(self.padded_numel)
            self.comm.all_gather(self.full, self.shard, label=self.tag())

    def reshard(self):
        del self.full


class NewTensor(Unit):
    def unshard(self):
        if not self.is_gathered:
            self.full = torch.empty(self.padded_numel)
            self.comm.all_gather(self.full, self.shard, label=self.tag())


class NoRegather(Unit):
    def pre_backward(self):
        if self.is_root:
            self.unshard()


class PassPreBackward(Unit):
    def pre_backward(self):
        pass


class RootFreed(Unit):
    def post_forward(self):
        self.reshard()


class PassPostForward(Unit):   # nothing freed after forward: a "written" method doing nothing
    def post_forward(self):
        pass


class AlwaysGather(Unit):
    def unshard(self):
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        self.comm.all_gather(self.full, self.shard, label=self.tag())


class NoPadding(Unit):
    def unshard(self):
        if not self.is_gathered:
            self.full.untyped_storage().resize_(self.numel * self.full.element_size())
            self.comm.all_gather(self.full, self.shard, label=self.tag())


class Elements(Unit):
    def unshard(self):
        if not self.is_gathered:
            self.full.untyped_storage().resize_(self.full.numel())
            self.comm.all_gather(self.full, self.shard, label=self.tag())


class ResizedNotGathered(Unit):
    def unshard(self):
        if not self.is_gathered:
            self.full.untyped_storage().resize_(self.full.numel())


class GatherWithoutRoom(Unit):
    def unshard(self):
        if not self.is_gathered:
            self.comm.all_gather(self.full, self.shard, label=self.tag())


class OnlyRankZeroGathers(Unit):   # one rank skips a collective
    def unshard(self):
        if not self.is_gathered:
            self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
            if self.comm.rank == 0:
                self.comm.all_gather(self.full, self.shard, label=self.tag())


class GatherNotWaited(Unit):
    def unshard(self):
        if not self.is_gathered:
            self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
            self.comm.all_gather(self.full, self.shard, label=self.tag(), async_op=True)


# -- exercise 2: the reduce-scatter ---------------------------------------------------------------

def no_average(flat_grad, comm, label):
    mine = torch.empty(flat_grad.numel() // comm.world_size)
    comm.reduce_scatter(mine, flat_grad, label=label)
    return mine


def divided_twice(flat_grad, comm, label):
    flat_grad /= comm.world_size
    mine = torch.empty(flat_grad.numel() // comm.world_size)
    comm.reduce_scatter(mine, flat_grad, label=label)
    return mine / comm.world_size


def all_reduce(flat_grad, comm, label):
    comm.all_reduce(flat_grad, label=label)
    size = flat_grad.numel() // comm.world_size
    return flat_grad[comm.rank * size:(comm.rank + 1) * size] / comm.world_size


def slice_of_flat_grad(flat_grad, comm, label):   # finding 2: the whole gradient stays alive
    size = flat_grad.numel() // comm.world_size
    mine = flat_grad[comm.rank * size:(comm.rank + 1) * size]
    comm.reduce_scatter(mine, flat_grad.clone(), label=label)
    return mine.div_(comm.world_size)


def copied_back_into_flat_grad(flat_grad, comm, label):
    size = flat_grad.numel() // comm.world_size
    mine = torch.empty(size)
    comm.reduce_scatter(mine, flat_grad, label=label)
    return flat_grad[comm.rank * size:][:size].copy_(mine).div_(comm.world_size)


def whole_sized_output(flat_grad, comm, label):   # the whole where a shard was needed
    mine = torch.empty_like(flat_grad)
    comm.reduce_scatter(mine, flat_grad, label=label)
    return mine[:flat_grad.numel() // comm.world_size] / comm.world_size


def no_reduction(flat_grad, comm, label):
    size = flat_grad.numel() // comm.world_size
    return flat_grad[comm.rank * size:(comm.rank + 1) * size].clone()


def not_waited(flat_grad, comm, label):
    mine = torch.empty(flat_grad.numel() // comm.world_size)
    comm.reduce_scatter(mine, flat_grad, label=label, async_op=True)
    return mine.div_(comm.world_size)


def only_rank_zero(flat_grad, comm, label):
    mine = flat_grad[:flat_grad.numel() // comm.world_size].clone()
    if comm.rank == 0:
        comm.reduce_scatter(mine, flat_grad, label=label)
    return mine.div_(comm.world_size)


def returns_nothing(flat_grad, comm, label):
    mine = torch.empty(flat_grad.numel() // comm.world_size)
    comm.reduce_scatter(mine, flat_grad, label=label)
    mine / comm.world_size   # noqa: B018  (computed, not returned)


def wrong_rank_slice(flat_grad, comm, label):   # the order of ranks
    comm.all_reduce(flat_grad, label=label)
    size, r = flat_grad.numel() // comm.world_size, comm.world_size - 1 - comm.rank
    return flat_grad[r * size:(r + 1) * size] / comm.world_size


WRONG = [
    Wrong("05_my_unit", "freed with del", unit(Del),
          ("unit 'middle': its gathered parameters (128 b) were still alive after reshard",
           "autograd holds it for backward", "untyped_storage().resize_(0)")),
    Wrong("05_my_unit", "gathered into a new tensor", unit(NewTensor),
          ("autograd saved views of the buffer gathered in forward",
           "you gathered again into a new tensor, which those views do not see")),
    Wrong("05_my_unit", "not gathered again before backward", unit(NoRegather),
          ("gather the unit again in pre_backward",)),
    Wrong("05_my_unit", "pre_backward with a pass body", unit(PassPreBackward),
          ("gather the unit again in pre_backward",)),
    Wrong("05_my_unit", "the root freed after forward", unit(RootFreed),
          ("the root was freed after forward and all-gathered again before backward: 32 b more",)),
    Wrong("05_my_unit", "post_forward with a pass body", unit(PassPostForward),
          ("was still gathered after its forward",)),
    Wrong("05_my_unit", "gathers again though gathered", unit(AlwaysGather),
          ("all-gathered the root again before backward, though it was still gathered",)),
    Wrong("05_my_unit", "storage sized without the padding", unit(NoPadding),
          ("room for 15 elements, the unit's parameters without the padding",
           "padded to 16 elements, a multiple of n")),
    Wrong("05_my_unit", "storage sized in elements, not bytes", unit(Elements),
          ("resize_ takes a number of bytes, not of elements",
           "hint: how many bytes is one element?")),
    Wrong("05_my_unit", "storage resized, never gathered", unit(ResizedNotGathered),
          ("after unshard, self.full holds 15 elements but its storage has 15 b",)),
    Wrong("05_my_unit", "all-gather into an empty storage", unit(GatherWithoutRoom),
          ("all_gather into a tensor of", "its storage has room for 0 of them")),
    Wrong("05_my_unit", "one rank skips the all-gather", unit(OnlyRankZeroGathers),
          ("collectivemismatcherror", "all_gather")),
    Wrong("05_my_unit", "async all-gather never waited", unit(GatherNotWaited), ("never waited",)),
    Wrong("05_reduce_scatter_grad", "missing / N", reduction(no_average),
          ("gradients 2x too large", "divide the sum over ranks by the world size")),
    Wrong("05_reduce_scatter_grad", "divided by N twice", reduction(divided_twice),
          ("did you divide twice",)),
    Wrong("05_reduce_scatter_grad", "all-reduce instead", reduction(all_reduce),
          ("the gradient was all-reduced (2ψ)",)),
    Wrong("05_reduce_scatter_grad", "a slice (view) of flat_grad returned", reduction(slice_of_flat_grad),
          ("fsdp keeps only this rank's shard", "a slice (a view) of flat_grad")),
    Wrong("05_reduce_scatter_grad", "the shard copied back into flat_grad",
          reduction(copied_back_into_flat_grad),
          ("fsdp keeps only this rank's shard", "a slice (a view) of flat_grad")),
    Wrong("05_reduce_scatter_grad", "output the size of the whole", reduction(whole_sized_output),
          ("the output of the reduce-scatter has the whole unit's",)),
    Wrong("05_reduce_scatter_grad", "no reduction at all", reduction(no_reduction),
          ("the gradients were never averaged over the ranks",)),
    Wrong("05_reduce_scatter_grad", "async reduce-scatter never waited", reduction(not_waited),
          ("never waited",)),
    Wrong("05_reduce_scatter_grad", "one rank skips the reduce-scatter", reduction(only_rank_zero),
          ("collectivemismatcherror", "reduce_scatter")),
    Wrong("05_reduce_scatter_grad", "the average computed, not returned", reduction(returns_nothing),
          ("returned nothing",)),
    Wrong("05_reduce_scatter_grad", "another rank's slice of the sum", reduction(wrong_rank_slice),
          ("the gradient was all-reduced (2ψ)",)),
]
