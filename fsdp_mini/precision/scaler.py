"""Loss scaling for fp16: ``fsdp_mini.ShardedGradScaler``, used like ``torch.amp.GradScaler``.

fp16 cannot hold magnitudes below about 6e-8 (2^-24): many gradients would round to 0. So the
loss is multiplied by a scale S (65536 to start) before ``backward()``, which multiplies every
gradient by S too; they are divided by S again before the optimizer uses them. When S is too
large some gradient overflows to inf (or becomes nan): that step is skipped and S halved. After
``growth_interval`` good steps in a row, S is doubled.

Sharded: under zero and fsdp each rank holds only its shard of the averaged gradients, so an inf
in rank 1's shard is invisible to rank 0. The check all-reduces one flag (max) over the ranks, so
every rank skips the step or none does. Example, N = 2::

    rank0 owns grads [0.1 0.2]   finite: flag 0
    rank1 owns grads [inf 0.3]   inf:    flag 1
    all-reduce (max)             flag 1 on both: both skip the step, both halve S

Usage, the loop of ``torch.amp.GradScaler``::

    scaler = fsdp_mini.ShardedGradScaler()
    scaler.scale(model(x, y)[1]).backward()
    scaler.unscale_(optimizer)                       # optional: only to clip the true gradients
    fsdp_mini.clip_grad_norm_(model, 1.0)
    scaler.step(optimizer)                           # skipped on every rank if any overflowed
    scaler.update()
    optimizer.zero_grad()

A skipped step still calls ``optimizer.step()``, with every gradient set to None: the optimizer
changes nothing (it skips parameters without a gradient, step counters included) while the
strategy keeps its bookkeeping (the ledger closes the step, zero all-gathers its unchanged
parameters), so the ranks stay in step. The gradients of a skipped step are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..arguments import count, flag, number
from ..comm.ledger import Tag


@dataclass
class _OptimizerState:
    unscaled: bool = False
    found_inf: bool = False
    stepped: bool = False


class ShardedGradScaler:
    """Dynamic loss scaling whose overflow check spans every rank (see the module docstring).

    Takes an optimizer returned by :func:`fsdp_mini.parallelize`; unscales the gradients its
    strategy says this rank owns (``Strategy.grads_for_norm``, as ``clip_grad_norm_`` does).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        init_scale = number("ShardedGradScaler(init_scale)", init_scale, above=0)
        growth_factor = number("ShardedGradScaler(growth_factor)", growth_factor, above=1)
        backoff_factor = number("ShardedGradScaler(backoff_factor)", backoff_factor, above=0,
                                below=1)
        growth_interval = count("ShardedGradScaler(growth_interval)", growth_interval,
                                unit="steps")
        self.enabled = flag("ShardedGradScaler(enabled)", enabled)
        self._scale, self._growth_tracker = float(init_scale), 0
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self._per_optimizer: dict[int, _OptimizerState] = {}

    def get_scale(self) -> float:
        return self._scale if self.enabled else 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the scale, in fp32 (a 16-bit loss times 65536 could overflow itself)."""
        if not self.enabled:
            return loss
        return loss * torch.tensor(self._scale, dtype=torch.float32, device=loss.device)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide this rank's gradients by the scale, in place, and find out (over every rank)
        whether any is inf or nan. Collective under zero1, zero2 and fsdp."""
        if not self.enabled:
            return
        engine, state = _engine_of(optimizer), self._state(optimizer)
        if state.unscaled:
            raise RuntimeError("unscale_() was already called on this optimizer since the last "
                               "update(); call it once per step, before step()")
        grads, _ = engine.grads_for_norm()
        bad = torch.zeros(1, device=engine.comm.device)  # offloaded gradients are on the CPU
        with torch.no_grad():
            for g in grads:
                g.mul_(1.0 / self._scale)  # Note: exact while the scale is a power of two
                if g.numel():
                    bad = torch.maximum(bad, (~torch.isfinite(g)).any().float().to(bad.device))
        if engine.comm.world_size > 1:
            # Note: also when gradients are whole copies (ddp): 4 bytes, and ranks that disagreed
            # on a skip would drift apart for good, silently.
            engine.comm.all_reduce(bad, label=Tag("scaler", "found_inf"), op="max")
        engine.after_clip()  # the kit's gradient watch: these in-place changes are intended
        state.unscaled, state.found_inf = True, bool(bad.item())

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """``optimizer.step()`` on unscaled gradients, or a step that changes nothing when some
        rank found an inf or nan."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        state = self._state(optimizer)
        if not state.unscaled:
            self.unscale_(optimizer)
        if state.found_inf:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
        state.stepped = True
        return optimizer.step(*args, **kwargs)

    def update(self) -> None:
        """Halve the scale after a skipped step; double it after ``growth_interval`` good ones."""
        if not self.enabled:
            return
        if not any(s.stepped for s in self._per_optimizer.values()):
            raise RuntimeError("update() before step(): call scaler.step(optimizer) first, once "
                               "per training step")
        if any(s.found_inf for s in self._per_optimizer.values()):
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._scale *= self.growth_factor
                self._growth_tracker = 0
        self._per_optimizer.clear()

    def found_inf(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this step of ``optimizer`` was (or will be) skipped; known after unscale_."""
        return self._state(optimizer).found_inf

    def state_dict(self) -> dict:
        return {"scale": self._scale, "growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        self._scale, self._growth_tracker = float(state["scale"]), int(state["growth_tracker"])

    def _state(self, optimizer) -> _OptimizerState:
        return self._per_optimizer.setdefault(id(optimizer), _OptimizerState())


def _engine_of(optimizer):
    engine = getattr(optimizer, "fsdp_mini", None)
    if engine is None:
        raise ValueError("ShardedGradScaler takes an optimizer returned by fsdp_mini.parallelize; "
                         "for a plain model use torch.amp.GradScaler")
    return engine

