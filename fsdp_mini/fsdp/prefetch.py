"""Prefetch: issue the next unit's all-gather before it is needed, so it overlaps with compute.

Without prefetch a unit is gathered when it is about to run, and the rank waits for the
all-gather. With ``prefetch=k`` the gathers of the next k units are issued as soon as the current
unit starts, and they travel while it computes:

    no prefetch   [gather 0][compute 0][gather 1][compute 1][gather 2][compute 2]
    prefetch=1    [gather 0][compute 0][compute 1][compute 2]
                            [gather 1 ][gather 2 ]          (behind the compute, on the link)

Forward follows the order the units ran in the previous forward (learned from the first one);
backward follows its reverse. The price is memory: while unit i computes, units i+1 … i+k are
gathered too, so up to k+1 units (besides the root) are whole at once.

Note: the order is *checked*, not trusted. If a forward runs its units in a different order
(a model with data-dependent control flow), prefetching stops for the rest of that forward, the
units gathered too early are freed at its end, and the new order is learned. A wrong guess
costs bytes, never correctness: a unit is always waited for before it is used.
"""

from __future__ import annotations

import warnings


class Prefetcher:
    """Which units to gather ahead, from the order the units ran in the last forward."""

    def __init__(self, ahead: int):
        self.ahead = ahead
        self.order: list = []        # units in forward order (each once), learned
        self._this_pass: list = []   # the units the current forward has started so far
        self._on_track = True        # this forward has followed ``order`` so far
        self.changes = 0             # forwards whose order differed from the learned one

    # -- forward --------------------------------------------------------------------------------

    def forward_started(self) -> None:
        """The root's forward begins: a new pass. (The root itself is never in ``order``: it
        stays gathered from its forward to its backward.)"""
        self._this_pass, self._on_track = [], True

    def first_in_forward(self) -> list:
        """The root starts its forward: the first units of the learned order."""
        return self.order[:self.ahead]

    def next_in_forward(self, unit) -> list:
        """``unit`` starts its forward: the units to gather ahead of it."""
        if unit in self._this_pass:
            return []  # a unit called twice in one forward: no new position
        self._this_pass.append(unit)
        position = len(self._this_pass) - 1
        if self._on_track and (position >= len(self.order) or self.order[position] is not unit):
            self._on_track = not self.order  # the first forward has nothing to follow yet
        if not self._on_track:
            return []
        return self.order[position + 1:position + 1 + self.ahead]

    def forward_finished(self) -> list:
        """The root's forward ended: learn this pass's order; return units gathered for nothing."""
        if self.order and self._this_pass != self.order:
            self.changes += 1
            if self.changes == 1:
                warnings.warn("fsdp prefetch: the units ran in a different order than in the "
                              "previous forward; prefetching follows the new order from the next "
                              "step (results are unaffected, some gathers are wasted)",
                              stacklevel=3)
        unused = [u for u in self.order if u not in self._this_pass]
        self.order = list(self._this_pass)
        return unused

    # -- backward -------------------------------------------------------------------------------

    def next_in_backward(self, unit) -> list:
        """``unit`` starts its backward: the next units in reverse forward order."""
        backward = self.order[::-1]
        if unit not in backward:
            return backward[:self.ahead]  # the root: the last unit of forward comes first
        position = backward.index(unit)
        return backward[position + 1:position + 1 + self.ahead]
