"""LocalGradients (no_sync): kept whole flat gradients per group, summed over micro-batches, the
absent slots intersected, taken once, leftovers in the groups' order; check_synced."""

import pytest
import torch

from fsdp_mini.buffers.absent import is_absent
from fsdp_mini.buffers.accumulate import LocalGradients, check_synced
from fsdp_mini.buffers.flat import FlatLayout, ParamSlot

# Two parameters of 2 elements over N = 2: flat [p0 p0 p1 p1], no padding
LAYOUT = FlatLayout([ParamSlot(None, [], [], shape=torch.Size([2])) for _ in range(2)], 2)
LIKE = torch.empty(0)


def grads(g0, g1):
    return LAYOUT.flatten_grads([None if g0 is None else torch.tensor(g0),
                                 None if g1 is None else torch.tensor(g1)], LIKE)


def test_first_keep_holds_the_flat_gradient_itself():
    local, group = LocalGradients(), object()
    flat, absent = grads([1., 2.], None)
    assert not local.owed
    local.keep(group, flat, absent)
    assert local.owed and len(local.tensors()) == 1 and local.tensors()[0] is flat


def test_three_micro_batches_sum_and_the_absent_slot_stays_absent():
    local, group = LocalGradients(), object()
    local.keep(group, *grads([1., 2.], None))
    local.keep(group, *grads([3., 4.], None))
    flat, absent = local.take(group, *grads([5., 6.], None))
    assert absent == [1]
    assert flat[:2].tolist() == [9., 12.] and is_absent(flat[2:]).all()
    assert not local.owed


def test_a_slot_used_in_one_micro_batch_is_not_absent():
    local, group = LocalGradients(), object()
    local.keep(group, *grads([1., 1.], [0., 0.]))   # p1 used, gradient exactly 0
    local.keep(group, *grads([1., 1.], None))
    flat, absent = local.take(group, *grads([1., 1.], None))
    assert absent == []
    assert flat.tolist() == [3., 3., 0., 0.] and not is_absent(flat).any()


def test_present_in_the_last_micro_batch_only():
    local, group = LocalGradients(), object()
    local.keep(group, *grads(None, None))
    flat, absent = local.take(group, *grads([2., 2.], [7., 8.]))
    assert absent == [] and flat.tolist() == [2., 2., 7., 8.]


def test_take_without_anything_kept_returns_its_arguments():
    local, group = LocalGradients(), object()
    flat, absent = grads([1., 2.], None)
    out, out_absent = local.take(group, flat, absent)
    assert out is flat and out_absent == [1]


def test_take_forgets_what_it_took():
    local, group = LocalGradients(), object()
    local.keep(group, *grads([1., 2.], [3., 4.]))
    local.take(group, *grads([0., 0.], [0., 0.]))
    flat, _ = local.take(group, *grads([1., 1.], [1., 1.]))
    assert flat.tolist() == [1., 1., 1., 1.]


def test_groups_are_kept_apart():
    local, a, b = LocalGradients(), object(), object()
    local.keep(a, *grads([1., 1.], [1., 1.]))
    local.keep(b, *grads([10., 10.], [10., 10.]))
    flat, _ = local.take(a, *grads([1., 1.], [1., 1.]))
    assert flat.tolist() == [2., 2., 2., 2.]
    assert local.owed and len(local.tensors()) == 1


def test_leftovers_come_in_the_order_of_groups_with_sorted_absent_slots():
    local, a, b, c = LocalGradients(), object(), object(), object()
    lay3 = FlatLayout([ParamSlot(None, [], [], shape=torch.Size([1])) for _ in range(3)], 1)
    local.keep(b, *lay3.flatten_grads([None, torch.tensor([1.]), None], LIKE))
    local.keep(a, *grads([5., 5.], [5., 5.]))
    out = local.leftovers([a, b, c])
    assert [g for g, _, _ in out] == [a, b]
    assert out[0][1].tolist() == [5., 5., 5., 5.] and out[0][2] == []
    assert out[1][2] == [0, 2]
    assert not local.owed and local.leftovers([a, b, c]) == []


def test_clear_drops_everything():
    local, group = LocalGradients(), object()
    local.keep(group, *grads([1., 2.], [3., 4.]))
    local.clear()
    assert not local.owed and local.tensors() == []
    flat, _ = grads([1., 1.], [1., 1.])
    assert local.take(group, flat, [])[0].tolist() == [1., 1., 1., 1.]


def test_check_synced():
    assert check_synced("fsdp", False) is None
    with pytest.raises(RuntimeError, match=r"^fsdp: optimizer.step\(\) after backward\(\) "
                                           r"under fsdp_mini.no_sync.*never averaged"):
        check_synced("fsdp", True)
