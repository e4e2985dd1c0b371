"""ShardPieces: one nn.Parameter per original parameter over this rank's shard; in_params in the
parameter's own coordinates; add_grads with absent marks, accumulation and frozen pieces."""

import pytest
import torch
from torch import nn

from fsdp_mini.buffers.flat import FlatLayout, ParamSlot, ShardPieces

NEG0 = -0.0


def layout(numels, n, frozen=()):
    return FlatLayout([ParamSlot(None, [], [], shape=torch.Size([k]), requires_grad=i not in frozen)
                       for i, k in enumerate(numels)], n)


def pieces(lay, rank, values=None):
    shard = torch.zeros(lay.shard_numel) if values is None else torch.tensor(values)
    return ShardPieces(lay, shard, rank)


# Two parameters of 5 elements (flat 0..9), by hand for N = 1..5: [lo, hi) of each parameter
# held by each rank, in the parameter's own coordinates; (0, 0) is an empty piece.
FIVE_FIVE = {
    1: [[(0, 5), (0, 5)]],
    2: [[(0, 5), (0, 0)], [(0, 0), (0, 5)]],
    3: [[(0, 4), (0, 0)], [(4, 5), (0, 3)], [(0, 0), (3, 5)]],                    # shards of 4
    4: [[(0, 3), (0, 0)], [(3, 5), (0, 1)], [(0, 0), (1, 4)], [(0, 0), (4, 5)]],  # shards of 3
    5: [[(0, 2), (0, 0)], [(2, 4), (0, 0)], [(4, 5), (0, 1)], [(0, 0), (1, 3)], [(0, 0), (3, 5)]],
}


@pytest.mark.parametrize("n", sorted(FIVE_FIVE))
def test_in_params_five_and_five(n):
    lay = layout([5, 5], n)
    assert [pieces(lay, r).in_params() for r in range(n)] == FIVE_FIVE[n]


def test_in_params_docstring_example_and_padding_rank():
    lay = layout([6, 3], 4)   # w (6) and b (3) over 4 ranks: rank 3 holds only padding
    assert [pieces(lay, r).in_params() for r in range(4)] == [
        [(0, 3), (0, 0)], [(3, 6), (0, 0)], [(0, 0), (0, 3)], [(0, 0), (0, 0)]]
    lay = layout([10], 4)     # rank 3: element 9 of the parameter, then 2 of padding
    assert pieces(lay, 3).in_params() == [(9, 10)]


def test_pieces_are_views_of_the_shard():
    lay = layout([5, 5], 4)
    sp = pieces(lay, 1, [3., 4., 5.])       # rank 1 holds p0[3:5] and p1[0:1]
    assert [p.tolist() for p in sp.params] == [[3., 4.], [5.]]
    assert all(isinstance(p, nn.Parameter) for p in sp.params)
    with torch.no_grad():
        sp.params[0].add_(10.)               # what an optimizer step does
    assert sp.shard.tolist() == [13., 14., 5.]


def test_empty_piece_is_an_empty_parameter():
    sp = pieces(layout([6, 3], 4), 3)
    assert [p.numel() for p in sp.params] == [0, 0]


def test_frozen_slot_makes_a_frozen_piece_that_gets_no_gradient():
    sp = pieces(layout([2, 2], 1, frozen={1}), 0)   # one rank: both pieces whole
    assert [p.requires_grad for p in sp.params] == [True, False]
    sp.add_grads(torch.tensor([1., 2., 3., 4.]), [])
    assert sp.params[0].grad.tolist() == [1., 2.] and sp.params[1].grad is None


def test_add_grads_gives_views_of_the_reduced_shard():
    sp = pieces(layout([5, 5], 4), 1)
    grad = torch.tensor([0.5, 1.5, 2.5])
    sp.add_grads(grad, [])
    assert sp.params[0].grad.tolist() == [0.5, 1.5] and sp.params[1].grad.tolist() == [2.5]
    assert sp.params[1].grad.data_ptr() == grad[2:].data_ptr()
    assert [g.tolist() for g in sp.grads()] == [[0.5, 1.5], [2.5]]


def test_add_grads_accumulates_over_micro_batches():
    sp = pieces(layout([5, 5], 4), 1)
    sp.add_grads(torch.tensor([1., 2., 3.]), [])
    sp.add_grads(torch.tensor([10., 20., 30.]), [])
    assert [p.grad.tolist() for p in sp.params] == [[11., 22.], [33.]]


def test_absent_in_a_later_micro_batch_keeps_the_earlier_gradient():
    sp = pieces(layout([6, 3], 4), 2)
    sp.add_grads(torch.tensor([1., 2., 3.]), [])
    sp.add_grads(torch.tensor([NEG0, NEG0, NEG0]), [1])
    assert sp.params[1].grad.tolist() == [1., 2., 3.]


def test_absent_on_every_rank_keeps_grad_none():
    sp = pieces(layout([6, 3], 4), 2)         # rank 2 holds b whole, w empty
    sp.add_grads(torch.tensor([NEG0, NEG0, NEG0]), [1])
    assert sp.params[1].grad is None
    assert sp.params[0].grad is not None and sp.params[0].grad.numel() == 0  # w had one here
    assert len(sp.grads()) == 1


def test_absent_here_but_used_elsewhere_gets_the_reduced_gradient():
    sp = pieces(layout([6, 3], 4), 2)
    sp.add_grads(torch.tensor([0.25, 0.0, 0.0]), [1])   # another rank used b
    assert sp.params[1].grad.tolist() == [0.25, 0.0, 0.0]


def test_empty_piece_absent_here_gets_no_gradient():
    sp = pieces(layout([6, 3], 4), 3)         # padding only: it cannot tell
    sp.add_grads(torch.tensor([0.0, 0.0, 0.0]), [0, 1])
    assert [p.grad for p in sp.params] == [None, None]


def test_absent_check_reads_each_piece_at_its_own_start():
    sp = pieces(layout([5, 5], 4), 1)         # p0 at shard 0..2, p1 at shard 2..3
    sp.add_grads(torch.tensor([0.5, 0.0, NEG0]), [0, 1])   # p0 used elsewhere, p1 nowhere
    assert sp.params[0].grad.tolist() == [0.5, 0.0] and sp.params[1].grad is None


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    sp = pieces(layout([2, 2], 1), 0)
    sp.add_grads(torch.tensor([1., 2., 3., 4.]), [])
    sp.zero_grad(set_to_none=set_to_none)
    if set_to_none:
        assert [p.grad for p in sp.params] == [None, None] and sp.grads() == []
    else:
        assert [p.grad.tolist() for p in sp.params] == [[0., 0.], [0., 0.]]
