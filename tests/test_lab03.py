"""Lab 03's checkers pass the reference DDP and buckets, and name each typical wrong answer.

Every wrong answer below is one a learner writes; the tests assert the plain-word message.
Answers that train to the end are judged together from one launch (``lab03._check_many``, the
code path of ``check_ddp`` and ``check_buckets``); answers that raise or hang get a launch each.
"""

import pytest
import torch
import torch.distributed as dist

from fsdp_mini import labs
from fsdp_mini.labs import lab03

average_gradient = labs.load_solution("03_ddp_hooks", "average_gradient")
wrap_ddp = labs.load_solution("03_ddp_hooks", "wrap_ddp")
Buckets = labs.load_solution("03_buckets", "Buckets")


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    """Outside CI a failed check returns its result (in CI it raises, failing the notebook)."""
    monkeypatch.setenv("CI", "")


def _text(result):
    return "\n".join(msg + " " + hint for _ok, msg, hint in result.lines)


# -- exercise 1: wrap_ddp + average_gradient ----------------------------------------------------

def wrapper(average, broadcast=True, hooks=1):
    """wrap_ddp as a learner writes it, with the chosen average and mistakes."""
    def wrap(module, comm):
        for name, param in module.named_parameters():
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


def stub(param, comm):
    ...


DDP_WRONG = {
    "not dividing": ((wrapper(not_divided), not_divided),
                     "gradients are 2.00x too large: did you divide by the world size?"),
    "averaging twice": ((wrapper(divided_twice), divided_twice),
                        "gradients are 2.00x too small: did you average twice?"),
    "weights": ((wrapper(reduces_weights), reduces_weights),
                "you all-reduced the weights, not the gradients"),
    "no broadcast": ((wrapper(average_gradient, broadcast=False), average_gradient),
                     "rank 1 starts from other weights than rank 0"),
    "hooked twice": ((wrapper(average_gradient, hooks=2), average_gradient),
                     ("each rank sent 222,720 B in a step; the formula 2(N-1)/N x 4Ψ says "
                      "111,360 B (2.00x)")),
}


@pytest.fixture(scope="module")
def ddp_judged():
    pairs = [(wrap_ddp, average_gradient)] + [pair for pair, _ in DDP_WRONG.values()]
    results = lab03._check_many(pairs, 2, 20, **lab03.DDP)
    return dict(zip(["reference", *DDP_WRONG], results))


def test_reference_ddp_passes_against_one_process_torch_ddp_and_the_formula(ddp_judged):
    result = ddp_judged["reference"]
    assert result.passed, result
    text = _text(result)
    for claim in ("SGD with momentum the weights match", "AdamW the weights match",
                  "the same as torch's DistributedDataParallel", "as the formula says"):
        assert claim in text, text
    psi = sum(p.numel() for p in lab03.make_model(lab03.TINY).parameters())
    assert result.facts["sent_per_step"] == [2 * (2 - 1) / 2 * 4 * psi] * lab03.CHECK_STEPS


@pytest.mark.parametrize("mistake", list(DDP_WRONG))
def test_typical_ddp_mistakes_are_named(ddp_judged, mistake):
    result, expected = ddp_judged[mistake], DDP_WRONG[mistake][1]
    assert not result.passed
    assert expected in _text(result), result


def test_adam_hides_a_wrong_scale_that_sgd_shows(ddp_judged):
    text = _text(ddp_judged["not dividing"])
    assert "SGD with momentum the weights differ" in text
    assert "Adam divides by the gradient's size, so it hides a wrong scale" in text


@pytest.mark.parametrize("pair, timeout, expected", [
    ((wrapper(rank1_skips_biases), rank1_skips_biases), 20,
     "the ranks issued different collectives: collective mismatch at step 1"),
    ((forward_hook_wrap, average_gradient), 20,
     "the all-reduce ran before backward produced the gradient (a forward hook?)"),
    ((wrapper(rank0_only_with_dist), rank0_only_with_dist), 2,
     "waited 2 s for a message or collective that never came"),
], ids=["rank skips a parameter", "forward hook", "hang"])
def test_mistakes_that_raise_or_hang_are_one_line(pair, timeout, expected):
    result = labs.check_ddp(*pair, timeout=timeout)
    text = _text(result)
    assert not result.passed and len(result.lines) == 1, text
    assert expected in text and "Traceback" not in text, text


def test_a_stub_is_not_written_yet_without_starting_ranks():
    result = labs.check_ddp(wrap_ddp, stub)
    assert not result.passed and "not written yet: stub" in _text(result)


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


class AllAtTheEnd(Buckets):
    def grad_ready(self, param):
        self.arrived = getattr(self, "arrived", 0) + 1  # and waits for the end of backward

    def backward_done(self):
        for i in range(len(self.buckets)):
            self.missing[i] = 1
            super().grad_ready(self.buckets[i][0])
        super().backward_done()


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


class Stub:
    def __init__(self, buckets, comm):
        ...

    def grad_ready(self, param):
        ...

    def backward_done(self):
        ...


BUCKET_WRONG = {
    NotWaited: "all-reduce(s) per step were not waited for before backward ended",
    NotDivided: "gradients are 2.00x too large: did you divide by the world size?",
    AllAtTheEnd: "every bucket was launched after backward had finished: nothing overlaps",
    Early: "was all-reduced when only",
}


@pytest.fixture(scope="module")
def buckets_judged():
    classes = [Buckets, *BUCKET_WRONG]
    return dict(zip(classes, lab03._check_many(classes, 2, 20, **lab03.BUCKETS)))


def test_reference_buckets_pass_and_overlap_backward(buckets_judged):
    result = buckets_judged[Buckets]
    assert result.passed, result
    assert "started while backward was still running (overlap)" in _text(result)


@pytest.mark.parametrize("cls", list(BUCKET_WRONG), ids=lambda c: c.__name__)
def test_typical_bucket_mistakes_are_named(buckets_judged, cls):
    result = buckets_judged[cls]
    assert not result.passed
    assert BUCKET_WRONG[cls] in _text(result), result


def test_a_bucket_launched_before_its_gradients_exist_is_named_and_a_stub_is_not_written():
    result = labs.check_buckets(OffByOne)
    text = _text(result)
    assert not result.passed and len(result.lines) == 1, text
    assert "a gradient was still None: launch a bucket once every gradient in it" in text, text
    assert "not written yet: grad_ready and backward_done" in _text(labs.check_buckets(Stub))
