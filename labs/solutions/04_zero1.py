"""Reference solution of lab 04, exercise 1: ZeRO-1 as your DDP plus a sharded optimizer step."""

import fsdp_mini
from fsdp_mini import labs


class MyZero1(labs.ZeroScaffold):
    strategy = "my_zero1"        # the name parallelize() takes
    sharded = ("optim",)         # what it splits over the ranks: 4Ψ + 4Ψ + 8Ψ/N
    traffic = "3Ψ"               # all-reduce 2Ψ + all-gather Ψ

    def my_slice(self):
        size = self.flat.numel() // self.comm.world_size   # padded: a multiple of N
        start = self.comm.rank * size
        return start, start + size

    def reduce_gradients(self, flat_grad):
        self.comm.all_reduce(flat_grad, label="grads")     # your DDP of lab 03, one bucket
        flat_grad /= self.comm.world_size
        start, stop = self.my_slice()
        self.shard.grad = flat_grad[start:stop]            # a view: the optimizer sees its slice,
                                                           # the whole average stays (ZeRO-1 keeps it)

    def after_step(self):
        start, stop = self.my_slice()
        self.comm.all_gather(self.flat, self.flat[start:stop], label="params")


fsdp_mini.register_strategy(MyZero1)
