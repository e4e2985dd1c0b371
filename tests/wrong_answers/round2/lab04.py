"""Fresh wrong answers for lab 04 (ZeRO-1, ZeRO-2), each one plausible learner mistake."""
import torch

from wrong_answers.round2 import Case
from fsdp_mini import labs

# exercise 2 builds on a working ZeRO-1 (the notebook's `Zero1`: the reference when yours fails)
Zero1 = labs.load_solution("04_zero1", "MyZero1")

N_CI = 2   # labs.lab_config() under CI: world_size=2, model="tiny"


# ---------------------------------------------------------------- exercise 1: ZeRO-1 ----------

class _Zero1Base(labs.ZeroScaffold):
    strategy = "my_zero1"
    sharded = ("optim",)
    traffic = "3Ψ"

    def my_slice(self):
        size = self.flat.numel() // self.comm.world_size
        start = self.comm.rank * size
        return start, start + size

    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        flat_grad /= self.comm.world_size
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]

    def after_step(self):
        start, stop = self.my_slice()
        self.comm.all_gather(self.flat, self.flat[start:stop], label="params")


class Zero1SliceHalf(_Zero1Base):
    def my_slice(self):
        size = self.flat.numel() // 2                    # "two ranks": the lab's N
        start = self.comm.rank * size
        return start, start + size


class Zero1DivideByTwo(_Zero1Base):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        flat_grad /= 2                                   # mean of the two ranks
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]


class Zero1NoAverage(_Zero1Base):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")   # the sum, never divided by N
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]


class Zero1GradCopy(_Zero1Base):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        flat_grad /= self.comm.world_size
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop].clone()  # a copy: a second 4Ψ/N beside the average


class Zero1NewTensorAverage(_Zero1Base):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        flat_grad = flat_grad / self.comm.world_size     # a new tensor: the buffer passed stays a sum
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]


class Zero1AverageSliceOnly(_Zero1Base):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop] / self.comm.world_size   # only the slice averaged,
                                                                          # a copy; the whole one dropped


class Zero1AllReduceParams(_Zero1Base):
    def after_step(self):
        start, stop = self.my_slice()
        with torch.no_grad():                            # zero what others own, then sum: 2Ψ, not Ψ
            self.flat[:start] = 0
            self.flat[stop:] = 0
        self.comm.all_reduce(self.flat, label="params")


class Zero1ReduceScatter(_Zero1Base):
    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(self.shard)              # keeps only its gradient slice (that's ZeRO-2)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


# ---------------------------------------------------------------- exercise 2: ZeRO-2 ----------

class _Zero2Base(Zero1):
    strategy = "my_zero2"
    sharded = ("grads", "optim")
    traffic = "2Ψ"
    grad_collective = "reduce_scatter"


class Zero2DivideByTwo(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(2)


class Zero2NoAverage(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine                           # the sum over ranks


class Zero2AllReduceThenCopy(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")   # still DDP's all-reduce: 2Ψ of gradients
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop].clone().div_(self.comm.world_size)


class Zero2SliceOfFullBuffer(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        start, stop = self.my_slice()
        mine = torch.empty_like(flat_grad)[start:stop]   # a view of a whole-size buffer: 4Ψ kept
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


class Zero2InPlaceIntoFlatGrad(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        start, stop = self.my_slice()
        mine = flat_grad[start:stop]                     # in place: the output is a slice of flat_grad
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


class Zero2CachedBuffer(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        if getattr(self, "_grad_buffer", None) is None:  # "allocate once, reuse every step"
            self._grad_buffer = torch.empty_like(self.shard)
        self.comm.reduce_scatter(self._grad_buffer, flat_grad, label="grads")
        self.shard.grad = self._grad_buffer.div_(self.comm.world_size)


class Zero2Fp32Buffer(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        mine = torch.zeros(self.shard.numel())           # default dtype fp32, not the shard's
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


class Zero2KeepsFlatGrad(_Zero2Base):
    def reduce_gradients(self, flat_grad):
        self.last_flat_grad = flat_grad                  # kept "for inspection": the whole 4Ψ stays
        mine = torch.empty_like(self.shard)
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)


def _z1(cls):
    return lambda: labs.check_zero1(cls, world_size=N_CI)


def _z2(cls):
    return lambda: labs.check_zero2(cls, world_size=N_CI)


CASES = [
    Case("04_zero1", "slice size is flat.numel() // 2 (hard-coded two ranks)", _z1(Zero1SliceHalf)),
    Case("04_zero1", "divides the all-reduced gradient by a hard-coded 2", _z1(Zero1DivideByTwo)),
    Case("04_zero1", "never divides by N: the optimizer gets the sum of the gradients", _z1(Zero1NoAverage)),
    Case("04_zero1", "self.shard.grad is a clone of the slice, not a view (extra copy kept)", _z1(Zero1GradCopy)),
    Case("04_zero1", "averages into a new tensor (flat_grad = flat_grad / N): the buffer passed keeps the sum",
         _z1(Zero1NewTensorAverage)),
    Case("04_zero1", "divides only the slice (a new tensor); the whole gradient is left summed and not kept",
         _z1(Zero1AverageSliceOnly)),
    Case("04_zero1", "after_step zeroes the others' slices and all-reduces the parameters instead of all-gathering",
         _z1(Zero1AllReduceParams)),
    Case("04_zero1", "reduce-scatters the gradient (keeps only its slice, ZeRO-2) instead of keeping the whole average",
         _z1(Zero1ReduceScatter)),
    Case("04_zero2", "divides the reduce-scattered shard by a hard-coded 2", _z2(Zero2DivideByTwo)),
    Case("04_zero2", "never divides by N: the shard gradient is the sum", _z2(Zero2NoAverage)),
    Case("04_zero2", "keeps the all-reduce and copies its slice (2Ψ of gradient traffic)", _z2(Zero2AllReduceThenCopy)),
    Case("04_zero2", "the output buffer is a slice of a whole-size empty tensor (keeps 4Ψ alive)",
         _z2(Zero2SliceOfFullBuffer)),
    Case("04_zero2", "reduce-scatters in place into its slice of flat_grad (shard.grad keeps flat_grad alive)",
         _z2(Zero2InPlaceIntoFlatGrad)),
    Case("04_zero2", "one gradient buffer cached on self and reused every step (kept alive between steps)",
         _z2(Zero2CachedBuffer)),
    Case("04_zero2", "output buffer made with torch.zeros(n): fp32, not the shard's dtype", _z2(Zero2Fp32Buffer)),
    Case("04_zero2", "stores flat_grad on self, so the whole gradient is never freed", _z2(Zero2KeepsFlatGrad)),
]
