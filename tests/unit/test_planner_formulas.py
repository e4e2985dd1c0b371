"""The planner's formulas: buckets and units as the kit pads them, the collectives of one step
and their bytes, the peak-memory pieces of each strategy; worked out by hand."""

import pytest
import torch
from torch import nn

from fsdp_mini.buffers.buckets import split_into_buckets
from fsdp_mini.buffers.flat import FlatLayout, ParamSlot
from fsdp_mini.comm.link import Link
from fsdp_mini.memory import CATEGORIES
from fsdp_mini.planner.peaks import Layout, memory
from fsdp_mini.planner.plan import plan
from fsdp_mini.planner.shapes import ModelShape
from fsdp_mini.planner.traffic import Levels, collectives, sent_bytes
from fsdp_mini.planner.units import collectives_of, units_of
from fsdp_mini.theory import StateBytes, UnitSize, hsdp_sent_bytes

FP32 = StateBytes(4, 4, 8)
# 30 elements: units blocks.0 = 9, blocks.1 = 9, root = 12; buckets of 40 bytes (fp32)
TENSORS = [("root", 10), ("blocks.0", 6), ("blocks.0", 3), ("blocks.1", 9), ("root", 2)]
LAYOUT = Layout(TENSORS, FP32, 40)
LEVELS = Levels(Link(100.0), Link(10.0), gpus_per_node=8)
TINY = ModelShape(2, 32, 2, 64, 16, positions=16)   # the kit's tiny GPT


def test_layout_buckets_units_and_pieces():
    # reversed: 2 (8 B) | 9 (36 B; 8 + 36 > 40) | 3 + 6 (36 B) | 10 (40 B)
    assert LAYOUT.numel == 30 and LAYOUT.buckets() == [2, 9, 9, 10]
    assert list(LAYOUT.units().items()) == [("blocks.0", 9), ("blocks.1", 9), ("root", 12)]
    assert LAYOUT.pieces("ddp", 4, 4) == [2, 9, 9, 10]
    assert LAYOUT.pieces("zero2", 4, 4) == [4, 12, 12, 12]
    assert LAYOUT.pieces("zero1", 5, 5) == [5, 10, 10, 10]
    assert LAYOUT.pieces("fsdp", 4, 4) == [12, 12, 12]
    assert LAYOUT.pieces("fsdp", 5, 5) == [10, 10, 15]
    assert LAYOUT.pieces("hsdp", 4, 2) == [10, 10, 12]


def test_planner_buckets_are_the_kits_buckets():
    ps = [nn.Parameter(torch.zeros(k)) for _, k in TENSORS]
    kit = split_into_buckets(list(reversed(ps)), 40)
    assert [sum(p.numel() for p in b) for b in kit] == LAYOUT.buckets()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_unit_padding_is_the_flat_layouts(n):
    units = Layout([("blocks.0", 7), ("blocks.1", 10), ("blocks.2", 1)], FP32, 40)  # root: 0
    assert units.pieces("fsdp", n, n) == [
        FlatLayout([ParamSlot(None, [], [], shape=torch.Size([k]))], n).padded_numel
        for k in (7, 10, 1, 0)]
    assert units.pieces("fsdp", 4, 4) == [8, 12, 4, 4]   # an empty root: one element a rank


def ops(name, pieces, n=4, group=4, param_bytes=4, reduce_bytes=4, **kw):
    return collectives(name, pieces, n, group, param_bytes, reduce_bytes, LEVELS, **kw)


def short(cs):
    return [(c.op[:2] if c.op != "all_reduce" else "ar", c.payload_bytes, c.when) for c in cs]


def test_ddp_collectives():
    cs = ops("ddp", [2, 9])
    assert short(cs) == [("ar", 8, "backward"), ("ar", 36, "backward")]
    assert sent_bytes(cs) == 2 * 44 * 3 / 4 == 66
    assert len(ops("ddp", [2, 9], micro_batches=3)) == 6
    assert len(ops("ddp", [2, 9], micro_batches=3, no_sync=True)) == 2


def test_zero_collectives():
    z1 = ops("zero1", [4, 12], micro_batches=3)    # zero1 reduces once, at the step
    assert short(z1) == [("re", 16, "step"), ("re", 48, "step"), ("al", 16, "step"),
                         ("al", 48, "step")]
    assert sent_bytes(z1) == 3 / 4 * 64 * 2 == 96
    assert [c.gathers for c in z1] == [False, False, True, True]
    z2 = ops("zero2", [4, 12], micro_batches=2)
    assert short(z2) == [("re", 16, "backward"), ("re", 48, "backward")] * 2 + [
        ("al", 16, "step"), ("al", 48, "step")]


def test_fsdp_collectives_bf16_params_fp32_reduce():
    cs = ops("fsdp", [12, 12, 12], param_bytes=2, reduce_bytes=4)   # the root is last
    assert short(cs) == [("al", 24, "forward")] * 3 + [
        ("re", 48, "backward"),                          # root: still gathered, no all-gather
        ("al", 24, "backward"), ("re", 48, "backward"),  # blocks.1
        ("al", 24, "backward"), ("re", 48, "backward")]  # blocks.0
    assert sent_bytes(cs) == 5 * 24 * 3 / 4 + 3 * 48 * 3 / 4 == 198


def test_fsdp_micro_batches_gather_each_time_and_no_sync_reduces_once():
    one = short(ops("fsdp", [12, 12, 12]))                  # 3 gathers, 2 again, 3 reductions
    assert short(ops("fsdp", [12, 12, 12], micro_batches=2)) == one * 2
    assert short(ops("fsdp", [12, 12, 12], micro_batches=2, no_sync=True)) == [
        ("al", 48, "forward")] * 3 + [("al", 48, "backward")] * 2 + one   # nothing reduced


def test_hsdp_collectives_and_levels():
    levels = Levels(Link(100.0), Link(10.0), gpus_per_node=2)
    cs = collectives("hsdp", [10, 10, 12], 4, 2, 4, 4, levels)
    ar = [c for c in cs if c.op == "all_reduce"]
    assert [(c.payload_bytes, c.ranks, c.across_nodes) for c in ar] == [
        (24, 2, True), (20, 2, True), (20, 2, True)]    # each shard (u / S) across the nodes
    assert all(c.ranks == 2 and not c.across_nodes for c in cs if c.op != "all_reduce")
    # AG 64 + 40, RS 64, AR 64: the theory's hsdp formula with the root gathered once
    assert sent_bytes(cs) == 232 == hsdp_sent_bytes(
        [UnitSize(10), UnitSize(10), UnitSize(12, gathered_in_backward=False)], 2, 4)


def test_collectives_cross_nodes_when_the_group_spans_them():
    assert all(c.across_nodes for c in collectives("fsdp", [16, 16], 16, 16, 4, 4, LEVELS))
    assert not any(c.across_nodes for c in collectives("ddp", [16], 8, 8, 4, 4, LEVELS))


def moment(m):
    return m.peak_moment, {k: v for k, v in m.by_category.items() if v}


def test_ddp_memory():
    m = memory("ddp", LAYOUT, 4, 4, (100,), False, False, 4)
    assert m.persistent_bytes == 480 and m.local_params == 30 and m.offloaded_bytes == 0
    # optimizer step: params 120 + grads 120 + Adam 240 + two fp32 copies of the largest (10)
    assert moment(m) == ("optimizer step", {"params": 120, "grads": 120, "optimizer_state": 240,
                                            "activations": 80})
    assert m.peak_bytes == 560 and list(m.by_category) == list(CATEGORIES)
    big = memory("ddp", LAYOUT, 4, 4, (1000,), False, False, 4)
    assert (big.peak_moment, big.peak_bytes) == ("forward end", 1360)


def test_zero1_memory():
    m = memory("zero1", LAYOUT, 4, 4, (50,), False, False, 4)
    assert m.persistent_bytes == 320 and m.local_params == 10
    # the full gradients, plus their shard (1/N), and the working copy of a 12-element bucket
    assert moment(m) == ("optimizer step", {"params": 120, "grads": 150, "optimizer_state": 80,
                                            "comm_buffers": 48})


def test_zero2_memory():
    m = memory("zero2", LAYOUT, 4, 4, (100,), False, False, 4)
    assert m.persistent_bytes == 240 and m.local_params == 10
    assert moment(m) == ("backward end", {"params": 120, "grads": 40, "optimizer_state": 80,
                                          "comm_buffers": 96})   # bucket's p.grad + flat copy


@pytest.mark.parametrize("prefetch, gathered, peak", [(False, 96, 344), (True, 144, 392)])
def test_fsdp_memory(prefetch, gathered, peak):
    m = memory("fsdp", LAYOUT, 4, 4, (100, 120, 80), prefetch, False, 4)
    assert m.persistent_bytes == 144 and m.local_params == 9
    # backward: the root (12) and one layer (12; two with prefetch) gathered, the layer's flat
    # gradient in flight (48), the done layer's gradient shard (12 x 4 / 4)
    assert moment(m) == ("backward", {"params": 36, "gathered_params": gathered, "grads": 12,
                                      "optimizer_state": 72, "comm_buffers": 48,
                                      "activations": 80})
    assert m.peak_bytes == peak
    quiet = memory("fsdp", LAYOUT, 4, 4, (0, 0, 0), prefetch, False, 4)
    assert quiet.peak_moment == "backward end" and quiet.peak_bytes == 36 + 36 + 72 + 48 + gathered


def test_fsdp_memory_no_sync_micro_batches_and_offload():
    no_sync = memory("fsdp", LAYOUT, 4, 4, (100, 120, 80), False, False, 4, no_sync=True)
    assert moment(no_sync)[1]["grads"] == 144 and no_sync.peak_bytes == 476   # 4 x 36 whole
    micro = memory("fsdp", LAYOUT, 4, 4, (100, 120, 80), False, False, 4, micro_batches=2)
    assert moment(micro)[1]["grads"] == 36 and micro.peak_bytes == 368
    off = memory("fsdp", LAYOUT, 4, 4, (100, 120, 80), False, True, 4)
    assert off.offloaded_bytes == 144 and off.peak_bytes == 96 + 48 + 12 + 80


def test_units_of_the_tiny_gpt():
    # a layer: 2 x LayerNorm (64 + 64) + qkv 96 x 32 + proj 32 x 32 + 32 + fc 128 x 32 + 128
    # + out 32 x 128 + 32 = 12608; root: embedding 64 x 32 + positions 16 x 32 + final norm 64
    assert units_of(TINY) == {"blocks.0": 12608, "blocks.1": 12608, "root": 2624}
    assert TINY.params() == 27840


def test_collectives_of():
    units = {"blocks.0": 10, "blocks.1": 10, "root": 6}
    got = [(c["op"][:2], c["unit"], c["payload_bytes"], c["sent_bytes"]) for c in
           collectives_of({"strategy": "fsdp", "precision": "fp32"}, units, 4)]
    assert got == [("al", "root", 32, 24), ("al", "blocks.0", 48, 36), ("al", "blocks.1", 48, 36),
                   ("al", "blocks.1", 48, 36), ("al", "blocks.0", 48, 36),
                   ("re", "blocks.1", 48, 36), ("re", "blocks.0", 48, 36), ("re", "root", 32, 24)]
    [ddp] = collectives_of({"strategy": "ddp", "precision": "fp32"}, units, 4)
    assert (ddp["payload_bytes"], ddp["sent_bytes"]) == (112, 168)   # 26 padded to 28
    [ddp] = collectives_of({"strategy": "ddp", "precision": "bf16-mixed"}, units, 4, pad=False)
    assert (ddp["payload_bytes"], ddp["sent_bytes"]) == (52, 78)


def test_plan_bytes_per_step_of_the_tiny_gpt_on_two_ranks():
    p = plan(model=TINY, gpus=2, precision="fp32", micro_batch=4, strategies=("ddp", "zero2",
                                                                                "fsdp"))
    s = p.strategies
    assert p.params == 27840 and s["fsdp"].persistent_bytes == 16 * 27840 / 2
    whole = 27840 * 4
    assert s["ddp"].sent_bytes_per_step == whole             # 2 x 1/2 x 4Ψ
    assert s["zero2"].sent_bytes_per_step == whole           # 1/2 x 4Ψ twice
    # 1/2 x (4Ψ forward + the two blocks again in backward + 4Ψ reduce-scattered)
    assert s["fsdp"].sent_bytes_per_step == (whole + 2 * 12608 * 4 + whole) / 2
