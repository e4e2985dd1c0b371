"""Fresh wrong answers for lab 03 (DDP from scratch): 03_ddp_hooks and 03_buckets.

Each answer starts from the reference solution and changes one thing, the way a learner would.
Everything is defined at module level, so the ranks (fresh processes) can find it.
"""

import torch

from wrong_answers.round2 import Case
from fsdp_mini import labs

N_CI, MODEL_CI = 2, "tiny"   # labs.lab_config() under CI


# ============================================================================ 03_ddp_hooks
# --- 1. divides by a literal 2 (the world size the learner tried it on)
def average_gradient_div2(param, comm):
    comm.all_reduce(param.grad, label="grad")
    param.grad.div_(2)


def wrap_ddp_div2(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=0)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_div2(p, comm))


# --- 2. all-reduces the parameter itself (its weights), not its gradient
def average_gradient_weights(param, comm):
    comm.all_reduce(param.data, label="grad")
    param.data.div_(comm.world_size)


def wrap_ddp_weights(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=0)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_weights(p, comm))


# --- 3. out-of-place division rebinds a local name: param.grad keeps the sum
def average_gradient_rebind(param, comm):
    grad = param.grad
    comm.all_reduce(grad, label="grad")
    grad = grad / comm.world_size   # a new tensor; param.grad still holds the sum


def wrap_ddp_rebind(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=0)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_rebind(p, comm))


# --- 4. all-reduces a copy of the gradient and never writes the average back
def average_gradient_copy(param, comm):
    grad = param.grad.detach().clone()   # "don't touch autograd's tensor"
    comm.all_reduce(grad, label="grad")
    grad.div_(comm.world_size)


def wrap_ddp_copy(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=0)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_copy(p, comm))


# --- 5. the hook's lambda uses the loop variable: every hook averages the LAST parameter
def average_gradient_late(param, comm):
    comm.all_reduce(param.grad, label="grad")
    param.grad.div_(comm.world_size)


def wrap_ddp_late(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=0)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_late(param, comm))


# --- 6. every rank starts from the LAST rank's weights, not rank 0's
def average_gradient_src(param, comm):
    comm.all_reduce(param.grad, label="grad")
    param.grad.div_(comm.world_size)


def wrap_ddp_src(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=comm.world_size - 1)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_src(p, comm))


# --- 7. broadcasts only the weight matrices (biases and norms "start at 0 and 1 anyway")
def average_gradient_2d(param, comm):
    comm.all_reduce(param.grad, label="grad")
    param.grad.div_(comm.world_size)


def wrap_ddp_2d(module, comm):
    for name, param in module.named_parameters():
        if param.dim() > 1:
            comm.broadcast(param.data, label=f"sync/{name}", src=0)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_2d(p, comm))


# --- 8. hooks registered for every enclosing module: each gradient all-reduced several times
def average_gradient_dup(param, comm):
    comm.all_reduce(param.grad, label="grad")
    param.grad.div_(comm.world_size)


def wrap_ddp_dup(module, comm):
    for name, param in module.named_parameters():
        comm.broadcast(param.data, label=f"sync/{name}", src=0)
    for layer in module.modules():            # "every layer hooks its parameters"
        for param in layer.parameters():      # recurse=True: ancestors hook them again
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(lambda p: average_gradient_dup(p, comm))


# --- 9. broadcasts the state_dict: a tied weight is sent twice
def average_gradient_sd(param, comm):
    comm.all_reduce(param.grad, label="grad")
    param.grad.div_(comm.world_size)


def wrap_ddp_sd(module, comm):
    for name, tensor in module.state_dict().items():
        comm.broadcast(tensor, label=f"sync/{name}", src=0)
    for param in module.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(lambda p: average_gradient_sd(p, comm))


# ============================================================================ 03_buckets
class _Buckets:
    """The reference logic, which each wrong answer below changes in one place."""

    def __init__(self, buckets, comm):
        self.buckets, self.comm = buckets, comm
        self.bucket_of = {id(p): i for i, bucket in enumerate(buckets) for p in bucket}
        self.missing = [len(b) for b in buckets]
        self.in_flight = []

    def _flat(self, i):
        return torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])

    def _copy_back(self, i, flat):
        for p, g in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
            p.grad.copy_(g.view_as(p.grad))

    def grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = self._flat(i)
            handle = self.comm.all_reduce(flat, label=f"bucket{i}", async_op=True)
            self.in_flight.append((i, flat, handle))

    def backward_done(self):
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
            self._copy_back(i, flat)
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class BucketsNoReset(_Buckets):
    """Counts never reset after a step: right in step 0, nothing launched in step 1."""

    def backward_done(self):
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
            self._copy_back(i, flat)
        self.in_flight = []


class BucketsKeepInFlight(_Buckets):
    """The list of in-flight buckets is never emptied: every step's flat copies stay alive."""

    def backward_done(self):
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
            self._copy_back(i, flat)
        self.missing = [len(b) for b in self.buckets]


class BucketsBlocking(_Buckets):
    """all_reduce without async_op=True: backward stops at each bucket until the sum arrives."""

    def grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = self._flat(i)
            handle = self.comm.all_reduce(flat, label=f"bucket{i}")
            self.in_flight.append((i, flat, handle))

    def backward_done(self):
        for i, flat, handle in self.in_flight:
            if handle is not None:
                handle.wait()
            flat.div_(self.comm.world_size)
            self._copy_back(i, flat)
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class BucketsAllAtEnd(_Buckets):
    """Counts the gradients but launches every bucket only in backward_done: no overlap."""

    def grad_ready(self, param):
        self.missing[self.bucket_of[id(param)]] -= 1

    def backward_done(self):
        for i in range(len(self.buckets)):
            if self.missing[i] == 0:
                flat = self._flat(i)
                handle = self.comm.all_reduce(flat, label=f"bucket{i}", async_op=True)
                self.in_flight.append((i, flat, handle))
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(self.comm.world_size)
            self._copy_back(i, flat)
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class BucketsWaitAtOnce(_Buckets):
    """Launched asynchronously, then waited for at once in the hook: backward cannot go on."""

    def grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = self._flat(i)
            handle = self.comm.all_reduce(flat, label=f"bucket{i}", async_op=True)
            handle.wait()
            self.in_flight.append((i, flat, handle))


class BucketsDiv2(_Buckets):
    """Divides the summed bucket by a literal 2."""

    def backward_done(self):
        for i, flat, handle in self.in_flight:
            handle.wait()
            flat.div_(2)
            self._copy_back(i, flat)
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class BucketsNoDivide(_Buckets):
    """Copies the sum back without dividing by N (AdamW hides it, SGD shows it)."""

    def backward_done(self):
        for i, flat, handle in self.in_flight:
            handle.wait()
            self._copy_back(i, flat)
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


class BucketsKeepFlats(_Buckets):
    """Keeps each bucket's last flat tensor in a per-bucket slot: 4Ψ more alive between steps."""

    def __init__(self, buckets, comm):
        super().__init__(buckets, comm)
        self.flats = [None] * len(buckets)

    def grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            self.flats[i] = self._flat(i)
            handle = self.comm.all_reduce(self.flats[i], label=f"bucket{i}", async_op=True)
            self.in_flight.append((i, self.flats[i], handle))


class BucketsWaitLastOnly(_Buckets):
    """Waits only for the last bucket launched ("they complete in order"), then copies them all."""

    def backward_done(self):
        if self.in_flight:
            self.in_flight[-1][2].wait()
        for i, flat, handle in self.in_flight:
            flat.div_(self.comm.world_size)
            self._copy_back(i, flat)
        self.in_flight = []
        self.missing = [len(b) for b in self.buckets]


def _ddp(wrap, avg):
    return lambda: labs.check_ddp(wrap, avg, world_size=N_CI)


def _buckets(cls):
    return lambda: labs.check_buckets(cls, world_size=N_CI, model=MODEL_CI)


CASES = [
    Case("03_ddp_hooks", "divides the summed gradient by a hard-coded 2 instead of the world size",
         _ddp(wrap_ddp_div2, average_gradient_div2)),
    Case("03_ddp_hooks", "all-reduces and divides the parameter's weights (param.data), not param.grad",
         _ddp(wrap_ddp_weights, average_gradient_weights)),
    Case("03_ddp_hooks", "divides out of place into a local name, so param.grad keeps the sum",
         _ddp(wrap_ddp_rebind, average_gradient_rebind)),
    Case("03_ddp_hooks", "all-reduces a clone of the gradient and never copies the average back",
         _ddp(wrap_ddp_copy, average_gradient_copy)),
    Case("03_ddp_hooks", "hook lambda captures the loop variable: every hook averages the last parameter",
         _ddp(wrap_ddp_late, average_gradient_late)),
    Case("03_ddp_hooks", "broadcasts from the last rank instead of rank 0",
         _ddp(wrap_ddp_src, average_gradient_src)),
    Case("03_ddp_hooks", "broadcasts only 2-D weights, leaving biases and norm parameters unsynced",
         _ddp(wrap_ddp_2d, average_gradient_2d)),
    Case("03_ddp_hooks", "registers hooks for every enclosing module, so each gradient is all-reduced several times",
         _ddp(wrap_ddp_dup, average_gradient_dup)),
    Case("03_ddp_hooks", "broadcasts the state_dict, sending a tied weight twice",
         _ddp(wrap_ddp_sd, average_gradient_sd)),
    Case("03_buckets", "bucket counts not reset after backward_done (right in the first step only)",
         _buckets(BucketsNoReset)),
    Case("03_buckets", "in-flight list never emptied: every step's bucket copies stay alive",
         _buckets(BucketsKeepInFlight)),
    Case("03_buckets", "blocking all-reduce (no async_op=True): nothing overlaps backward",
         _buckets(BucketsBlocking)),
    Case("03_buckets", "every bucket launched only in backward_done, none during backward",
         _buckets(BucketsAllAtEnd)),
    Case("03_buckets", "async all-reduce waited for at once in the gradient hook",
         _buckets(BucketsWaitAtOnce)),
    Case("03_buckets", "divides each bucket's sum by a hard-coded 2",
         _buckets(BucketsDiv2)),
    Case("03_buckets", "copies the bucket's sum back without dividing by N",
         _buckets(BucketsNoDivide)),
    Case("03_buckets", "keeps every bucket's flat tensor alive between steps",
         _buckets(BucketsKeepFlats)),
    Case("03_buckets", "waits only for the last bucket's handle, the others never waited for",
         _buckets(BucketsWaitLastOnly)),
]
