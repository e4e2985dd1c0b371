"""One job four ways: fsdp_mini's ``ddp`` and ``fsdp``, torch's DDP and FSDP2 (``fully_shard``),
each built on the same model with AdamW, measured side by side; and HSDP's bytes per group.

    model, opt = build("torch fully_shard", make_model(GPTConfig.tiny()))   # on a started rank
    per_kind = side_by_side(rank, world_size, GPTConfig.tiny(), steps=3, global_batch=4)
    hsdp_bytes(rank, world_size, 2, GPTConfig.tiny())    # bytes inside a shard group and across
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from functools import partial

import torch
import torch.distributed as dist

from .dispatch_bytes import CollectiveBytes

__all__ = ["KINDS", "build", "hsdp_bytes", "side_by_side"]

KINDS = ("fsdp_mini ddp", "torch DDP", "fsdp_mini fsdp", "torch fully_shard")


def build(kind: str, net, lr: float = 1e-3, param_dtype=None):
    """``(model, optimizer)`` for one of :data:`KINDS`; every block is a unit (fsdp_mini's
    ``units=``, torch's ``fully_shard`` on each block, then on the root)."""
    from ..api import parallelize
    adamw = partial(torch.optim.AdamW, lr=lr)
    if kind == "fsdp_mini ddp":
        return parallelize(net, "ddp", optimizer=adamw)
    if kind == "fsdp_mini fsdp":
        mp = ({"param_dtype": param_dtype, "reduce_dtype": torch.float32} if param_dtype else {})
        return parallelize(net, "fsdp", optimizer=adamw, units=list(net.blocks), **mp)
    if kind == "torch DDP":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(net)
        return ddp, adamw(ddp.parameters())
    if kind == "torch fully_shard":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32
                                      if param_dtype else None)
        for block in net.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(net, mp_policy=policy)
        return net, adamw(net.parameters())
    raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")


def side_by_side(rank, world_size, cfg, steps=3, global_batch=4, kinds=KINDS) -> dict:
    """Train the GPT of ``cfg`` under each of ``kinds`` in turn, same data, AdamW. Per kind:
    ``state`` and ``by_category`` after the last step's update, ``peak_by_category`` and
    ``own_peak`` of that step (``track_memory``), ``sent`` by collective in that step (the
    dispatcher's view, :class:`CollectiveBytes`) and ``ledger`` (fsdp_mini's own record, None for
    torch), ``calls`` (the collectives of that step), ``first_seconds`` (step 0, with the one-off
    set-up) and the median ``seconds`` of the warm steps between (``first_opt_seconds``,
    ``opt_seconds``: the same for ``opt.step()`` alone), ``losses``. Under ``"dtensor"``: what
    FSDP2 made of the first parameters (placements, local and full shapes, ``full_tensor()``
    equal to the unsharded weight)."""
    from ..memory import PERSISTENT, track_memory
    from ..models import GPTConfig, SyntheticText, make_model
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(cfg) if isinstance(cfg, str) else cfg   # a preset's name, or its config
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    out = {}
    for kind in kinds:
        net, opt = build(kind, make_model(cfg))
        if kind == "torch fully_shard":
            out["dtensor"] = _dtensor_view(net, make_model(cfg))
        ledger = getattr(getattr(net, "fsdp_mini", None), "comm", None)
        ledger = ledger.ledger if ledger else None
        losses, seconds, opt_seconds = [], [], []
        for step in range(steps):
            x, y = data.local_batch(step, global_batch, rank, world_size)
            last = step == steps - 1
            if ledger is not None:
                ledger.next_step()
            dist.barrier()
            with (track_memory(net, opt) if last else nullcontext()) as mem, \
                    (CollectiveBytes(world_size) if last else nullcontext()) as sent:
                start = time.perf_counter()
                _, loss = net(x, y)
                loss.backward()
                before_step = time.perf_counter()
                opt.step()
                opt_seconds.append(time.perf_counter() - before_step)
                if last:
                    mem.mark("after_step")
                opt.zero_grad()
                seconds.append(time.perf_counter() - start)
            losses.append(loss.item())
        after = next(s.by_category for s in mem.snapshots if s.label == "after_step")
        out[kind] = {
            "state": sum(after[c] for c in PERSISTENT), "by_category": after,
            "peak_by_category": mem.peak_by_category, "own_peak": mem.own_peak_bytes,
            "sent": sent.totals(), "calls": list(sent.calls),
            "ledger": (None if ledger is None else
                       {op: t.sent_bytes for op, t in ledger.totals(step=ledger.step).items()}),
            # Note: step 0 builds what each library sets up lazily (and AdamW's state), and the
            # last one is slowed by the measuring: the warm steps are those between.
            "first_seconds": seconds[0], "losses": losses,
            "seconds": statistics.median(seconds[1:-1] or seconds[:-1] or seconds),
            "first_opt_seconds": opt_seconds[0],
            "opt_seconds": statistics.median(opt_seconds[1:-1] or opt_seconds[:-1] or opt_seconds),
            "params": sum(p.numel() for p in make_model(cfg).parameters())}
        del net, opt
    return out


def _dtensor_view(net, plain) -> list[dict]:
    """The first three parameters of an FSDP2 model as DTensors, beside the unsharded ones."""
    rows = []
    for (name, p), q in list(zip(net.named_parameters(), plain.parameters()))[:3]:
        full = p.full_tensor()  # Note: a collective: every rank calls it
        rows.append({"name": name, "type": type(p).__name__, "placements": str(p.placements),
                     "local": tuple(p.to_local().shape), "full": tuple(full.shape),
                     "equal": bool(torch.equal(full, q.detach()))})
    return rows


def hsdp_bytes(rank, world_size, shard_size, cfg, steps=2, global_batch=4) -> dict:
    """Train the GPT of ``cfg`` under ``hsdp`` with ``shard_size`` ranks per group; this rank's
    bytes of the last step by ledger group (``"shard"``, ``"replicate"``) and by group and
    collective (``by_op``: ``{"replicate all_reduce": ..., ...}``), the formulas' total
    (``expected``), the padded Ψ (``padded``) and the losses."""
    from ..api import expected_costs, parallelize
    from ..models import GPTConfig, SyntheticText, make_model
    from ..training import train
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(cfg) if isinstance(cfg, str) else cfg
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    net = make_model(cfg)
    net, opt = parallelize(net, "hsdp", units=list(net.blocks), shard_size=shard_size,
                           optimizer=partial(torch.optim.AdamW, lr=1e-3))
    run = train(net, opt, lambda s: data.local_batch(s, global_batch, rank, world_size), steps)
    ledger = net.fsdp_mini.comm.ledger
    last = [r for r in ledger.records if r.step == ledger.steps()[-1]]
    by_op = {}
    for r in last:
        by_op[(r.group, r.op)] = by_op.get((r.group, r.op), 0) + r.sent_bytes
    return {"by_group": {g: sum(r.sent_bytes for r in last if r.group == g)
                         for g in ("shard", "replicate")},
            "by_op": {f"{g} {op}": b for (g, op), b in sorted(by_op.items())},
            "expected": expected_costs(net)["sent_bytes_per_step"],
            "padded": net.fsdp_mini.padded_numel(), "losses": run.losses}
