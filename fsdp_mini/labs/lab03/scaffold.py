"""Lab 03's scaffolding: what turns the learner's DDP pieces into strategies of the kit.

``ddp_strategy(wrap_ddp)`` makes a strategy from a function that wraps a module (broadcast,
hooks); ``bucketed_ddp_strategy(Buckets)`` one that cuts the parameters into buckets and drives
the learner's ``Buckets`` class from gradient-ready hooks. Both mark their phases, so the
dashboard and the checkers see what happened when.
"""

from __future__ import annotations

from types import SimpleNamespace

from ...buffers.buckets import BucketScheduler, grad_ready_order, split_into_buckets
from ...comm.collectives import broadcast_module_states
from ...strategy import Strategy
from ...theory import ddp_sent_bytes


class _Watch:
    """The ``comm`` your code gets: the kit's Comm, plus notes on all-reduces for the checker."""

    def __init__(self, comm, strategy):
        self._comm, self._strategy, self.notes = comm, strategy, []
        self.step, self.ticks = 0, 0  # the training step (0: wrapping); hook calls so far

    def __getattr__(self, name):  # rank, world_size, ledger, broadcast, all_gather, ...
        return getattr(self._comm, name)

    def all_reduce(self, tensor, label="all_reduce", async_op=False, op="sum"):
        params = list(self._strategy.module.parameters())
        weights = any(p.data_ptr() == tensor.data_ptr() for p in params)
        # Note: a gradient, or a view of one: what all_reduce changes in place is then .grad
        of_grad = any(p.grad is not None and p.grad.untyped_storage().data_ptr()
                      == tensor.untyped_storage().data_ptr() for p in params)
        # Note: how many of this step's all-reduces are in flight with this one (launched, not
        # yet waited for): buckets that overlap one another, not only backward
        flying = 1 + sum(n["step"] == self.step and not n["waited"] for n in self.notes)
        note = {"weights": weights, "of_grad": of_grad, "waited": not async_op, "async": async_op,
                "hidden": async_op, "in_flight": flying,
                "step": self.step, "tick": self.ticks, **self._strategy.launch_note(tensor)}
        self.notes.append(note)
        handle = self._comm.all_reduce(tensor, label, async_op=async_op, op=op)
        # Note: hidden = backward went on between launch and wait (as on the kit's timeline,
        # where compute is the step less the time spent waiting for collectives)
        return handle and SimpleNamespace(wait=lambda: (handle.wait(), note.update(
            waited=True, hidden=note["hidden"] and self.ticks > note["tick"])))


def ddp_strategy(wrap_ddp, name: str = "my_ddp") -> type[Strategy]:
    """A Strategy class: ``parallelize(model, it)`` calls ``wrap_ddp(module, comm)`` to wrap."""

    class MyDDP(Strategy):
        strategy, traffic = name, "2Ψ"

        def __init__(self, module, comm, recorder=None):
            super().__init__(module, comm, recorder)
            self.watch = _Watch(comm, self)
            module.register_forward_hook(lambda *_: self.mark(name, "forward_done"))
            wrap_ddp(module, self.watch)

        launch_note = staticmethod(lambda tensor: {})  # what the checker learns of an all-reduce

        def sent_bytes_per_step(self) -> float:
            return ddp_sent_bytes(self.numel()[0], self.comm.world_size, self.element_size())

    return MyDDP


def bucketed_ddp_strategy(buckets_class, bucket_mb=0.03, name="my_bucket_ddp") -> type[Strategy]:
    """A Strategy class: rank 0's weights everywhere, buckets of about ``bucket_mb`` MiB (in the
    order gradients arrive) and your class: ``buckets_class(buckets, comm)``, ``.grad_ready(param)``
    as each gradient is accumulated, ``.backward_done()`` once backward is over."""

    class MyBucketDDP(ddp_strategy(broadcast_module_states, name)):  # Note: rank 0's weights

        def __init__(self, module, comm, recorder=None):
            super().__init__(module, comm, recorder)
            self.buckets = split_into_buckets(grad_ready_order(module), int(bucket_mb * 2**20))
            self.learner = buckets_class(self.buckets, self.watch)
            self._ready, self._launched, self._ending = set(), set(), False
            # Note: the kit's scheduler only hooks the gradients and finds the end of backward;
            # when to launch a bucket is for your class to decide (its on_ready does nothing).
            self.scheduler = BucketScheduler(self.buckets, lambda i: None, self._backward_end,
                                             self._grad_ready)

        def _grad_ready(self, i: int, j: int) -> None:
            self._ready.add(id(self.buckets[i][j]))
            self.watch.ticks += 1
            self.learner.grad_ready(self.buckets[i][j])

        def _backward_end(self) -> None:
            self._ending, self.watch.ticks = True, self.watch.ticks + 1
            self.mark(name, "backward_end")  # autograd is done; your backward_done runs now
            self.learner.backward_done()
            for note in self.watch.notes:
                note.setdefault("waited_in_time", note["waited"])
            self._ready, self._launched, self._ending = set(), set(), False
            self.mark(name, "grads_averaged")

        def launch_note(self, tensor) -> dict:
            """Which bucket an all-reduce of this size is, and how full it was at launch."""
            fits = [i for i, b in enumerate(self.buckets)
                    if i not in self._launched and sum(p.numel() for p in b) == tensor.numel()]
            i = next((i for i in fits if all(id(p) in self._ready for p in self.buckets[i])),
                     fits[0] if fits else None)
            if i is not None:
                self._launched.add(i)
                self.mark(f"bucket{i}", "launched")
            bucket = self.buckets[i] if i is not None else []
            return {"bucket": i, "ready": sum(id(p) in self._ready for p in bucket),
                    "of": len(bucket), "in_hook": not self._ending}

    return MyBucketDDP
