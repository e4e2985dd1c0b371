"""Lab 04's wrong answers: ZeRO-1 and ZeRO-2 with one slip each, as a learner writes them.

Each is a small subclass of the reference solution that changes one method the way a learner might
get it wrong. The checker runs it as the lab's later cells do (grad mode, the flat buffer, the
wrapped optimizer's step and after_step, the tracker on the last step only).
"""

import torch

from fsdp_mini import labs

from . import Wrong

Zero1 = labs.load_solution("04_zero1", "MyZero1")
Zero2 = labs.load_solution("04_zero2", "MyZero2")


def zero1(cls):
    return lambda: labs.check_zero1(cls)


def zero2(cls):
    return lambda: labs.check_zero2(cls)


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
    Wrong("04_zero1", "every rank owns the whole buffer", zero1(Whole),
          ("every rank owns the whole buffer", "no memory saved")),
    Wrong("04_zero1", "ranks in the wrong order", zero1(SwappedRanks),
          ("rank 0 would update elements [30, 60), which are rank 1's slice",)),
    Wrong("04_zero1", "slice size from the unpadded count", zero1(NoPadding),
          ("padding: with ψ = 59 elements on 2 ranks", "belong to no rank")),
    Wrong("04_zero1", "inclusive slice end (hi + 1)", zero1(InclusiveEnd),
          ("slice end off by one", "updated by two ranks", "excludes its end")),
    Wrong("04_zero1", "slice end one short", zero1(EndOneShort),
          ("slice end off by one", "belong to no rank", "excludes its end")),
    Wrong("04_zero1", "missing / N", zero1(NoAverage),
          ("gradients 2x too large", "divide the sum over ranks by the world size", "adamw hides it")),
    Wrong("04_zero1", "divided by N twice", zero1(DividedTwice), ("did you divide twice",)),
    Wrong("04_zero1", "all-reduce of the weights, not the gradients", zero1(AveragesTheWeights),
          ("you averaged the weights, not the gradients",)),
    Wrong("04_zero1", "a copy of the slice kept instead of a view", zero1(CopyOfSlice),
          ("this rank's slice only, but zero-1 keeps the whole averaged gradient",
           "self.shard.grad is a copy", "a view of your slice")),
    Wrong("04_zero1", "ZeRO-2's reduce-scatter into a new shard", zero1(ReduceScatterIntoNewShard),
          ("you reduce-scatter into a new shard: that is zero-2",)),
    Wrong("04_zero1", "reduce-scatter into its slice, the rest left unreduced",
          zero1(ReduceScatterIntoItsSlice), ("you reduce-scatter, zero-2's move", "all-reduce 2ψ")),
    Wrong("04_zero1", "after_step with a pass body", zero1(PassAfterStep),
          ("the ranks drift apart", "no all-gather of the parameters")),
    Wrong("04_zero1", "after_step that gathers nothing", zero1(MarkOnlyAfterStep),
          ("after step 1, rank 1's '", "the ranks drift apart", "no all-gather of the parameters")),
    Wrong("04_zero1", "one rank skips the all-gather", zero1(OnlyRankZeroGathers),
          ("collectivemismatcherror", "rank 0 issues all_gather 'params'")),
    Wrong("04_zero1", "all-gather from self.shard (written in grad mode)", zero1(GathersFromTheParameter),
          ("all-gathers from self.shard", "grad mode", "self.flat[start:stop]")),
    Wrong("04_zero1", "async all-gather never waited", zero1(GatherNotWaited),
          ("never waited",)),
    Wrong("04_zero1", "an error in a rank", zero1(Raises),
          ("raised valueerror: learner's bug (in reduce_gradients: `raise valueerror",)),
    Wrong("04_zero2", "missing / N", zero2(Z2NoAverage), ("gradients 2x too large",)),
    Wrong("04_zero2", "divided by N twice", zero2(Z2DividedTwice), ("did you divide twice",)),
    Wrong("04_zero2", "all-reduce kept, a view of the whole gradient", zero2(Z2AllReduce),
          ("the gradients were all-reduced (2ψ)", "gradients kept after the step: 240 b per rank")),
    Wrong("04_zero2", "the shard written into a slice of flat_grad (a view)",
          zero2(Z2IntoASliceOfFlatGrad), ("zero-2 keeps only this rank's shard",
                                          "a view of flat_grad")),
    Wrong("04_zero2", "reduce-scatter into a whole-sized buffer", zero2(Z2IntoAWholeSizedBuffer),
          ("the size of self.shard",)),
    Wrong("04_zero2", "no reduction at all", zero2(Z2NoReduction),
          ("the gradients were never averaged over the ranks",)),
    Wrong("04_zero2", "one rank skips the reduce-scatter", zero2(Z2OnlyRankZeroReduces),
          ("collectivemismatcherror", "rank 0 issues reduce_scatter 'grads'")),
    Wrong("04_zero2", "async reduce-scatter never waited", zero2(Z2NotWaited), ("never waited",)),
    Wrong("04_zero2", "another rank's slice of the sum", zero2(Z2SumOfTheWrongSlice),
          ("the gradients were all-reduced (2ψ)",)),
    Wrong("04_zero2", "a reference to flat_grad kept on self", zero2(Z2KeepsFlatGrad),
          ("keeps a reference to flat_grad", "zero-2's saving is lost")),
    Wrong("04_zero1", "a copy of flat_grad kept on self", zero1(Z1KeepsFlatGrad),
          ("240 b of other tensors are still alive", "a reference to flat_grad, or to a copy of it")),
    Wrong("04_zero2", "reduce_gradients with a pass body", zero2(Z2PassBody),
          ("never averaged over the ranks",)),
]
