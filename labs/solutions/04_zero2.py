"""Reference solution of lab 04, exercise 2: ZeRO-2 = ZeRO-1 with the gradients reduce-scattered."""

import torch

import fsdp_mini
from fsdp_mini import labs

MyZero1 = labs.load_solution("04_zero1", "MyZero1")


class MyZero2(MyZero1):
    strategy = "my_zero2"
    sharded = ("grads", "optim")           # 4Ψ + (4Ψ + 8Ψ)/N
    traffic = "2Ψ"                         # reduce-scatter Ψ + all-gather Ψ: DDP's bytes
    grad_collective = "reduce_scatter"

    def reduce_gradients(self, flat_grad):
        mine = torch.empty_like(self.shard)                 # room for this rank's slice only
        self.comm.reduce_scatter(mine, flat_grad, label="grads")
        self.shard.grad = mine.div_(self.comm.world_size)   # flat_grad is freed on return


fsdp_mini.register_strategy(MyZero2)
