"""Mixed precision: keep the shards in fp32, move and compute in 16 bits, reduce in 32.

Two dtypes, both optional (None: the dtype the parameters already have, usually fp32):

    param_dtype    fsdp: the dtype a unit is all-gathered and computed in (bf16 or fp16). The
                   shards, the master copy the optimizer updates, stay fp32.
    reduce_dtype   every strategy: the dtype gradients travel in. They are cast to it before the
                   all-reduce or reduce-scatter and cast back to the parameters' dtype after.
                   Default: the parameters' own dtype (fp32), also when param_dtype is set.

Example, fsdp with ``param_dtype=torch.bfloat16`` (reduce_dtype None: fp32), N = 2::

    shard (fp32)     rank0 [w0 w1]                  kept between steps, updated by the optimizer
    send buffer      rank0 [w0 w1] as bf16          cast just before the all-gather
    gathered (bf16)  [w0 w1 w2 w3]                  half the bytes of fp32: in memory and on wire
    backward         flat grad in bf16 -> cast to fp32 -> reduce-scatter -> fp32 grad shard

Note: unlike torch's ``MixedPrecisionPolicy``, where ``reduce_dtype=None`` means "reduce in
param_dtype", here it means "reduce in fp32": summing 16-bit gradients over many ranks loses
their small parts, so the cheaper choice must be asked for (``reduce_dtype=torch.bfloat16``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map

from ..memory import allocating

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class MixedPrecision:
    """The dtypes a strategy communicates and computes in; None keeps the parameters' own.

        MixedPrecision(param_dtype=torch.bfloat16).param(torch.float32)    # torch.bfloat16
        MixedPrecision(param_dtype=torch.bfloat16).reduce(torch.float32)   # torch.float32
        MixedPrecision(param_dtype=torch.int8)                             # ValueError
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None

    def __post_init__(self):
        for name in ("param_dtype", "reduce_dtype"):
            _check_dtype(name, getattr(self, name))

    @property
    def enabled(self) -> bool:
        return self.param_dtype is not None or self.reduce_dtype is not None

    def param(self, shard_dtype: torch.dtype) -> torch.dtype:
        """The dtype parameters of ``shard_dtype`` are gathered and computed in."""
        return self.param_dtype or shard_dtype

    def reduce(self, shard_dtype: torch.dtype) -> torch.dtype:
        """The dtype gradients of parameters of ``shard_dtype`` are reduced in."""
        return self.reduce_dtype or shard_dtype

    def check_effect(self, module: torch.nn.Module, strategy: str) -> MixedPrecision:
        """A clear error if a dtype was given that changes nothing for this module; returns self."""
        dtypes = {p.dtype for p in module.parameters() if p.requires_grad}
        if not self.enabled or not dtypes:
            return self
        if all(self.param(d) == d and self.reduce(d) == d for d in dtypes):
            given = ", ".join(f"{k}={_name(v)}" for k, v in vars(self).items() if v is not None)
            have = ", ".join(sorted(_name(d) for d in dtypes))
            hint = ("pass param_dtype=torch.bfloat16 to gather and compute in bf16"
                    if strategy == "fsdp" else "pass reduce_dtype=torch.bfloat16 to send bf16")
            raise ValueError(f"{strategy}: {given} has no effect, the parameters are already "
                             f"{have}; leave it out for plain {have} training, or {hint}")
        return self

    def cast_inputs(self, args):
        """Floating-point tensors in ``args`` cast to ``param_dtype`` (a unit's forward inputs,
        as torch's ``cast_forward_inputs``); None when there is nothing to cast."""
        if self.param_dtype is None:
            return None
        return tree_map(lambda t: t.to(self.param_dtype) if isinstance(t, torch.Tensor)
                        and t.is_floating_point() and t.dtype != self.param_dtype else t, args)


def cast(t: torch.Tensor, dtype: torch.dtype, category: str = "comm_buffers") -> torch.Tensor:
    """``t`` itself if it already has ``dtype``, else a copy in ``dtype`` counted as ``category``."""
    if t.dtype == dtype:
        return t
    with allocating(category):
        return t.to(dtype)


def cast_grad(flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``cast`` for a flat gradient that carries "no gradient" marks (−0.0,
    :mod:`fsdp_mini.buffers.absent`).

    Note: narrowing can turn a tiny negative gradient into −0.0 (fp16: −1e-8 -> −0.0), which
    would read as "absent" after the sum; such values are made +0.0, as a real zero is.
    """
    out = cast(flat, dtype)
    if out.element_size() < flat.element_size():
        out.masked_fill_((out == 0) & (flat != 0), 0.0)
    return out


def no_param_dtype(strategy: str) -> str:
    """Why a strategy with whole parameters takes no ``param_dtype``, and what to use instead."""
    return (f"{strategy!r} has no param_dtype: its ranks keep whole parameters, which the "
            f"optimizer updates in their own dtype, so there is no gathered copy to make smaller. "
            f"To compute in bf16, wrap the forward in torch.autocast(device_type, "
            f"dtype=torch.bfloat16); to send bf16 gradients, pass reduce_dtype=torch.bfloat16; "
            f"to gather and compute in bf16 with fp32 shards, use 'fsdp' with param_dtype")


def _check_dtype(name: str, value) -> None:
    if value is None:
        return
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch dtype such as torch.bfloat16 or torch.float16 "
                        f"(or None: keep the parameters' dtype), got {value!r}")
    if value not in FLOAT_DTYPES:
        kind = "an 8-bit float" if value.is_floating_point else "not a floating-point dtype"
        raise ValueError(f"{name}={_name(value)} is {kind}: parameters and gradients need one "
                         f"that torch computes and communicates in; use torch.bfloat16 or "
                         f"torch.float16 (or None)")


def _name(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.bfloat16", as the user writes it
