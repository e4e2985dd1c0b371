"""Reference solution of lab 03's second exercise: gradient buckets all-reduced during backward."""

import torch


class Buckets:
    """``buckets``: lists of parameters, in the order their gradients arrive in backward."""

    def __init__(self, buckets, comm):
        self.buckets, self.comm = buckets, comm
        self.bucket_of = {id(p): i for i, bucket in enumerate(buckets) for p in bucket}
        self.missing = [len(b) for b in buckets]   # gradients each bucket still waits for
        self.in_flight = []                         # (bucket index, flat tensor, handle)

    def grad_ready(self, param):
        """A post-accumulate-grad hook: param.grad is ready. Launch its bucket once full."""
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            handle = self.comm.all_reduce(flat, label=f"bucket{i}", async_op=True)
            self.in_flight.append((i, flat, handle))  # backward goes on while it travels

    def backward_done(self):
        """Backward is over: wait for each bucket, average, copy back into each .grad."""
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
            for p, g in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                p.grad.copy_(g.view_as(p.grad))
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]
