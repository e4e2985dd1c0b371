"""Lab 03's checkers pass the reference DDP and buckets, and name each typical wrong answer.

Every wrong answer below is one a learner writes; the tests assert the plain-word message.
Answers that train to the end are judged together from one launch (``lab03._check_many``, the
code path of ``check_ddp`` and ``check_buckets``); answers that raise or hang get a launch each.
"""

from types import SimpleNamespace

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
                     ("in step 1 each rank sent 222,720 B; the formula 2(N-1)/N x 4Ψ says "
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


ADAM_HINT = "Adam divides by the gradient's size, so it hides a wrong scale that SGD shows"


@pytest.mark.parametrize("mistake", ["not dividing", "averaging twice"])
def test_adam_hides_a_wrong_scale_that_sgd_shows(ddp_judged, mistake):
    hinted = [msg for _ok, msg, hint in ddp_judged[mistake].lines if hint == ADAM_HINT]
    assert len(hinted) == 1, ddp_judged[mistake]  # on SGD's line only
    assert hinted[0].startswith("after 2 steps of SGD with momentum the weights differ"), hinted


@pytest.mark.parametrize("mistake", ["weights", "no broadcast", "hooked twice"])
def test_the_adam_hint_is_only_for_a_wrong_scale(ddp_judged, mistake):
    assert ADAM_HINT not in _text(ddp_judged[mistake]), ddp_judged[mistake]


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


class Stub:
    def __init__(self, buckets, comm):
        ...

    def grad_ready(self, param):
        ...

    def backward_done(self):
        ...


BUCKET_WRONG = {
    NotWaited: "5 all-reduce(s) per step were not waited for in backward_done",
    NotDivided: "gradients are 2.00x too large: did you divide by the world size?",
    AllAtTheEnd: "every bucket was launched in backward_done, after autograd had finished: "
                 "nothing overlaps",
    Early: "was all-reduced when only",
    NoReset: "your buckets launch right in the first step but not later: step 2 made 0 "
             "all-reduce(s) for 5 buckets reset what you count in backward_done",
    Blocking: "your all-reduces block (async_op=False): backward stopped for each bucket",
    WaitsAtOnce: "you waited for each bucket right after launching it",
    PerParameter: f"{len(list(lab03.make_model(lab03.TINY).parameters()))} all-reduce(s) in the "
                  "first step for 5 buckets one all-reduce of one flat tensor (torch.cat) per bucket",
}


@pytest.fixture(scope="module")
def buckets_judged():
    classes = [Buckets, *BUCKET_WRONG]
    return dict(zip(classes, lab03._check_many(classes, 2, 20, **lab03.BUCKETS)))


def test_reference_buckets_pass_and_overlap_backward(buckets_judged):
    result = buckets_judged[Buckets]
    assert result.passed, result
    assert ("5 of 5 buckets per step were launched once full, with async_op=True, while backward "
            "was still running (overlap)") in _text(result), result


@pytest.mark.parametrize("cls", list(BUCKET_WRONG), ids=lambda c: c.__name__)
def test_typical_bucket_mistakes_are_named(buckets_judged, cls):
    result = buckets_judged[cls]
    assert not result.passed
    assert BUCKET_WRONG[cls] in _text(result), result


@pytest.mark.parametrize("cls", [AllAtTheEnd, Early, NoReset, Blocking, WaitsAtOnce,
                                 PerParameter],
                         ids=lambda c: c.__name__)
def test_no_tick_contradicts_a_launch_that_went_wrong(buckets_judged, cls):
    """A ✘ on when or how often the buckets went out comes with no ✔ on launching or overlap,
    and the ✔ on waiting speaks of backward_done, not of "before backward ended"."""
    result = buckets_judged[cls]
    ticks = [msg for ok, msg, _hint in result.lines if ok]
    assert not [m for m in ticks if "launched" in m or "overlap" in m], result
    assert "before backward ended" not in _text(result), result


def test_counters_not_reset_are_named_not_blamed_on_torch_cat(buckets_judged):
    """Right in step 1, nothing in step 2: the checker says so, step by step."""
    result = buckets_judged[NoReset]
    text = _text(result)
    assert "torch.cat" not in text and "2.5" not in text, text
    assert ("after the backward of step 2 (step 1 was right), the ranks hold different "
            "gradients") in text, text
    assert "in step 2 each rank sent 0 B" in text, text


def test_a_bucket_launched_before_its_gradients_exist_is_named():
    result = labs.check_buckets(OffByOne)
    text = _text(result)
    assert not result.passed and len(result.lines) == 1, text
    assert "a gradient was still None: launch a bucket once every gradient in it" in text, text


class HalfWritten(Buckets):
    def backward_done(self):
        ...


@pytest.mark.parametrize("cls, names", [(Stub, "__init__, grad_ready and backward_done"),
                                        (HalfWritten, "backward_done")])
def test_every_unwritten_method_is_named_without_starting_ranks(cls, names):
    result = labs.check_buckets(cls)
    assert not result.passed and len(result.lines) == 1, result
    assert f"not written yet: {names} (still `...`)" in _text(result), result
