"""Gradient clipping by the global norm: ``fsdp_mini.clip_grad_norm_(model, max_norm)``.

``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` computes the norm of the
gradients it is given. Under ddp those are whole and averaged, so it is right. Under zero and fsdp
each rank holds only its shard of the averaged gradients, so the norm must be summed over ranks:

    ‖g‖₂ = sqrt(Σ_ranks Σ_my elements g²)          ‖g‖∞ = max_ranks max_my elements |g|

Example, N = 2, gradient [3 0 | 0 4] sharded as rank0 [3 0], rank1 [0 4]::

    local  rank0 ‖[3 0]‖² = 9         rank1 ‖[0 4]‖² = 16
    all-reduce (sum) 25 on every rank -> ‖g‖ = 5 everywhere; with max_norm 1 both scale by 1/5

Each element is counted once: shards are disjoint, padding is not in any piece, tied weights are
one parameter. The all-reduce of one number is written in the ledger like every collective.

The usual mistake is ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``. Under zero1
``model.parameters()`` hold each rank's own, not yet averaged gradients; under fsdp they are this
rank's shards; either way the norm torch computes is one rank's, so every rank clips by a
different factor (or not at all). Those strategies remember the version counters of the
gradients they hand over (:class:`GradWatch`) and check them at the step: a change raises
:class:`GradientsChangedError` instead of giving a wrong number. Under zero2 the whole gradient
is on no rank at all (reduce-scattered during backward): ``p.grad`` is a
:class:`GradientElsewhere`, a stand-in with the gradient's shape and no values, and torch's clip
raises the same error the moment it reads it (it would otherwise find nothing and clip nothing).
"""

from __future__ import annotations

import math

import torch

from .arguments import flag, number


def clip_grad_norm_(model: torch.nn.Module, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> torch.Tensor:
    """Scale the gradients of a parallelized ``model`` in place so that their global norm is at
    most ``max_norm``; return that norm (before clipping), the same on every rank, like torch's
    ``clip_grad_norm_``. Collective under zero1, zero2 and fsdp: every rank must call it."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fsdp_mini.clip_grad_norm_ takes the model itself (it reaches the "
                        f"gradients through its strategy), not {type(model).__name__}: write "
                        f"clip_grad_norm_(model, max_norm), not clip_grad_norm_(model.parameters(), "
                        f"max_norm)")
    engine = getattr(model, "fsdp_mini", None)
    if engine is None:
        raise ValueError("clip_grad_norm_ takes a model returned by fsdp_mini.parallelize; for a "
                         "plain model use torch.nn.utils.clip_grad_norm_")
    norm_type = _checked_norm(norm_type, max_norm)
    flag("clip_grad_norm_(error_if_nonfinite)", error_if_nonfinite)
    grads, sharded = engine.grads_for_norm()
    device = grads[0].device if grads else next(model.parameters()).device
    if math.isinf(norm_type):
        local = max((g.detach().abs().max() for g in grads if g.numel()),
                    default=torch.tensor(0.0, device=device)).float().reshape(1)
    else:
        local = sum((torch.linalg.vector_norm(g.detach(), norm_type, dtype=torch.float32)
                     ** norm_type for g in grads),
                    torch.zeros((), device=device)).reshape(1)
    if sharded and engine.comm.world_size > 1:
        local = local.to(engine.comm.device)  # offloaded gradients are on the CPU
        engine.comm.all_reduce(local, label="clip", op="max" if math.isinf(norm_type)
                               else "sum")
    total = local[0] if math.isinf(norm_type) else local[0] ** (1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is {total.item()}"
                           f"; set error_if_nonfinite=False to clip anyway")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for g in grads:
            g.mul_(coef.to(g.device, g.dtype))
    engine.after_clip()
    return total


def _checked_norm(norm_type, max_norm) -> float:
    """``norm_type`` as a float; clear errors for orders that are no norm, and for max_norm."""
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)) \
            or not float(norm_type) > 0:  # Note: also false for nan
        raise ValueError(f"clip_grad_norm_(norm_type) must be a number > 0 or float('inf') (2.0 "
                         f"is the usual Euclidean norm), got {norm_type!r}; order 0 is no norm "
                         f"(torch would return the count of non-zero elements and scale by it)")
    if isinstance(max_norm, torch.Tensor) and max_norm.numel() == 1:
        max_norm = max_norm.item()
    number("clip_grad_norm_(max_norm)", max_norm, at_least=0)  # the largest norm kept
    return float(norm_type)


# -- the mistake the kit can see: torch's clip on gradients that are one rank's -------------------

class GradientsChangedError(RuntimeError):
    """Gradients were changed (or read) after backward where the kit cannot make that right:
    usually torch's ``clip_grad_norm_`` on gradients that are one rank's or not here at all."""


class GradWatch:
    def __init__(self, strategy: str, what: str):
        self.strategy, self.what = strategy, what
        self._seen: list[tuple[torch.Tensor, int]] = []

    def remember(self, tensors) -> None:
        """These gradients are as the kit left them."""
        self._seen = [(t, t._version) for t in tensors if t is not None]

    def check(self) -> None:
        if any(t._version != version for t, version in self._seen):
            raise GradientsChangedError(
                f"{self.strategy}: gradients were changed in place after backward(), before "
                f"optimizer.step(): usually torch.nn.utils.clip_grad_norm_(model.parameters(), "
                f"...). Under {self.strategy} they are {self.what}, so a norm computed from them "
                f"is this rank's alone and each rank would clip differently. Use "
                f"fsdp_mini.clip_grad_norm_(model, max_norm), which computes the norm over every "
                f"rank. To scale gradients, scale the loss before backward() instead.")


class GradientElsewhere(torch.Tensor):
    """``p.grad`` of a parameter whose gradient was reduce-scattered away (zero2): the shape,
    dtype and device of the gradient, no values. Any use of it (a norm, a sum, ``print``ing its
    values) raises :class:`GradientsChangedError` saying where the gradient is and what to call.
    A parameter that got no gradient keeps ``grad is None``, as in plain torch.

    Note: a tensor subclass without storage (``_make_wrapper_subclass``); every aten op reaches
    ``__torch_dispatch__``. ``zero_`` is let through as a no-op so that
    ``zero_grad(set_to_none=False)`` works; the strategy then drops the stand-ins.
    """

    @staticmethod
    def __new__(cls, param: torch.Tensor, name: str, strategy: str):
        made = torch.Tensor._make_wrapper_subclass(cls, param.shape, dtype=param.dtype,
                                                   device=param.device, requires_grad=False)
        made.param_name, made.strategy = name, strategy
        return made

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.zero_.default:
            return args[0]
        me = next(a for a in args if isinstance(a, GradientElsewhere))
        raise GradientsChangedError(
            f"{me.strategy}: the gradient of {me.param_name!r} is not on this rank ({func} read "
            f"it): it was reduce-scattered during backward, and each rank keeps only the averaged "
            f"shard it owns, in the optimizer's pieces. torch.nn.utils.clip_grad_norm_(model."
            f"parameters(), ...) cannot compute the norm from model.parameters() (it would find no "
            f"gradient and clip nothing). Use fsdp_mini.clip_grad_norm_(model, max_norm), which "
            f"computes the norm over every rank; this rank's gradient shards are the .grad of "
            f"the optimizer's parameters.")

    def __repr__(self, *args, **kwargs) -> str:
        return (f"GradientElsewhere({self.param_name!r}, shape={tuple(self.shape)}: reduce-"
                f"scattered by {self.strategy}; each rank holds its shard in the optimizer's "
                f"pieces)")

    def __deepcopy__(self, memo):
        return GradientElsewhere(self, self.param_name, self.strategy)
