"""A strategy written outside the kit, as a learner would: DDP without buckets.

Every gradient is all-reduced on its own as soon as autograd has accumulated it. Registering it
is one line; everything else of the kit (parallelize, the ledger, expected_costs, track_memory,
full_state_dict, clip_grad_norm_) works on it unchanged.
"""


import fsdp_mini
from fsdp_mini.comm.collectives import broadcast_module_states
from fsdp_mini.theory import ddp_sent_bytes


class NaiveDDP(fsdp_mini.Strategy):
    strategy = "naive_ddp"
    traffic = "2Ψ"

    def __init__(self, module, comm, recorder=None):
        super().__init__(module, comm, recorder)
        broadcast_module_states(module, comm)
        for name, p in module.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._average)

    def _average(self, param):
        self.comm.all_reduce(param.grad, label="grad")
        param.grad.div_(self.comm.world_size)

    def sent_bytes_per_step(self):
        return ddp_sent_bytes(self.numel()[0], self.comm.world_size, self.element_size())


fsdp_mini.register_strategy(NaiveDDP)
