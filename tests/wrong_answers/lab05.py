"""Lab 05's wrong answers: a unit that gathers and frees itself, and the post-backward
reduce-scatter, each with one slip, as a learner writes them.

The units are small subclasses of the reference unit; the reductions variants of the reference
function. Each exercise's answers are judged in one batch by ``lab05.JUDGES`` (the code path of
``labs.check_unit`` and ``labs.check_reduce_scatter_grad``, beside the reference, at the lab's
size); ``names`` are phrases of the verdict that name the mistake.
"""

import torch

from fsdp_mini import labs

from . import Wrong

Unit = labs.load_solution("05_my_unit", "MyUnit")
reduce_scatter_grad = labs.load_solution("05_reduce_scatter_grad", "reduce_scatter_grad")


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
    Wrong("05_my_unit", "freed with del", Del, ("after its post_forward", "'bytes still gathered': yours 140, the reference 0", "you dropped self.full", "autograd holds the buffer", "untyped_storage().resize_(0)")),
    Wrong("05_my_unit", "gathered into a new tensor", NewTensor, ("its storage is now empty", "you gathered again into a new tensor, which those views do not see")),
    Wrong("05_my_unit", "not gathered again before backward", NoRegather, ("its storage is now empty", "gather it again in pre_backward")),
    Wrong("05_my_unit", "pre_backward with a pass body", PassPreBackward, ("its storage is now empty", "gather it again in pre_backward")),
    Wrong("05_my_unit", "the root freed after forward", RootFreed, ("unit 'root' after its post_forward", "yours 0, the reference 96", "the root was freed after forward", "reshard only when not is_root")),
    Wrong("05_my_unit", "post_forward with a pass body", PassPostForward, ("unit '0' after its post_forward", "yours 140, the reference 0", "post_forward must free (reshard) every unit but the root")),
    Wrong("05_my_unit", "gathers again though gathered", AlwaysGather, ("yours makes 1 all_gather of 96 b that the reference does not", "return at once when the unit is gathered already")),
    Wrong("05_my_unit", "storage sized without the padding", NoPadding, ("room for 35 elements", "padded to 36 elements, a multiple of n", "the unit has 35 parameters")),
    Wrong("05_my_unit", "storage sized in elements, not bytes", Elements, ("its storage has 24 b, room for 6 elements of 4 b", "resize_ takes a number of bytes")),
    Wrong("05_my_unit", "storage resized, never gathered", ResizedNotGathered, ("after unshard, self.full must hold the unit's 24 elements", "its storage has 24 b, room for 6 elements")),
    Wrong("05_my_unit", "all-gather into an empty storage", GatherWithoutRoom, ("all_gather into a tensor of 24 elements", "its storage has 0 b")),
    Wrong("05_my_unit", "one rank skips the all-gather", OnlyRankZeroGathers, ("collectivemismatcherror", "rank 0 issues all_gather 'root/forward'", "the same collectives, in the same order")),
    Wrong("05_my_unit", "async all-gather never waited", GatherNotWaited, ("your all_gather was issued with async_op=true and never waited", "call .wait()")),
    Wrong("05_reduce_scatter_grad", "missing / N", no_average, ("gradient shards in step 1", "(2x)", "right with world size 1", "n times too large", "divide the sum over ranks by the world size")),
    Wrong("05_reduce_scatter_grad", "divided by N twice", divided_twice, ("gradient shards in step 1", "(0.5x)", "n times too small", "divided by n twice")),
    Wrong("05_reduce_scatter_grad", "all-reduce instead", all_reduce, ("yours makes 1 all_reduce of 96 b", "reduce_scatter of 96 b", "the gradient was all-reduced (2ψ)", "one reduce-scatter (ψ)")),
    Wrong("05_reduce_scatter_grad", "a slice (view) of flat_grad returned", slice_of_flat_grad, ("'a view of flat_grad': yours true, the reference false", "a view keeps the unit's whole gradient alive")),
    Wrong("05_reduce_scatter_grad", "the shard copied back into flat_grad",
          copied_back_into_flat_grad, ("'a view of flat_grad': yours true, the reference false", "a view keeps the unit's whole gradient alive")),
    Wrong("05_reduce_scatter_grad", "output the size of the whole", whole_sized_output, ("reduce_scatter: the full tensor has 36 elements but 2 shards of 36", "n times the elements of each rank's part")),
    Wrong("05_reduce_scatter_grad", "no reduction at all", no_reduction, ("reduce_scatter of 96 b, 1 reduce_scatter of 140 b are missing in yours", "never averaged over the ranks")),
    Wrong("05_reduce_scatter_grad", "async reduce-scatter never waited", not_waited, ("your reduce_scatter was issued with async_op=true and never waited",)),
    Wrong("05_reduce_scatter_grad", "one rank skips the reduce-scatter", only_rank_zero, ("collectivemismatcherror", "rank 0 issues reduce_scatter '0/grad'", "the same collectives, in the same order")),
    Wrong("05_reduce_scatter_grad", "the average computed, not returned", returns_nothing, ("the gradient reduction returned none", "return this rank's averaged shard")),
    Wrong("05_reduce_scatter_grad", "another rank's slice of the sum", wrong_rank_slice, ("yours makes 1 all_reduce of 96 b", "the gradient was all-reduced (2ψ)")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("05")
