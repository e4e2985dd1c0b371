"""Lab 04's wrong answers: ZeRO-1 and ZeRO-2 with one slip each, as a learner writes them.

Each is a small subclass of the reference solution that changes one method the way a learner might
get it wrong. Each exercise's answers are judged in one batch by ``lab04.JUDGES`` (the code path
of ``labs.check_zero1`` and ``labs.check_zero2``, beside the reference, at the lab's size);
``names`` are phrases of the verdict that name the mistake.
"""

import torch

from fsdp_mini import labs

from . import Wrong

Zero1 = labs.load_solution("04_zero1", "MyZero1")
Zero2 = labs.load_solution("04_zero2", "MyZero2")


# -- exercise 1: ZeRO-1 ---------------------------------------------------------------------------

class Whole(Zero1):
    def my_slice(self):
        return 0, self.flat.numel()


class SwappedRanks(Zero1):
    def my_slice(self):
        size = self.flat.numel() // self.comm.world_size
        r = self.comm.world_size - 1 - self.comm.rank
        return r * size, (r + 1) * size


class NoPadding(Zero1):
    def my_slice(self):
        size = sum(p.numel() for p in self.module.parameters()) // self.comm.world_size
        return self.comm.rank * size, (self.comm.rank + 1) * size


class InclusiveEnd(Zero1):
    def my_slice(self):
        size = self.flat.numel() // self.comm.world_size
        lo, hi = self.comm.rank * size, (self.comm.rank + 1) * size - 1   # the last element
        return lo, hi + 1 + 1    # "hi is inclusive, so + 1", on an end that was exclusive already


class EndOneShort(Zero1):
    def my_slice(self):
        size = self.flat.numel() // self.comm.world_size
        start = self.comm.rank * size
        return start, start + size - 1


class NoAverage(Zero1):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]


class DividedTwice(Zero1):
    def reduce_gradients(self, flat_grad):
        flat_grad /= self.comm.world_size
        self.comm.all_reduce(flat_grad, label="grads")
        flat_grad /= self.comm.world_size
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]


class AveragesTheWeights(Zero1):   # all-reduce the weights instead of the gradients
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(self.flat, label="grads")
        self.flat /= self.comm.world_size
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]


class CopyOfSlice(Zero1):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        flat_grad /= self.comm.world_size
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop].clone()


class ReduceScatterIntoNewShard(Zero1):   # ZeRO-2's reduce_gradients in exercise 1
    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


class ReduceScatterIntoItsSlice(Zero1):   # the whole buffer kept, but only its slice averaged
    def reduce_gradients(self, flat_grad):
        start, stop = self.my_slice()
        self.comm.reduce_scatter(flat_grad[start:stop], flat_grad.clone(), label="grads")
        flat_grad /= self.comm.world_size
        self.shard.grad = flat_grad[start:stop]


class PassAfterStep(Zero1):
    def after_step(self):
        pass


class MarkOnlyAfterStep(Zero1):
    def after_step(self):
        self.mark("params", "not gathered")


class OnlyRankZeroGathers(Zero1):
    def after_step(self):
        if self.comm.rank == 0:
            start, stop = self.my_slice()
            self.comm.all_gather(self.flat, self.flat[start:stop], label="params")


class GathersFromTheParameter(Zero1):   # finding 1: passed the check, crashed section 4
    def after_step(self):
        self.comm.all_gather(self.flat, self.shard, label="params")


class GatherNotWaited(Zero1):
    def after_step(self):
        start, stop = self.my_slice()
        self.comm.all_gather(self.flat, self.flat[start:stop], label="params", async_op=True)


class Raises(Zero1):
    def reduce_gradients(self, flat_grad):
        raise ValueError("learner's bug")


# -- exercise 2: ZeRO-2 ---------------------------------------------------------------------------

class Z2NoAverage(Zero2):
    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine


class Z2DividedTwice(Zero2):
    def reduce_gradients(self, flat_grad):
        flat_grad /= self.comm.world_size
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


class Z2AllReduce(Zero2):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        flat_grad /= self.comm.world_size
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]


class Z2IntoASliceOfFlatGrad(Zero2):   # a view of the whole buffer: the whole gradient stays
    def reduce_gradients(self, flat_grad):
        start, stop = self.my_slice()
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = flat_grad[start:stop].copy_(mine).div_(self.comm.world_size)


class Z2IntoAWholeSizedBuffer(Zero2):   # the whole where a shard was needed
    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(flat_grad)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        start, stop = self.my_slice()
        self.shard.grad = mine[start:stop].div_(self.comm.world_size)


class Z2NoReduction(Zero2):
    def reduce_gradients(self, flat_grad):
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop].clone()


class Z2OnlyRankZeroReduces(Zero2):
    def reduce_gradients(self, flat_grad):
        mine = torch.zeros_like(self.shard)
        if self.comm.rank == 0:
            self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


class Z2NotWaited(Zero2):
    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads", async_op=True)
        self.shard.grad = mine.div_(self.comm.world_size)


class Z2SumOfTheWrongSlice(Zero2):   # a shard of someone else's rank: the order of ranks
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        n, size = self.comm.world_size, self.shard.numel()
        r = n - 1 - self.comm.rank
        self.shard.grad = flat_grad[r * size:(r + 1) * size].clone().div_(n)


class Z2KeepsFlatGrad(Zero2):   # the newcomer trial: a reference to the whole gradient kept
    def reduce_gradients(self, flat_grad):
        self.full = flat_grad
        super().reduce_gradients(flat_grad)


class Z1KeepsFlatGrad(Zero1):   # a second reference to the whole buffer, on top of .grad's
    def reduce_gradients(self, flat_grad):
        self.kept = flat_grad.clone()
        super().reduce_gradients(flat_grad)


class Z2PassBody(Zero2):
    def reduce_gradients(self, flat_grad):
        pass


WRONG = [
    Wrong("04_zero1", "every rank owns the whole buffer", Whole, ("my_slice(): yours (0, 60), the reference (0, 30)", "every rank owns the whole buffer: no optimizer state saved")),
    Wrong("04_zero1", "ranks in the wrong order", SwappedRanks, ("rank 0's my_slice(): yours (30, 60), the reference (0, 30)", "rank r owns slice r")),
    Wrong("04_zero1", "slice size from the unpadded count", NoPadding, ("my_slice(): yours (0, 29), the reference (0, 30)", "59 parameters padded to 60", "element(s) 58..58 belong to no rank", "counts the parameters without the padding")),
    Wrong("04_zero1", "inclusive slice end (hi + 1)", InclusiveEnd, ("my_slice(): yours (0, 60), the reference (0, 59)", "a python slice [start, stop) holds stop - start elements")),
    Wrong("04_zero1", "slice end one short", EndOneShort, ("my_slice(): yours (0, 58), the reference (0, 59)", "element(s) 58..58 belong to no rank", "a python slice [start, stop) holds stop - start elements")),
    Wrong("04_zero1", "missing / N", NoAverage, ("gradient shard rank 0's optimizer got in step 1", "(2x)", "right with world size 1", "n times too large", "divide the sum over ranks by the world size")),
    Wrong("04_zero1", "divided by N twice", DividedTwice, ("gradient shard rank 0's optimizer got in step 1", "(0.5x)", "n times too small", "divided by n twice")),
    Wrong("04_zero1", "all-reduce of the weights, not the gradients", AveragesTheWeights, ("'wrote into self.flat (the weights)': yours true, the reference false", "you averaged the weights", "not the gradients")),
    Wrong("04_zero1", "a copy of the slice kept instead of a view", CopyOfSlice, ("'left self.shard.grad a view of flat_grad': yours false, the reference true", "zero-1 keeps the whole averaged gradient", "a view of your slice")),
    Wrong("04_zero1", "ZeRO-2's reduce-scatter into a new shard", ReduceScatterIntoNewShard, ("yours makes 1 reduce_scatter of 236 b", "the reference's 1 all_reduce of 236 b is missing", "zero-2's move", "all-reduce flat_grad (2ψ)")),
    Wrong("04_zero1", "reduce-scatter into its slice, the rest left unreduced",
          ReduceScatterIntoItsSlice, ("yours makes 1 reduce_scatter of 236 b", "the reference's 1 all_reduce of 236 b is missing", "zero-2's move")),
    Wrong("04_zero1", "after_step with a pass body", PassAfterStep, ("the reference's 1 all_gather of 236 b is missing in yours", "no all-gather after the step", "the ranks drift apart")),
    Wrong("04_zero1", "after_step that gathers nothing", MarkOnlyAfterStep, ("the reference's 1 all_gather of 236 b is missing in yours", "no all-gather after the step")),
    Wrong("04_zero1", "one rank skips the all-gather", OnlyRankZeroGathers, ("collectivemismatcherror", "rank 0 issues all_gather 'params'", "the same collectives, in the same order")),
    Wrong("04_zero1", "all-gather from self.shard (written in grad mode)", GathersFromTheParameter, ("created in no_grad mode", "self.comm.all_gather(self.flat, self.shard", "gather from a plain view, self.flat[start:stop], not from self.shard")),
    Wrong("04_zero1", "async all-gather never waited", GatherNotWaited, ("collectives never waited for in step 1", "async_op=true was never waited for")),
    Wrong("04_zero1", "an error in a rank", Raises, ("raised valueerror: learner's bug", "in reduce_gradients")),
    Wrong("04_zero2", "missing / N", Z2NoAverage, ("gradient shard rank 0's optimizer got in step 1", "(2x)", "n times too large")),
    Wrong("04_zero2", "divided by N twice", Z2DividedTwice, ("gradient shard rank 0's optimizer got in step 1", "(0.5x)", "divided by n twice")),
    Wrong("04_zero2", "all-reduce kept, a view of the whole gradient", Z2AllReduce, ("yours makes 1 all_reduce of 236 b", "the gradients were all-reduced (2ψ)", "one reduce-scatter (ψ)")),
    Wrong("04_zero2", "the shard written into a slice of flat_grad (a view)",
          Z2IntoASliceOfFlatGrad, ("'left self.shard.grad a view of flat_grad': yours true, the reference false", "a view keeps the whole buffer alive")),
    Wrong("04_zero2", "reduce-scatter into a whole-sized buffer", Z2IntoAWholeSizedBuffer, ("reduce_scatter: the full tensor has 60 elements but 2 shards of 60", "self.flat.numel() // n elements, self.shard's size")),
    Wrong("04_zero2", "no reduction at all", Z2NoReduction, ("the reference's 1 reduce_scatter of 236 b is missing in yours", "never averaged over the ranks")),
    Wrong("04_zero2", "one rank skips the reduce-scatter", Z2OnlyRankZeroReduces, ("collectivemismatcherror", "rank 0 issues reduce_scatter 'grads'", "the same collectives, in the same order")),
    Wrong("04_zero2", "async reduce-scatter never waited", Z2NotWaited, ("collectives never waited for in step 1", "async_op=true was never waited for")),
    Wrong("04_zero2", "another rank's slice of the sum", Z2SumOfTheWrongSlice, ("yours makes 1 all_reduce of 236 b", "the gradients were all-reduced (2ψ)")),
    Wrong("04_zero2", "a reference to flat_grad kept on self", Z2KeepsFlatGrad, ("bytes alive after step 1 'comm_buffers': yours 236, the reference 0", "keeps flat_grad, or a tensor made from it")),
    Wrong("04_zero1", "a copy of flat_grad kept on self", Z1KeepsFlatGrad, ("bytes alive after step 1 'activations': yours 236, the reference 0", "keeps flat_grad, or a tensor made from it")),
    Wrong("04_zero2", "reduce_gradients with a pass body", Z2PassBody, ("yours has none", "the optimizer got no gradient", "must set self.shard.grad")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("04")
