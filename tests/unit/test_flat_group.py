"""FlatGroup: shard at construction (originals freed), unshard by all-gather (once), reshard to the
pieces, param_dtype, prefetch, and the flat gradient (absent slots marked) its backward hands on.

The N ranks are N groups built in this one process on copies of one module; their comm gathers
every group's ``send_buffer()``, which is what an all-gather over real ranks delivers."""

import pytest
import torch
from torch import nn

from fsdp_mini.comm.ledger import Tag
from fsdp_mini.fsdp.group import FlatGroup
from fsdp_mini.buffers.flat import param_slots


class Handle:
    waits = 0

    def wait(self):
        self.waits += 1


class World:
    """The groups of every rank; ``calls`` what each rank's comm was asked for."""

    def __init__(self, n):
        self.n, self.groups, self.calls, self.handles = n, [None] * n, [], []
        self.comm = lambda rank: FakeComm(self, rank)


class FakeComm:
    """Rank ``rank``'s comm: its all-gather concatenates every rank's send buffer."""

    def __init__(self, world, rank):
        self.world, self.rank, self.world_size = world, rank, world.n

    def all_gather(self, output, shard, label, async_op=False):
        self.world.calls.append((self.rank, label, shard.dtype, async_op))
        output.copy_(torch.cat([g.send_buffer() for g in self.world.groups]))
        if async_op:
            self.world.handles.append(Handle())
            return self.world.handles[-1]


def linear():
    lin = nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.arange(6.).view(2, 3))
        lin.bias.copy_(torch.tensor([6., 7.]))
    return lin


def build(n, make=linear, **kw):
    world, modules = World(n), []
    for r in range(n):
        m = make()
        modules.append(m)
        world.groups[r] = FlatGroup(param_slots(m), world.comm(r), "lin", True, **kw)
    return world, modules


# weight 0..5 and bias 6, 7 over N ranks, padded with zeros (by hand)
SHARDS = {1: [[0, 1, 2, 3, 4, 5, 6, 7]],
          2: [[0, 1, 2, 3], [4, 5, 6, 7]],
          3: [[0, 1, 2], [3, 4, 5], [6, 7, 0]],
          4: [[0, 1], [2, 3], [4, 5], [6, 7]],
          5: [[0, 1], [2, 3], [4, 5], [6, 7], [0, 0]]}


@pytest.mark.parametrize("n", sorted(SHARDS))
def test_each_rank_keeps_its_shard_and_the_originals_are_freed(n):
    world, modules = build(n)
    assert [g.shard.tolist() for g in world.groups] == SHARDS[n]
    for g, m in zip(world.groups, modules):
        assert not g.is_gathered
        assert m.weight.numel() == 0 and m.bias.numel() == 0
        assert [s.param for s in g.layout.slots] == [None, None]
        assert [tuple(s.shape) for s in g.layout.slots] == [(2, 3), (2,)]
    assert world.calls == []


@pytest.mark.parametrize("n, padding", [(1, 0), (3, 1), (5, 2)])
def test_unshard_gathers_once_and_forward_sees_the_whole_parameters(n, padding):
    world, modules = build(n)
    g, m = world.groups[n - 1], modules[n - 1]
    g.unshard("forward")
    assert g.is_gathered
    assert g.gathered().tolist() == [0, 1, 2, 3, 4, 5, 6, 7] + [0] * padding
    assert world.calls == [(n - 1, Tag("lin", "forward"), torch.float32, False)]
    g.unshard("forward")
    assert len(world.calls) == 1              # already whole: nothing sent
    g.unshard("backward", force=True)
    assert world.calls[-1][1] == Tag("lin", "backward")
    with torch.no_grad():
        g.use_in_forward(unit=None)
        out = m(torch.tensor([[1., 1., 1.]]))
    assert m.weight.shape == (2, 3) and out.tolist() == [[0 + 1 + 2 + 6., 3 + 4 + 5 + 7.]]


def test_reshard_frees_the_buffer_and_points_at_the_pieces():
    world, modules = build(3)
    g, m = world.groups[2], modules[2]
    g.unshard("forward")
    g.reshard()
    assert not g.is_gathered
    assert m.weight is g.pieces.params[0] and m.bias is g.pieces.params[1]
    assert m.weight.numel() == 0 and m.bias.tolist() == [6., 7.]   # rank 2: bias only


def test_param_dtype_gathers_in_bf16_and_keeps_the_shard_fp32():
    world, _ = build(3, param_dtype=torch.bfloat16)
    g = world.groups[1]
    assert g.shard.dtype == torch.float32 and g.send_buffer().dtype == torch.bfloat16
    g.unshard("forward")
    assert g.gathered().dtype == torch.bfloat16
    assert g.gathered().untyped_storage().nbytes() == 9 * 2   # 9 padded elements of 2 B
    assert world.calls[0][2] == torch.bfloat16


def test_prefetch_issues_the_gather_and_unshard_waits_for_it():
    world, _ = build(2)
    g = world.groups[0]
    g.prefetch("forward")
    assert g.is_gathered and world.calls == [(0, Tag("lin", "forward"), torch.float32, True)]
    g.prefetch("forward")                     # gathered already: no second gather
    [handle] = world.handles
    assert handle.waits == 0                  # issued, not waited for
    g.unshard("forward")
    g.unshard("forward")
    assert len(world.calls) == 1 and handle.waits == 1   # waited for once, then forgotten


def test_reshard_waits_for_a_prefetch_still_in_flight():
    world, _ = build(2)
    g = world.groups[1]
    g.prefetch("backward")
    g.reshard()
    assert world.handles[0].waits == 1 and not g.is_gathered


def test_a_group_of_mixed_dtypes_is_refused():
    m = nn.Linear(2, 2)
    m.bias.data = m.bias.data.double()
    with pytest.raises(ValueError, match="mixes parameter dtypes"):
        FlatGroup(param_slots(m), World(1).comm(0), "odd", True)


class TwoParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor([1., 1.]))
        self.b = nn.Parameter(torch.tensor([1., 1., 1.]))

    def forward(self):
        return (self.a * 2).sum()             # b takes no part: no gradient for it


class FakeUnit:
    """What FlatGroup's backward talks to: the unit and its fsdp engine."""

    name = "u"

    def __init__(self):
        self.backwards_to_come, self.done, self.sent, self.marks = 0, 0, [], []
        self.fsdp = self

    def backward_done(self):
        self.done += 1

    def reduce_scatter_grad(self, group, flat, absent):
        self.sent.append((group, flat.clone(), list(absent)))

    def mark(self, name, what):
        self.marks.append((name, what))


def test_backward_hands_one_flat_gradient_with_the_unused_slot_marked():
    world, modules = build(2, make=TwoParams)  # 5 elements, padded to 6
    g, m, unit = world.groups[0], modules[0], FakeUnit()
    g.unshard("forward")
    g.use_in_forward(unit)
    assert unit.backwards_to_come == 1 and m.a.requires_grad
    m().backward()
    assert unit.done == 1 and unit.marks == [("u", "backward_done")]
    [(group, flat, absent)] = unit.sent
    assert group is g and absent == [1]
    assert flat.tolist() == [2., 2., 0., 0., 0., 0.]
    assert torch.signbit(flat).tolist() == [False, False, True, True, True, False]


def test_a_group_that_is_not_trainable_makes_no_backward():
    world = World(1)
    m = linear()
    world.groups[0] = g = FlatGroup(param_slots(m), world.comm(0), "frozen", False)
    unit = FakeUnit()
    g.unshard("forward")
    g.use_in_forward(unit)
    assert unit.backwards_to_come == 0 and not m.weight.requires_grad
