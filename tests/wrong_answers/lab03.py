"""Lab 03's wrong answers, both exercises: ``wrap_ddp`` + ``average_gradient``, and ``Buckets``.

Answers that train to the end are judged together from one launch per exercise
(``lab03._check_many``, the code path of ``check_ddp`` and ``check_buckets``, each judged alone);
answers that raise or hang get a launch each.
"""

from functools import cache
from types import SimpleNamespace

import torch
import torch.distributed as dist

from fsdp_mini import labs
from fsdp_mini.labs.lab03 import checks as lab03
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


DDP_BATCH = {
    "not dividing": (wrapper(not_divided), not_divided),
    "averaging twice": (wrapper(divided_twice), divided_twice),
    "weights": (wrapper(reduces_weights), reduces_weights),
    "no broadcast": (wrapper(average_gradient, broadcast=False), average_gradient),
    "hooked twice": (wrapper(average_gradient, hooks=2), average_gradient),
    "a copy": (wrapper(reduces_a_copy), reduces_a_copy),
    "no wait": (wrapper(never_waits), never_waits),
}


@cache
def _ddp_judged():
    results = lab03._check_many(list(DDP_BATCH.values()), 2, 20, **lab03.DDP)
    return dict(zip(DDP_BATCH, results))


def ddp(key):
    return lambda: _ddp_judged()[key].finish()


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


BUCKET_BATCH = (NotWaited, NotDivided, DividedTwice, NotCopiedBack, AllAtTheEnd, NoReset,
                Blocking, WaitsAtOnce, PerParameter, Early)


@cache
def _buckets_judged():
    return dict(zip(BUCKET_BATCH, lab03._check_many(list(BUCKET_BATCH), 2, 20, **lab03.BUCKETS)))


def bucketed(cls):
    return lambda: _buckets_judged()[cls].finish()


N_PARAMS = len(list(lab03.make_model(lab03.TINY).parameters()))
DDP, BUCKETS = "03_ddp_hooks", "03_buckets"
WRONG = [
    Wrong(DDP, "sum not divided by N", ddp("not dividing"),
          ("gradients are 2.00x too large: did you divide by the world size?",)),
    Wrong(DDP, "divided by N twice", ddp("averaging twice"),
          ("gradients are 2.00x too small: did you average twice?",)),
    Wrong(DDP, "all-reduces the weights", ddp("weights"),
          ("you all-reduced the weights, not the gradients",)),
    Wrong(DDP, "no broadcast of rank 0's weights", ddp("no broadcast"),
          ("rank 1 starts from other weights than rank 0",)),
    Wrong(DDP, "two hooks per parameter", ddp("hooked twice"),
          ("each rank sent 222,720 b", "(2.00x)")),
    Wrong(DDP, "all-reduces param.grad.clone()", ddp("a copy"),
          ("a copy of the gradient", "in place on the tensor you pass")),
    Wrong(DDP, "async_op=True, never waited", ddp("no wait"),
          ("async_op=true", "never waited")),
    Wrong(DDP, "rank 1 skips the biases",
          lambda: labs.check_ddp(wrapper(rank1_skips_biases), rank1_skips_biases),
          ("the ranks issued different collectives",)),
    Wrong(DDP, "rank 1 broadcasts its parameters in reverse order",
          lambda: labs.check_ddp(wrapper(average_gradient, order=reverse_on_rank_1),
                                 average_gradient),
          ("the ranks issued different collectives", "same order")),
    Wrong(DDP, "averages in a forward hook",
          lambda: labs.check_ddp(forward_hook_wrap, average_gradient),
          ("the all-reduce ran before backward produced the gradient (a forward hook?)",)),
    Wrong(DDP, "only rank 0 all-reduces, with dist (hang)",
          lambda: labs.check_ddp(wrapper(rank0_only_with_dist), rank0_only_with_dist, timeout=2),
          ("waited 2 s for a message or collective that never came",)),
    Wrong(BUCKETS, "reads each sum without handle.wait()", bucketed(NotWaited),
          ("5 all-reduce(s) per step were not waited for in backward_done",)),
    Wrong(BUCKETS, "sum not divided by N", bucketed(NotDivided),
          ("gradients are 2.00x too large: did you divide by the world size?",)),
    Wrong(BUCKETS, "divided by N twice", bucketed(DividedTwice),
          ("gradients are 2.00x too small: did you average twice?",)),
    Wrong(BUCKETS, "the average never copied back into .grad", bucketed(NotCopiedBack),
          ("not averaged", "every bucket was all-reduced", "copy it back into each p.grad")),
    Wrong(BUCKETS, "every bucket launched in backward_done", bucketed(AllAtTheEnd),
          ("every bucket was launched in backward_done, after autograd had finished",)),
    Wrong(BUCKETS, "counters not reset after a step", bucketed(NoReset),
          ("your buckets launch right in the first step but not later: step 2 made 0 "
           "all-reduce(s) for 5 buckets", "reset what you count in backward_done")),
    Wrong(BUCKETS, "blocking all-reduces (no async_op)", bucketed(Blocking),
          ("your all-reduces block (async_op=false)",)),
    Wrong(BUCKETS, "waits for each bucket at once", bucketed(WaitsAtOnce),
          ("you waited for each bucket right after launching it",)),
    Wrong(BUCKETS, "one all-reduce per gradient, no buckets", bucketed(PerParameter),
          (f"{N_PARAMS} all-reduce(s) in the first step for 5 buckets",
           "one all-reduce of one flat tensor (torch.cat) per bucket")),
    Wrong(BUCKETS, "launched when half full (zeros for the rest)", bucketed(Early),
          ("was all-reduced when only",)),
    Wrong(BUCKETS, "launched one gradient early (off by one)", lambda: labs.check_buckets(OffByOne),
          ("a gradient was still none: launch a bucket once every gradient in it",)),
    Wrong(BUCKETS, "rank 1 skips a bucket", lambda: labs.check_buckets(Rank1SkipsABucket),
          ("the ranks issued different collectives",)),
    Wrong(BUCKETS, "rank 1 launches its buckets in reverse order",
          lambda: labs.check_buckets(ReversedOnRank1),
          ("the ranks issued different collectives", "same order")),
]
