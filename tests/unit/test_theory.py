"""fsdp_mini.theory: model-state bytes per rank for each ZeRO stage, the formulas as written, and
bytes sent per step (ring model) for ddp, zero, fsdp and hsdp; worked out by hand."""

import pytest

from fsdp_mini.comm.ledger import ring_bytes
from fsdp_mini.theory import (PARTS, StateBytes, UnitSize, ddp_sent_bytes, fsdp_sent_bytes,
                              hsdp_sent_bytes, memory_formula, persistent_bytes,
                              zero_sent_bytes)

DDP, ZERO1, ZERO2, FSDP = (), ("optim",), ("grads", "optim"), PARTS
BF16 = StateBytes(2, 2, 12)


@pytest.mark.parametrize("op, payload, n, sent", [
    ("all_gather", 32, 4, 24.0),       # the module docstring's 8 floats over 4 ranks
    ("reduce_scatter", 32, 4, 24.0),
    ("broadcast", 32, 4, 24.0),
    ("all_reduce", 32, 4, 48.0),
    ("all_reduce", 30, 3, 40.0),
    ("all_gather", 30, 5, 24.0),
    ("all_gather", 30, 1, 0.0),        # one rank sends nothing
    ("barrier", 0, 4, 0.0),
])
def test_ring_bytes(op, payload, n, sent):
    assert ring_bytes(op, payload, n) == sent


def test_ring_bytes_unknown_op():
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        ring_bytes("gather", 1, 2)


@pytest.mark.parametrize("sharded, n, expected", [
    (DDP, 4, 16000),                   # 16Ψ
    (ZERO1, 4, 10000),                 # 8Ψ + 8Ψ/4 = 8000 + 2000
    (ZERO2, 4, 7000),                  # 4Ψ + 12Ψ/4 = 4000 + 3000
    (FSDP, 4, 4000),                   # 16Ψ/4
    (FSDP, 5, 3200),
    (ZERO2, 1, 16000), (FSDP, 1, 16000),
])
def test_persistent_bytes_fp32_adam(sharded, n, expected):
    assert persistent_bytes(sharded, 1000, n) == expected


@pytest.mark.parametrize("sharded, expected", [
    (DDP, 16000), (ZERO1, 4000 + 3000), (ZERO2, 2000 + 3500), (FSDP, 4000)])
def test_persistent_bytes_bf16_mixed(sharded, expected):
    assert persistent_bytes(sharded, 1000, 4, sizes=BF16) == expected


@pytest.mark.parametrize("sharded, n, padded, frozen, expected", [
    (FSDP, 4, 12, 0, 48),              # 10 elements padded to 12: 16 x 12 / 4
    (ZERO2, 4, 12, 0, 76),             # 4 x 10 whole + (4 + 8) x 12 / 4
    (ZERO1, 4, 12, 0, 104),            # (4 + 4) x 10 + 8 x 12 / 4
    (DDP, 4, 12, 0, 160),              # nothing sharded: the padding never counts
    (FSDP, 3, 12, 0, 64),
    (FSDP, 4, 12, 6, 54),              # frozen: values only, sharded with the params: 4 x 6 / 4
    (ZERO2, 4, 12, 6, 100),            # ... whole when the params are: 4 x 6
    (DDP, 4, 12, 6, 184),
])
def test_persistent_bytes_padded_and_frozen(sharded, n, padded, frozen, expected):
    assert persistent_bytes(sharded, 10, n, padded, frozen) == expected


@pytest.mark.parametrize("sharded, fp32, bf16", [
    (DDP, "16Ψ", "16Ψ"),
    (ZERO1, "8Ψ + 8Ψ/N", "4Ψ + 12Ψ/N"),
    (ZERO2, "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N"),
    (FSDP, "16Ψ/N", "16Ψ/N"),
])
def test_memory_formula(sharded, fp32, bf16):
    assert memory_formula(sharded) == fp32
    assert memory_formula(sharded, BF16) == bf16


def test_state_bytes():
    assert StateBytes() == StateBytes(4, 4, 8)
    assert StateBytes.adam(4) == StateBytes(4, 4, 8)
    assert StateBytes.adam(2) == StateBytes(2, 2, 4)
    assert StateBytes.adam(2, optim_bytes=12) == BF16


@pytest.mark.parametrize("numel, n, elem, sent", [
    (1000, 4, 4, 6000.0),              # 2 x 3/4 x 4000
    (1000, 4, 2, 3000.0),
    (9, 3, 4, 48.0),                   # 2 x 2/3 x 36
    (1000, 1, 4, 0.0),
])
def test_ddp_sent_bytes(numel, n, elem, sent):
    assert ddp_sent_bytes(numel, n, elem) == sent


@pytest.mark.parametrize("padded, n, elem, reduce, sent", [
    (12, 4, 4, None, 72.0),            # 3/4 x 48 twice
    (12, 4, 4, 2, 54.0),               # 3/4 x 24 + 3/4 x 48
    (10, 5, 4, None, 64.0),            # 4/5 x 40 twice
    (12, 1, 4, None, 0.0),
])
def test_zero_sent_bytes(padded, n, elem, reduce, sent):
    assert zero_sent_bytes(padded, n, elem, reduce) == sent


@pytest.mark.parametrize("units, n, elem, reduce, sent", [
    ([UnitSize(8)], 4, 4, None, 72.0),                 # 3 x 3/4 x 32 = 3(N-1)/N x 4Ψ
    ([UnitSize(8, gathered_in_backward=False)], 4, 4, None, 48.0),   # 2 x 3/4 x 32
    ([UnitSize(8, frozen=4)], 4, 4, None, 96.0),       # 2 x 3/4 x 48 + 3/4 x 32
    ([UnitSize(8)], 4, 2, 4, 48.0),                    # bf16 gathers: (2 + 2 + 4) x 3/4 x 8
    ([UnitSize(4), UnitSize(6, gathered_in_backward=False)], 2, 4, None, 48.0),  # 24 + 24
    ([UnitSize(8)], 1, 4, None, 0.0),
])
def test_fsdp_sent_bytes(units, n, elem, reduce, sent):
    assert fsdp_sent_bytes(units, n, elem, reduce) == sent


@pytest.mark.parametrize("shard_size, n, sent", [
    (2, 4, 64.0),                      # docstring: 3 x 1/2 x 32 + 2 x 1/2 x 16
    (4, 4, 72.0),                      # one group of all ranks: fsdp's 72
    (1, 4, 48.0),                      # groups of one: an all-reduce of everything, ddp's 48
    (2, 6, 48 + 2 * 16 * 2 / 3),       # G = 3 groups
])
def test_hsdp_sent_bytes(shard_size, n, sent):
    assert hsdp_sent_bytes([UnitSize(8)], shard_size, n) == pytest.approx(sent, rel=1e-12)
