"""FlatLayout: offsets, padding to a multiple of N, shard ranges, pieces in shard coordinates,
flatten / views / flatten_grads; param_slots (tied weights once, with both names)."""

import pytest
import torch
from torch import nn

from fsdp_mini.buffers.flat import FlatLayout, ParamSlot, param_slots


def layout(numels, n):
    return FlatLayout([ParamSlot(None, [], [], shape=torch.Size([k])) for k in numels], n)


# numels, N -> offsets, numel, padded_numel, shard_numel (worked out by hand)
@pytest.mark.parametrize("numels, n, offsets, numel, padded, shard", [
    ([10], 4, [0], 10, 12, 3),            # 10 over 4 ranks: 2 elements of padding
    ([6, 3], 4, [0, 6], 9, 12, 3),        # the module docstring's w (2x3) and b (3)
    ([5], 1, [0], 5, 5, 5),               # one rank: never padded
    ([5], 2, [0], 5, 6, 3),
    ([7], 3, [0], 7, 9, 3),
    ([7], 5, [0], 7, 10, 2),
    ([8], 4, [0], 8, 8, 2),               # divides: no padding
    ([2, 3, 4], 5, [0, 2, 5], 9, 10, 2),
    ([1, 1, 1], 5, [0, 1, 2], 3, 5, 1),
    ([4, 0, 3], 2, [0, 4, 4], 7, 8, 4),   # an empty parameter takes no room
    ([], 3, [], 0, 3, 1),                 # nothing at all: still one element per rank
    ([0], 2, [0], 0, 2, 1),
])
def test_offsets_and_padding(numels, n, offsets, numel, padded, shard):
    lay = layout(numels, n)
    assert [s.offset for s in lay.slots] == offsets
    assert (lay.numel, lay.padded_numel, lay.shard_numel) == (numel, padded, shard)


@pytest.mark.parametrize("n, ranges", [
    (1, [(0, 10)]),
    (2, [(0, 5), (5, 10)]),
    (3, [(0, 4), (4, 8), (8, 12)]),
    (4, [(0, 3), (3, 6), (6, 9), (9, 12)]),
    (5, [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]),
])
def test_shard_ranges_of_ten_elements(n, ranges):
    lay = layout([10], n)
    assert [lay.shard_range(r) for r in range(n)] == ranges


# piece_ranges: per slot, the part inside the rank's shard, in *shard* coordinates
@pytest.mark.parametrize("numels, n, per_rank", [
    ([10], 4, [[(0, 3)], [(0, 3)], [(0, 3)], [(0, 1)]]),   # rank 3: element 9, then 2 padding
    ([6, 3], 4, [[(0, 3), (0, 0)], [(0, 3), (0, 0)], [(0, 0), (0, 3)], [(0, 0), (0, 0)]]),
    ([3, 4, 2], 3, [[(0, 3), (0, 0), (0, 0)], [(0, 0), (0, 3), (0, 0)],
                    [(0, 0), (0, 1), (1, 3)]]),
    ([5, 5], 4, [[(0, 3), (0, 0)], [(0, 2), (2, 3)], [(0, 0), (0, 3)], [(0, 0), (0, 1)]]),
    ([5, 5], 1, [[(0, 5), (5, 10)]]),
])
def test_piece_ranges(numels, n, per_rank):
    lay = layout(numels, n)
    assert [lay.piece_ranges(r) for r in range(n)] == per_rank


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("numels", [[10], [5, 5], [1, 6, 2], [3, 0, 4]])
def test_pieces_of_all_ranks_cover_each_parameter_once(numels, n):
    lay = layout(numels, n)
    for i, k in enumerate(numels):
        assert sum(hi - lo for lo, hi in (lay.piece_ranges(r)[i] for r in range(n))) == k


def test_flatten_concatenates_and_pads_with_zeros():
    w = torch.tensor([[1., 2., 3.], [4., 5., 6.]])
    b = torch.tensor([7., 8., 9.])
    lay = FlatLayout([ParamSlot(nn.Parameter(w.clone()), [], []),
                      ParamSlot(nn.Parameter(b.clone()), [], [])], 4)
    flat = lay.flatten([w, b])
    assert flat.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0]
    assert flat.dtype == torch.float32
    assert lay.flatten([w.double(), b.double()]).dtype == torch.float64


def test_views_have_the_parameters_shapes_and_share_the_buffer():
    lay = FlatLayout([ParamSlot(None, [], [], shape=torch.Size([2, 3])),
                      ParamSlot(None, [], [], shape=torch.Size([3]))], 4)
    flat = torch.arange(12.)
    w, b = lay.views(flat)
    assert w.shape == (2, 3) and b.shape == (3,)
    assert w.tolist() == [[0, 1, 2], [3, 4, 5]] and b.tolist() == [6, 7, 8]
    b[0] = 100.
    assert flat[6] == 100.
    assert lay.slot_view(flat, 1).tolist() == [100, 7, 8]


def test_flatten_grads_marks_missing_gradients_and_fixes_negative_zeros():
    lay = FlatLayout([ParamSlot(None, [], [], shape=torch.Size([2, 3])),
                      ParamSlot(None, [], [], shape=torch.Size([3]))], 4)
    g_w = torch.tensor([[1., -0.0, 2.], [0.0, -3., -0.0]])
    flat, absent = lay.flatten_grads([g_w, None], like=torch.empty(0))
    assert absent == [1]
    assert flat.shape == (12,) and flat.dtype == torch.float32
    assert flat[:6].tolist() == [1, 0, 2, 0, -3, 0]
    assert not torch.signbit(flat[:6][flat[:6] == 0]).any()       # real zeros are +0.0
    assert (flat[6:9] == 0).all() and torch.signbit(flat[6:9]).all()  # absent: -0.0
    assert (flat[9:] == 0).all() and not torch.signbit(flat[9:]).any()  # padding: +0.0
    assert g_w[0, 1].item() == 0 and torch.signbit(g_w[0, 1])     # the gradient is not touched


def test_flatten_grads_takes_dtype_from_like():
    lay = layout([2], 3)
    flat, absent = lay.flatten_grads([torch.tensor([1.5, 2.5])], like=torch.empty(0, dtype=torch.float64))
    assert absent == [] and flat.dtype == torch.float64 and flat.tolist() == [1.5, 2.5, 0.0]


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.mid = nn.Linear(3, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight


def test_param_slots_lists_a_tied_weight_once_with_both_names():
    m = Tied()
    slots = param_slots(m)
    assert [s.names for s in slots] == [["emb.weight", "head.weight"], ["mid.weight"], ["mid.bias"]]
    assert slots[0].owners == [(m.emb, "weight"), (m.head, "weight")]
    assert slots[0].param is m.emb.weight
    assert [s.numel for s in slots] == [15, 9, 3]
    lay = FlatLayout(slots, 4)
    assert [s.offset for s in slots] == [0, 15, 24] and lay.padded_numel == 28


def test_param_slots_prefix_and_frozen():
    m = Tied()
    m.mid.bias.requires_grad_(False)
    slots = param_slots(m, prefix="unit")
    assert slots[0].names == ["unit.emb.weight", "unit.head.weight"]
    assert [s.requires_grad for s in slots] == [True, True, False]
