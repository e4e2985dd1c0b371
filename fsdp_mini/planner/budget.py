"""A training budget in time, GPU-hours and money, from a plan's step time.

The budget is a number of tokens, or of steps (each step is the global batch: micro-batch x
micro-batches x sequence x GPUs tokens). The price of a GPU-hour is the user's own (a cloud's
list price, a cluster's internal rate): the kit builds none in. Example, 8 GPUs whose step takes
0.5 s on 65,536 tokens (8 x 8,192), a budget of 1e9 tokens at 2.00 per GPU-hour::

    steps      1e9 / 65,536            = 15,259 (the last one partly used: rounded up)
    time       15,259 x 0.5 s          = 7,629.5 s = 2.12 h
    GPU-hours  2.12 h x 8 GPUs         = 16.95
    cost       16.95 x 2.00            = 33.91
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingCost:
    steps: int
    hours: float             # wall-clock time to train
    gpu_hours: float
    cost: float | None       # None without a price


def training_cost(step_seconds: float, tokens_per_step: int, gpus: int,
                  train_tokens: float | None = None, train_steps: int | None = None,
                  price_per_gpu_hour: float | None = None) -> TrainingCost:
    """What the budget costs at this step time (see the module docstring).

    >>> c = training_cost(0.5, 65_536, 8, train_tokens=1e9, price_per_gpu_hour=2.0)
    >>> c.steps, round(c.hours, 2), round(c.gpu_hours, 2), round(c.cost, 2)
    (15259, 2.12, 16.95, 33.91)
    """
    steps = train_steps if train_steps is not None else math.ceil(train_tokens / tokens_per_step)
    hours = steps * step_seconds / 3600
    gpu_hours = hours * gpus
    return TrainingCost(steps, hours, gpu_hours,
                        None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour)


def check_budget(train_tokens, train_steps, price_per_gpu_hour) -> None:
    """Clear errors for a budget that cannot be priced."""
    if train_tokens is not None and train_steps is not None:
        raise ValueError("give train_tokens or train_steps (each step is the global batch), "
                         "not both")
    if train_tokens is not None and (isinstance(train_tokens, bool) or not isinstance(
            train_tokens, (int, float)) or not 1 <= train_tokens < math.inf):
        raise ValueError(f"train_tokens must be a number of tokens >= 1, e.g. 2e12, got "
                         f"{train_tokens!r}")
    if train_steps is not None and (isinstance(train_steps, bool)
                                    or not isinstance(train_steps, int) or train_steps < 1):
        raise ValueError(f"train_steps must be a whole number >= 1, got {train_steps!r}")
    if price_per_gpu_hour is not None:
        if isinstance(price_per_gpu_hour, bool) or not isinstance(price_per_gpu_hour, (int, float)) \
                or not 0 <= price_per_gpu_hour < math.inf:
            raise ValueError(f"price_per_gpu_hour must be a number >= 0 (your price, in your "
                             f"currency), got {price_per_gpu_hour!r}")
        if train_tokens is None and train_steps is None:
            raise ValueError("a price needs a budget to price: give train_tokens (e.g. 2e12) or "
                             "train_steps too")
