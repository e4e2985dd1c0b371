"""Prefetcher: the units to gather ahead, forward in the learned order, backward in its reverse;
an order that changes stops prefetching for that forward, warns once, and is learned."""

import warnings

import pytest

from fsdp_mini.fsdp.prefetch import Prefetcher


class Unit:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


A, B, C, D = (Unit(n) for n in "abcd")
ROOT = Unit("root")


def run_forward(p, units):
    """One forward: what is prefetched at the root's start and at each unit's start, then the
    units gathered for nothing."""
    p.forward_started()
    ahead = [p.first_in_forward()] + [p.next_in_forward(u) for u in units]
    return ahead, p.forward_finished()


def learned(ahead, order=(A, B, C, D)):
    p = Prefetcher(ahead)
    run_forward(p, list(order))
    return p


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_first_forward_prefetches_nothing_and_learns_the_order(ahead):
    p = Prefetcher(ahead)
    got, unused = run_forward(p, [A, B, C, D])
    assert got == [[], [], [], [], []] and unused == []
    assert p.order == [A, B, C, D] and p.changes == 0


@pytest.mark.parametrize("ahead, expected", [
    (0, [[], [], [], [], []]),
    (1, [[A], [B], [C], [D], []]),
    (2, [[A, B], [B, C], [C, D], [D], []]),
    (3, [[A, B, C], [B, C, D], [C, D], [D], []]),
    (5, [[A, B, C, D], [B, C, D], [C, D], [D], []]),
])
def test_forward_prefetch_order(ahead, expected):
    p = learned(ahead)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # the same order: no warning
        got, unused = run_forward(p, [A, B, C, D])
    assert got == expected and unused == [] and p.changes == 0


@pytest.mark.parametrize("ahead, expected", [
    (0, [[], [], [], [], []]),
    (1, [[D], [C], [B], [A], []]),
    (2, [[D, C], [C, B], [B, A], [A], []]),
    (4, [[D, C, B, A], [C, B, A], [B, A], [A], []]),
])
def test_backward_prefetch_order_is_the_reverse(ahead, expected):
    p = learned(ahead)
    got = [p.next_in_backward(u) for u in (ROOT, D, C, B, A)]
    assert got == expected


def test_nothing_learned_backward_prefetches_nothing():
    assert Prefetcher(2).next_in_backward(ROOT) == []


def test_changed_order_stops_prefetching_warns_once_and_is_learned():
    p = learned(1)
    with pytest.warns(UserWarning, match="different order"):
        got, unused = run_forward(p, [A, C, D])     # B skipped: off track from C on
    assert got == [[A], [B], [], []]                 # B was prefetched at A, in vain
    assert unused == [B] and p.order == [A, C, D] and p.changes == 1
    got, _ = run_forward(p, [A, C, D])
    assert got == [[A], [C], [D], []]
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # a second change: counted, not warned
        run_forward(p, [D, C, A])
    assert p.changes == 2 and p.order == [D, C, A]
    assert [p.next_in_backward(u) for u in (ROOT, A, C, D)] == [[A], [C], [D], []]


def test_a_forward_that_stops_early():
    p = learned(1)
    with pytest.warns(UserWarning):
        got, unused = run_forward(p, [A, B])
    assert got == [[A], [B], [C]] and unused == [C, D] and p.order == [A, B]


def test_a_unit_run_twice_in_one_forward_keeps_its_first_position():
    p = learned(1, order=(A, B))
    got, unused = run_forward(p, [A, B, A])
    assert got == [[A], [B], [], []] and unused == [] and p.order == [A, B] and p.changes == 0


def test_first_forward_with_a_repeated_unit_learns_it_once():
    p = Prefetcher(1)
    run_forward(p, [A, B, A, C])
    assert p.order == [A, B, C]
