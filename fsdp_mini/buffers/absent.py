"""Saying "no gradient here" inside the gradient itself, so no extra message is needed.

In plain PyTorch a parameter that took no part in the loss keeps ``grad is None``, and the
optimizer skips it: no weight decay, no momentum. A data-parallel strategy must keep that, yet
it reduces gradients with a sum over ranks, and a rank that has no gradient for a parameter still
has to send *something* in its place. If it sent zeros, "nobody used it" (leave it alone) and
"used, gradient exactly 0" (weight decay applies) would come out the same.

The trick: a missing gradient is sent as **negative zero**, −0.0, and every real gradient has
its zeros made positive first (``x + 0.0`` turns −0.0 into +0.0 and leaves every other value as
it is). IEEE addition then does the rest:

    −0.0 + −0.0 = −0.0        x + −0.0 = x   for every x, +0.0 included

so after the sum an element is −0.0 **exactly when no rank had a gradient for it**, and the
reduced values of a parameter that some rank used are untouched. Example, N = 2, parameter w
used only on rank 1::

    rank 0 sends  [-0.0 -0.0]     rank 1 sends [0.5  0.0]      (its -0.0s made +0.0)
    sum           [ 0.5  0.0]     averaged /2  [0.25 0.0]      used on some rank: keep it
    and when no rank used it:     [-0.0 -0.0]                  grad stays None everywhere

This is what torch's DDP does with ``find_unused_parameters=True``, minus the extra all-reduce of
a "used" bitmap it needs for that: the byte counts stay exactly the formulas'.
"""

from __future__ import annotations

import torch


def present_values(t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Make every zero of a real gradient +0.0 (other values unchanged): in place, or written
    into ``out`` (a copy and the sign fix in one pass)."""
    return t.add_(0.0) if out is None else torch.add(t, 0.0, out=out)


def mark_absent(t: torch.Tensor) -> torch.Tensor:
    """Fill a gradient slot that this rank has no gradient for, in place."""
    return t.fill_(-0.0)


def is_absent(t: torch.Tensor) -> torch.Tensor:
    return torch.signbit(t) & (t == 0)


def absent_everywhere(reduced: torch.Tensor, starts: list[int]) -> list[bool]:
    """For each start index, whether the reduced value there says "no rank had a gradient".

    One element is enough: a parameter is either absent on every rank (all its elements are
    −0.0) or present on some rank (none of them is).
    """
    if not starts:
        return []
    index = torch.tensor(starts, dtype=torch.long, device=reduced.device)
    return is_absent(reduced.index_select(0, index)).tolist()
