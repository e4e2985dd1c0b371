"""Precision: the dtypes units compute and communicate in, and fp16 loss scaling.

``policy.py`` is :class:`MixedPrecision` (shards stay fp32, units gather and compute in 16 bits,
gradients reduce in the reduce dtype) with the casts the strategies call; ``scaler.py`` is
``ShardedGradScaler``, which checks for overflow on every rank at once. May import:
:mod:`fsdp_mini.comm` and :mod:`fsdp_mini.memory`, never a strategy.
"""
