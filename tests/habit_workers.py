"""Training loops with ordinary plain-torch habits, run on every rank by tests/test_habits.py.

Each loop runs the same code on a parallelized model (any strategy, any world size) and, for the
reference, on a plain model in one process; the tests compare the parameters.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

import fsdp_mini

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
ADAMW = partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
GLOBAL_BATCH = 12


class Block(nn.Module):
    """One FSDP unit whose parameters are not all used every step."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.first_step_only = nn.Linear(6, 6)  # used in step 0 only
        self.never = nn.Parameter(torch.randn(5))  # never used

    def forward(self, h, step):
        h = torch.tanh(self.lin(h))
        return h + self.first_step_only(h) if step == 0 else h


class Habits(nn.Module):
    def __init__(self, seed: int = 0):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            super().__init__()
            self.block = Block()
            self.head = nn.Linear(6, 3)
            self.rank0_only = nn.Linear(6, 6)  # used on rank 0 only (when asked)

    def forward(self, x, y, step=1, use_rank0_only=False):
        h = self.block(x, step)
        if use_rank0_only:
            h = h + self.rank0_only(h)
        return ((self.head(h) - y) ** 2).mean()


def batch(step: int, rank: int = 0, world_size: int = 1):
    g = torch.Generator().manual_seed(500 + step)
    x, y = torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)
    n = GLOBAL_BATCH // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def _wrap(strategy, rank, world_size, units_as=list, **kw):
    model = Habits()
    if strategy == "plain":
        return model, ADAMW([p for p in model.parameters() if p.requires_grad])
    units = units_as([model.block]) if units_as is not None else None
    return fsdp_mini.parallelize(model, strategy, optimizer=ADAMW, units=units, **kw)


def _state(model, strategy):
    if strategy == "plain":
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {k: v.cpu() for k, v in fsdp_mini.full_state_dict(model).items()}


def unused_parameters(rank, world_size, strategy, steps=3):
    """Unused and once-used parameters: grads stay None, AdamW leaves them alone."""
    ws = 1 if strategy == "plain" else world_size
    model, opt = _wrap(strategy, rank, ws)
    grads_none = []
    for step in range(steps):
        x, y = batch(step, rank if ws > 1 else 0, ws)
        model(x, y, step).backward()
        grads_none.append({n: p.grad is None for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return {"state": _state(model, strategy), "grads_none": grads_none}


def freeze_after_parallelize(rank, world_size, strategy, zero_grad="optimizer", steps=3):
    """``block.lin`` frozen after step 0; gradients cleared with model.zero_grad() or not."""
    ws = 1 if strategy == "plain" else world_size
    model, opt = _wrap(strategy, rank, ws)
    for step in range(steps):
        if step == 1:
            model.block.lin.requires_grad_(False)
        x, y = batch(step, rank if ws > 1 else 0, ws)
        model(x, y, step).backward()
        opt.step()
        (model if zero_grad == "model" else opt).zero_grad()
    return _state(model, strategy)


def step_without_backward(rank, world_size, strategy):
    """One real step, then zero_grad and a step with no backward: nothing may move."""
    model, opt = _wrap(strategy, rank, world_size)
    x, y = batch(0, rank, world_size)
    model(x, y, 1).backward()
    opt.step()
    opt.zero_grad()
    before = _state(model, strategy)
    opt.step()
    return before, _state(model, strategy)


def rank0_only_parameter(rank, world_size, strategy, steps=3):
    """A parameter used on rank 0 only: averaged over ranks (zeros from the others), as torch's
    DDP(find_unused_parameters=True) does; strategy "torch" runs exactly that."""
    if strategy == "torch":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(Habits(), find_unused_parameters=True)
        opt = ADAMW(model.parameters())
    else:
        model, opt = _wrap(strategy, rank, world_size)
    for step in range(steps):
        x, y = batch(step, rank, world_size)
        model(x, y, 1, use_rank0_only=rank == 0).backward()
        opt.step()
        opt.zero_grad()
    if strategy == "torch":
        return {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return _state(model, strategy)


def units_from_a_generator(rank, world_size):
    model, opt = _wrap("fsdp", rank, world_size, units_as=lambda u: (m for m in u))
    for step in range(2):
        x, y = batch(step, rank, world_size)
        model(x, y, 1).backward()
        opt.step()
        opt.zero_grad()
    return {"units": [u.name for u in model.fsdp_mini.units], "state": _state(model, "fsdp")}


def clipping(rank, world_size, strategy, norm_type=2.0, max_norm=0.05, steps=3):
    """fsdp_mini.clip_grad_norm_ on a parallelized model; torch's on the plain one."""
    ws = 1 if strategy == "plain" else world_size
    model, opt = _wrap(strategy, rank, ws)
    norms = []
    for step in range(steps):
        x, y = batch(step, rank if ws > 1 else 0, ws)
        model(x, y, step).backward()
        if strategy == "plain":
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)
        else:
            norm = fsdp_mini.clip_grad_norm_(model, max_norm, norm_type)
        norms.append(float(norm))
        opt.step()
        opt.zero_grad()
    return {"state": _state(model, strategy), "norms": norms}


def torch_clip_on_sharded_grads(rank, world_size, strategy):
    """The habit that is wrong under zero1, zero2 and fsdp: the clip (zero2) or the next step
    (zero1, fsdp) must raise, not compute."""
    model, opt = _wrap(strategy, rank, world_size)
    x, y = batch(0, rank, world_size)
    model(x, y, 1).backward()
    try:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        opt.step()
    except RuntimeError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def mismatch_at_step_two(rank, world_size):
    """Rank 1 skips the block in the third step (step 2, counted from 0 like the loop); nobody
    advances the ledger by hand."""
    model, opt = _wrap("fsdp", rank, world_size, check_collectives=True)
    for step in range(3):
        x, y = batch(step, rank, world_size)
        if rank == 1 and step == 2:
            model.block.forward = lambda h, step: h  # skip the unit: no all-gather here
        model(x, y, 1).backward()
        opt.step()
        opt.zero_grad()


def ledger_steps(rank, world_size, strategy, manual):
    """Bytes per step with the ledger advanced by optimizer.step() alone, or by hand too."""
    model, opt = _wrap(strategy, rank, world_size)
    ledger = model.fsdp_mini.comm.ledger
    first = ledger.step
    seen = []
    for step in range(3):
        if manual:
            ledger.next_step()
        x, y = batch(step, rank, world_size)
        model(x, y, 1).backward()
        opt.step()
        seen.append(ledger.step)
        opt.zero_grad()
    return {"first": first, "seen": seen,
            "sent": [ledger.sent_bytes(step=s) for s in seen],
            "expected": fsdp_mini.expected_costs(model)["sent_bytes_per_step"]}


def summon(rank, world_size, strategy):
    """Whole weights inside summon_full_params; writes kept only with writeback=True."""
    model, opt = _wrap(strategy, rank, world_size)
    x, y = batch(0, rank, world_size)
    model(x, y, 1).backward()
    opt.step()
    opt.zero_grad()
    reference = _state(model, strategy)
    out = {"outside_shape": tuple(model.block.lin.weight.shape),
           "outside_norm_is_finite": bool(torch.isfinite(model.block.lin.weight.norm()))}
    with fsdp_mini.summon_full_params(model):
        out["inside"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            model.head.weight.fill_(7.0)
    out["after_discard"] = _state(model, strategy)
    with fsdp_mini.summon_full_params(model, writeback=True):
        with torch.no_grad():
            model.head.weight.fill_(3.0)
    out["after_writeback"] = _state(model, strategy)
    out["reference"] = reference
    model(x, y, 1).backward()  # training still works afterwards
    opt.step()
    return out


def run_all(rank, world_size):
    """Everything above for every strategy, in one launch (ranks start once)."""
    out = {}
    for s in STRATEGIES:
        out["unused", s] = unused_parameters(rank, world_size, s)
        out["freeze", s] = freeze_after_parallelize(rank, world_size, s)
        out["freeze+model.zero_grad", s] = freeze_after_parallelize(rank, world_size, s, "model")
        out["no_backward", s] = step_without_backward(rank, world_size, s)
        out["rank0_only", s] = rank0_only_parameter(rank, world_size, s)
        out["clip2", s] = clipping(rank, world_size, s)
        out["clip_inf", s] = clipping(rank, world_size, s, norm_type=float("inf"), max_norm=0.02)
        out["torch_clip", s] = torch_clip_on_sharded_grads(rank, world_size, s)
        out["summon", s] = summon(rank, world_size, s)
        out["ledger_auto", s] = ledger_steps(rank, world_size, s, manual=False)
        out["ledger_manual", s] = ledger_steps(rank, world_size, s, manual=True)
    out["rank0_only", "torch"] = rank0_only_parameter(rank, world_size, "torch")
    out["generator"] = units_from_a_generator(rank, world_size)
    return out
