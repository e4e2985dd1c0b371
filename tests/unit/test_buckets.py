"""The DDP / ZeRO buckets: the gradient-ready order, the split into buckets of about
``bucket_bytes``, buckets launched strictly in index order by BucketScheduler, TrainableCheck,
and a ZeRO bucket's flat padded layout with this rank's shard."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fsdp_mini.buffers.buckets import (BucketScheduler, TrainableCheck, grad_ready_order,
                                       split_into_buckets)
from fsdp_mini.zero import ZeroBucket


def params(*numels, dtype=torch.float32):
    return [nn.Parameter(torch.zeros(k, dtype=dtype)) for k in numels]


def indices(buckets, ps):
    where = {id(p): i for i, p in enumerate(ps)}
    return [[where[id(p)] for p in b] for b in buckets]


# numels 3, 5, 2, 4 in fp32: 12, 20, 8 and 16 bytes
@pytest.mark.parametrize("bucket_bytes, expected", [
    (32, [[0, 1], [2, 3]]),        # 12 + 20 = 32 fits exactly; 32 + 8 does not
    (31, [[0], [1, 2], [3]]),      # 12 + 20 > 31; 20 + 8 = 28; 28 + 16 > 31
    (20, [[0], [1], [2], [3]]),
    (1, [[0], [1], [2], [3]]),     # smaller than any parameter: one each, never an empty bucket
    (36, [[0, 1], [2, 3]]),
    (40, [[0, 1, 2], [3]]),        # 12 + 20 + 8 = 40
    (10**9, [[0, 1, 2, 3]]),
])
def test_split_into_buckets(bucket_bytes, expected):
    ps = params(3, 5, 2, 4)
    assert indices(split_into_buckets(ps, bucket_bytes), ps) == expected


def test_bucket_size_counts_bytes_not_elements():
    ps = params(3, 5, 2, 4, dtype=torch.bfloat16)   # 6, 10, 4, 8 bytes
    assert indices(split_into_buckets(ps, 16), ps) == [[0, 1], [2, 3]]
    assert indices(split_into_buckets(ps, 20), ps) == [[0, 1, 2], [3]]


def test_no_parameters_no_buckets():
    assert split_into_buckets([], 100) == []


def test_grad_ready_order_is_reverse_registration_trainable_only():
    m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 4))
    names = {id(p): n for n, p in m.named_parameters()}
    assert [names[id(p)] for p in grad_ready_order(m)] == [
        "1.bias", "1.weight", "0.bias", "0.weight"]
    m[0].bias.requires_grad_(False)
    assert [names[id(p)] for p in grad_ready_order(m)] == ["1.bias", "1.weight", "0.weight"]


def test_grad_ready_order_lists_a_tied_weight_once():
    m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    m[1].weight = m[0].weight
    assert len(grad_ready_order(m)) == 1


def record(buckets):
    events = []
    s = BucketScheduler(buckets, lambda i: events.append(("ready", i)),
                        lambda: events.append("end"),
                        on_grad=lambda i, j: events.append(("grad", i, j)))
    return s, events


def test_a_bucket_launches_as_soon_as_its_gradients_are_in_while_backward_runs_on():
    first, second = nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False)
    s, events = record([[second.weight], [first.weight]])   # the gradient-ready order
    second(first(torch.ones(1, 2))).sum().backward()
    assert events == [("grad", 0, 0), ("ready", 0), ("grad", 1, 0), ("ready", 1), "end"]
    s.remove()


def test_buckets_launch_in_index_order_even_when_gradients_arrive_out_of_it():
    first, second = nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False)
    # bucket 0 holds the *first* layer's weight, whose gradient comes last
    s, events = record([[first.weight], [second.weight]])
    second(first(torch.ones(1, 2))).sum().backward()
    assert events == [("grad", 1, 0), ("grad", 0, 0), ("ready", 0), ("ready", 1), "end"]
    events.clear()
    second(first(torch.ones(1, 2))).sum().backward()   # it starts over each backward
    assert events == [("grad", 1, 0), ("grad", 0, 0), ("ready", 0), ("ready", 1), "end"]
    s.remove()


def test_a_bucket_whose_gradient_never_comes_is_launched_at_backward_end():
    used, unused = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    s, events = record([[used], [unused]])
    (used * 3).sum().backward()
    assert events == [("grad", 0, 0), ("ready", 0), ("ready", 1), "end"]
    s.remove()


def test_remove_unhooks():
    p = nn.Parameter(torch.ones(2))
    s, events = record([[p]])
    s.remove()
    p.sum().backward()
    assert events == []


def test_trainable_check_refuses_a_parameter_unfrozen_after_wrapping():
    m = nn.Linear(2, 2)
    m.bias.requires_grad_(False)
    check = TrainableCheck(m, {id(m.weight)}, "zero2")
    check()
    m.bias.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"^zero2: parameter 'bias' requires grad but was "
                                           r"frozen"):
        check()


# A ZeRO bucket of parameters of 3 and 2 elements (flat 0..4) over N = 4: padded to 8, shards
# of 2: rank 0 [0 1], rank 1 [2 | 3], rank 2 [4 pad], rank 3 [pad pad]
@pytest.mark.parametrize("rank, shard, in_params", [
    (0, [0., 1.], [(0, 2), (0, 0)]),
    (1, [2., 3.], [(2, 3), (0, 1)]),
    (2, [4., 0.], [(0, 0), (1, 2)]),
    (3, [0., 0.], [(0, 0), (0, 0)]),
])
def test_zero_bucket_layout_and_shard(rank, shard, in_params):
    p0, p1 = nn.Parameter(torch.tensor([0., 1., 2.])), nn.Parameter(torch.tensor([3., 4.]))
    bucket = ZeroBucket([p0, p1], SimpleNamespace(rank=rank, world_size=4), full_grads=True)
    assert bucket.flat.tolist() == [0., 1., 2., 3., 4., 0., 0., 0.]
    assert bucket.shard.tolist() == shard and bucket.pieces.in_params() == in_params
    with torch.no_grad():
        bucket.flat[3] = 30.                   # the module's parameters live in the bucket
    assert p1.tolist() == [30., 4.]
    assert bucket.flat_grad.shape == (8,) and (bucket.flat_grad == 0).all()


def test_zero1_full_gradient_buffer_marks_a_parameter_without_gradient():
    p0, p1 = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    bucket = ZeroBucket([p0, p1], SimpleNamespace(rank=0, world_size=2), full_grads=True)
    (p0 * torch.tensor([1., -0.0, 2.])).sum().backward()   # p1 unused; p0's grad has a −0.0
    assert bucket.full_grad_to_reduce() == [1]
    g = bucket.flat_grad
    assert g.tolist() == [1., 0., 2., 0., 0., 0.]
    assert torch.signbit(g).tolist() == [False, False, False, True, True, False]
    assert p0.grad.data_ptr() == g.data_ptr()   # p.grad became a view of the flat buffer
