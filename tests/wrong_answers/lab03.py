"""Lab 03's wrong answers, both exercises: ``wrap_ddp`` + ``average_gradient``, and ``Buckets``."""

from types import SimpleNamespace

import torch
import torch.distributed as dist

from fsdp_mini import labs
from wrong_answers import Wrong

average_gradient = labs.load_solution("03_ddp_hooks", "average_gradient")
wrap_ddp = labs.load_solution("03_ddp_hooks", "wrap_ddp")
Buckets = labs.load_solution("03_buckets", "Buckets")


# -- exercise 1: wrap_ddp + average_gradient ----------------------------------------------------

def wrapper(average, broadcast=True, hooks=1, order=lambda rank, named: named):
    """wrap_ddp as a learner writes it, with the chosen average and mistakes."""
    def wrap(module, comm):
        for name, param in order(comm.rank, list(module.named_parameters())):
            if broadcast:
                comm.broadcast(param.data, label=f"sync/{name}", src=0)
            for _ in range(hooks):
                param.register_post_accumulate_grad_hook(lambda p: average(p, comm))
    return wrap


def not_divided(param, comm):
    comm.all_reduce(param.grad, label="grad")


def divided_twice(param, comm):
    comm.all_reduce(param.grad, label="grad")
    param.grad.div_(comm.world_size)
    param.grad.div_(comm.world_size)


def reduces_weights(param, comm):  # the hook receives the parameter, not its gradient
    comm.all_reduce(param.data, label="grad")
    param.data.div_(comm.world_size)


def reduces_a_copy(param, comm):  # the copy is summed; param.grad is only divided
    comm.all_reduce(param.grad.clone(), label="grad")
    param.grad.div_(comm.world_size)


def never_waits(param, comm):  # async_op=True, the handle dropped: the division races the sum
    comm.all_reduce(param.grad, label="grad", async_op=True)
    param.grad.div_(comm.world_size)


def rank1_skips_biases(param, comm):
    if comm.rank == 1 and param.ndim == 1:
        return
    average_gradient(param, comm)


def rank0_only_with_dist(param, comm):
    if comm.rank == 0:
        dist.all_reduce(param.grad)


def forward_hook_wrap(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=0)
    module.register_forward_hook(lambda m, i, o: [average_gradient(p, comm)
                                                  for p in m.parameters()])


def reverse_on_rank_1(rank, named):
    return named[::-1] if rank == 1 else named


# -- exercise 2: buckets ------------------------------------------------------------------------

class NotWaited(Buckets):
    def backward_done(self):  # reads each sum without handle.wait()
        for i, flat, _handle in self.in_flight:
            flat.div_(self.comm.world_size)
            for p, g in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                p.grad.copy_(g.view_as(p.grad))
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class NotDivided(Buckets):
    def backward_done(self):
        for i, flat, handle in self.in_flight:
            handle.wait()
            for p, g in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                p.grad.copy_(g.view_as(p.grad))
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class DividedTwice(Buckets):
    def backward_done(self):
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
            flat.div_(self.comm.world_size)      # once in the sum's bucket, once "per rank"
            for p, g in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                p.grad.copy_(g.view_as(p.grad))
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class NotCopiedBack(Buckets):
    def backward_done(self):  # the average stays in the flat copy; .grad keeps this rank's own
        for _i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class AllAtTheEnd(Buckets):
    def grad_ready(self, param):
        self.arrived = getattr(self, "arrived", 0) + 1  # and waits for the end of backward

    def backward_done(self):
        for i in range(len(self.buckets)):
            self.missing[i] = 1
            super().grad_ready(self.buckets[i][0])
        super().backward_done()


class ReversedOnRank1(AllAtTheEnd):
    def backward_done(self):  # rank 1 goes through its buckets the other way round
        order = range(len(self.buckets))
        for i in (reversed(order) if self.comm.rank == 1 else order):
            self.missing[i] = 1
            Buckets.grad_ready(self, self.buckets[i][0])
        Buckets.backward_done(self)


class NoReset(Buckets):
    def backward_done(self):  # right in step 1; the counters stay at 0 (then below) after it
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
            for p, g in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                p.grad.copy_(g.view_as(p.grad))
        self.in_flight = []


class Blocking(Buckets):
    def grad_ready(self, param):  # async_op left out: backward stops until each sum is in
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self.comm.all_reduce(flat, label=f"bucket{i}")
            self.in_flight.append((i, flat, SimpleNamespace(wait=lambda: None)))


class WaitsAtOnce(Buckets):
    def grad_ready(self, param):  # async_op=True, but the handle is waited for at once
        before = len(self.in_flight)
        super().grad_ready(param)
        if len(self.in_flight) > before:
            self.in_flight[-1][2].wait()


class PerParameter(Buckets):
    def grad_ready(self, param):  # no bucket at all: one all-reduce per gradient
        self.in_flight.append((param, self.comm.all_reduce(param.grad, "grad", async_op=True)))

    def backward_done(self):
        for param, handle in self.in_flight:
            handle.wait()
            param.grad.div_(self.comm.world_size)
        self.in_flight = []


class Early(Buckets):
    def grad_ready(self, param):  # launches as soon as half the bucket is there, zeros for the rest
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == len(self.buckets[i]) // 2:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in self.buckets[i]])
            self.in_flight.append((i, flat, self.comm.all_reduce(flat, f"bucket{i}", True)))


class OffByOne(Buckets):
    def grad_ready(self, param):  # one gradient too early: the last one is still None
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 1:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self.in_flight.append((i, flat, self.comm.all_reduce(flat, f"bucket{i}", True)))


class Rank1SkipsABucket(Buckets):
    def grad_ready(self, param):  # rank 1 never launches the bucket of the first gradient
        if self.comm.rank == 1 and self.bucket_of[id(param)] == 0:
            return
        super().grad_ready(param)


DDP, BUCKETS = "03_ddp_hooks", "03_buckets"
WRONG = [
    Wrong(DDP, "sum not divided by N", (wrapper(not_divided), not_divided), ("gradient in step 1", "2x", "right with world size 1", "n times too large", "not divided by the world size")),
    Wrong(DDP, "divided by N twice", (wrapper(divided_twice), divided_twice), ("gradient in step 1", "0.5x", "n times too small", "divided by n twice")),
    Wrong(DDP, "all-reduces the weights", (wrapper(reduces_weights), reduces_weights), ("yours 'a weight'", "not its gradient")),
    Wrong(DDP, "no broadcast of rank 0's weights",
          (wrapper(average_gradient, broadcast=False), average_gradient), ("rank 1's weights after wrapping", "right with world size 1", "broadcast each parameter from rank 0")),
    Wrong(DDP, "two hooks per parameter", (wrapper(average_gradient, hooks=2), average_gradient),
          ("more all-reduces than the reference", "one hook per parameter")),
    Wrong(DDP, "all-reduces param.grad.clone()", (wrapper(reduces_a_copy), reduces_a_copy), ("yours 'a copy'", "all-reduced a copy of the gradient", "works in place")),
    Wrong(DDP, "async_op=True, never waited", (wrapper(never_waits), never_waits), ("never waited for", "async_op=true")),
    Wrong(DDP, "rank 1 skips the biases", (wrapper(rank1_skips_biases), rank1_skips_biases), ("collectivemismatcherror", "rank 0 issues all_reduce", "but rank 1 issues", "in the same order")),
    Wrong(DDP, "rank 1 broadcasts its parameters in reverse order",
          (wrapper(average_gradient, order=reverse_on_rank_1), average_gradient), ("collectivemismatcherror", "rank 0 issues broadcast 'sync/0.weight'", "but rank 1 issues broadcast 'sync/2.bias'", "in the same order")),
    Wrong(DDP, "averages in a forward hook", (forward_hook_wrap, average_gradient), ("nonetype", "was still none", "register_post_accumulate_grad_hook")),
    Wrong(DDP, "only rank 0 all-reduces, with dist (hang)",
          (wrapper(rank0_only_with_dist), rank0_only_with_dist), ("yours '0 of them'", "nothing through the comm they were given", "comm.all_reduce")),
    Wrong(BUCKETS, "reads each sum without handle.wait()", NotWaited, ("['waited']: yours false", "not waited for by the end of backward_done")),
    Wrong(BUCKETS, "sum not divided by N", NotDivided, ("gradient in step 1", "2x", "right with world size 1", "n times too large", "not divided by the world size")),
    Wrong(BUCKETS, "divided by N twice", DividedTwice, ("gradient in step 1", "0.5x", "n times too small", "divided by n twice")),
    Wrong(BUCKETS, "the average never copied back into .grad", NotCopiedBack, ("right with world size 1", "the ranks hold different gradients", "not averaged")),
    Wrong(BUCKETS, "every bucket launched in backward_done", AllAtTheEnd, ("['in_hook']: yours false", "launched in backward_done, after autograd had finished")),
    Wrong(BUCKETS, "counters not reset after a step", NoReset, ("bucket all-reduces in step 2", "yours has none", "right in the first step, not in later ones", "reset what you count")),
    Wrong(BUCKETS, "blocking all-reduces (no async_op)", Blocking, ("['async']: yours false", "blocking all-reduces", "async_op=true")),
    Wrong(BUCKETS, "waits for each bucket at once", WaitsAtOnce, ("['overlapped']: yours false", "waited for each bucket right after launching it")),
    Wrong(BUCKETS, "one all-reduce per gradient, no buckets", PerParameter, ("4 all-reduces for 3 buckets", "one all-reduce per bucket")),
    Wrong(BUCKETS, "launched when half full (zeros for the rest)", Early, ("['full']: yours false", "before every gradient in it was ready")),
    Wrong(BUCKETS, "launched one gradient early (off by one)", OffByOne, ("was still none", "a bucket once every gradient in it has arrived")),
    Wrong(BUCKETS, "rank 1 skips a bucket", Rank1SkipsABucket, ("collectivemismatcherror", "rank 0 issues all_reduce 'bucket0'", "but rank 1 issues all_reduce 'bucket1'")),
    Wrong(BUCKETS, "rank 1 launches its buckets in reverse order", ReversedOnRank1, ("['in_hook']: yours false", "launched in backward_done")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("03")
