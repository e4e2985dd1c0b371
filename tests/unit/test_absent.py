"""The "no gradient here" marks: −0.0 sent for a missing gradient, real zeros made +0.0, and the
IEEE sum over ranks that keeps an element −0.0 exactly when no rank had a gradient."""

import pytest
import torch

from fsdp_mini.buffers.absent import absent_everywhere, is_absent, mark_absent, present_values

NEG0 = -0.0
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def signs(t):
    return torch.signbit(t).tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_present_values_in_place_makes_zeros_positive_only(dtype):
    t = torch.tensor([NEG0, 1.0, -2.0, 0.0, -0.5], dtype=dtype)
    out = present_values(t)
    assert out is t
    assert t.tolist() == [0.0, 1.0, -2.0, 0.0, -0.5]
    assert signs(t) == [False, False, True, False, True]


def test_present_values_into_out_leaves_the_source_alone():
    src = torch.tensor([NEG0, 3.0])
    out = torch.full((2,), 9.0)
    present_values(src, out=out)
    assert out.tolist() == [0.0, 3.0] and signs(out) == [False, False]
    assert signs(src) == [True, False]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mark_absent_fills_with_negative_zero(dtype):
    t = torch.tensor([1.0, 2.0, 3.0], dtype=dtype)
    assert mark_absent(t) is t
    assert t.tolist() == [0.0, 0.0, 0.0] and signs(t) == [True, True, True]


def test_is_absent_is_negative_zero_and_nothing_else():
    t = torch.tensor([NEG0, 0.0, -1.0, 1.0, -1e-30])
    assert is_absent(t).tolist() == [True, False, False, False, False]


def test_absent_everywhere_reads_one_element_per_start():
    reduced = torch.tensor([NEG0, NEG0, 0.5, 0.0, NEG0])
    assert absent_everywhere(reduced, [0, 2, 3, 4]) == [True, False, False, True]
    assert absent_everywhere(reduced, []) == []


def ring_sum(sent):
    """What a reduction does: one addition after another (no +0.0 starting value)."""
    total = sent[0].clone()
    for t in sent[1:]:
        total += t
    return total


def test_docstring_example_two_ranks():
    rank0 = mark_absent(torch.empty(2))                  # w not used on rank 0
    rank1 = present_values(torch.tensor([0.5, NEG0]))    # used on rank 1, one zero gradient
    mean = ring_sum([rank0, rank1]) / 2
    assert mean.tolist() == [0.25, 0.0] and not is_absent(mean).any()
    nobody = ring_sum([mark_absent(torch.empty(2)), mark_absent(torch.empty(2))]) / 2
    assert is_absent(nobody).all()                       # −0.0 / 2 is still −0.0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_over_n_ranks(n, dtype):
    absent = [mark_absent(torch.empty(3, dtype=dtype)) for _ in range(n)]
    assert is_absent(ring_sum(absent)).all()
    for user in range(n):   # one rank had an exact-zero gradient: the sum must not read absent
        sent = list(absent)
        sent[user] = present_values(torch.tensor([NEG0, 0.0, 1.0], dtype=dtype))
        total = ring_sum(sent)
        assert not is_absent(total).any()
        assert total.tolist() == [0.0, 0.0, 1.0]


def test_real_negative_zero_without_the_fix_would_read_absent():
    # Why present_values exists: an unfixed −0.0 gradient summed with marks reads "absent".
    total = ring_sum([torch.tensor([NEG0]), mark_absent(torch.empty(1))])
    assert is_absent(total).all()
    fixed = ring_sum([present_values(torch.tensor([NEG0])), mark_absent(torch.empty(1))])
    assert not is_absent(fixed).any()


@pytest.mark.xfail(strict=True, reason="suspected bug: the mean (Reduction.mean divides the sum "
                   "by N) can underflow a used parameter's tiny negative gradient to −0.0, which "
                   "then reads as 'no rank had a gradient' (ShardPieces.add_grads drops it)")
def test_a_used_gradient_is_never_read_as_absent_after_the_mean():
    smallest = -torch.finfo(torch.float32).smallest_normal * 2**-23   # −1.4e−45, a denormal
    used = present_values(torch.tensor([smallest]))                     # rank 1 used it
    total = ring_sum([mark_absent(torch.empty(1)), used])               # rank 0 did not
    assert not is_absent(total).any()                                   # holds after the sum
    assert not is_absent(total / 2).any()                               # fails: −1.4e−45 / 2 = −0.0
