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

from ..arguments import count, number
from .shapes import MAX_COUNT


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
    name = "training_cost: {}".format
    step_seconds = number(name("step_seconds"), step_seconds, unit="seconds", at_least=0)
    tokens_per_step = count(name("tokens_per_step"), tokens_per_step)
    gpus = count(name("gpus"), gpus)
    train_tokens, train_steps, price_per_gpu_hour = check_budget(
        train_tokens, train_steps, price_per_gpu_hour, caller="training_cost")
    if train_tokens is None and train_steps is None:
        raise ValueError("training_cost needs a budget: give train_tokens (e.g. 2e12) or "
                         "train_steps")
    steps = train_steps if train_steps is not None else math.ceil(train_tokens / tokens_per_step)
    hours = steps * step_seconds / 3600
    gpu_hours = hours * gpus
    return TrainingCost(steps, hours, gpu_hours,
                        None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour)


def check_budget(train_tokens, train_steps, price_per_gpu_hour, *,
                 caller: str = "check_budget") -> tuple:
    """(train_tokens, train_steps, price_per_gpu_hour) checked, each None or a number, with
    clear errors naming ``caller``'s argument for a budget that cannot be priced."""
    name = f"{caller}: {{}}".format
    if train_tokens is not None:
        train_tokens = count(name("train_tokens"), train_tokens, unit="tokens", scale_hint=1e12,
                             at_most=MAX_COUNT)
    if train_steps is not None:
        train_steps = count(name("train_steps"), train_steps, unit="steps", at_most=MAX_COUNT)
    if price_per_gpu_hour is not None:
        price_per_gpu_hour = number(name("price_per_gpu_hour"), price_per_gpu_hour, at_least=0,
                                    example="2.5, your price in your currency")
    if train_tokens is not None and train_steps is not None:
        raise ValueError(f"{caller}: give train_tokens or train_steps (each step is the global "
                         f"batch), not both")
    if price_per_gpu_hour is not None and train_tokens is None and train_steps is None:
        raise ValueError(f"{caller}: a price needs a budget to price: give train_tokens (e.g. "
                         f"2e12) or train_steps too")
    return train_tokens, train_steps, price_per_gpu_hour
