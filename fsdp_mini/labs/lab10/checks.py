"""Lab 10: to production. The same job under fsdp_mini and under torch's own DDP and FSDP2
(``fully_shard``), measured side by side; a script under torchrun; the checker of your port.

    per_rank = fsdp_mini.launch(labs.measure_side_by_side, 2)   # memory, bytes, time, losses
    labs.torchrun("train.py", nproc=2)                          # torchrun, bounded, no leftovers
    labs.check_port_to_fsdp2(port_to_fsdp2)                     # ✔/✘ lines on 2 ranks

Bytes: fsdp_mini's ledger sees only fsdp_mini's collectives. For torch, :class:`CollectiveBytes`
watches the collectives that reach torch's dispatcher (``c10d`` ops: FSDP2's all-gathers and
reduce-scatters, DDP's bucket all-reduces) and prices each with the same ring model as the ledger.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from functools import partial

import torch
import torch.distributed as dist

from .dispatch_bytes import CollectiveBytes
from .four_jobs import KINDS, build
from .port_check import check_port_to_fsdp2, judge_port, port_runs  # noqa: F401
from .torchrun_cell import torchrun

__all__ = [
    "KINDS",
    "CollectiveBytes",
    "check_port_to_fsdp2",
    "measure_hsdp",
    "measure_side_by_side",
    "torchrun",
]

def measure_side_by_side(rank, world_size, model="tiny", steps=3, global_batch=4, kinds=KINDS):
    """Train the GPT under each of ``kinds`` in turn, same data, AdamW. Per kind: ``state`` and
    ``by_category`` after the last step's update, ``peak_by_category`` and ``own_peak`` of that
    step (``track_memory``), ``sent`` by collective in that step (the dispatcher's view,
    :class:`CollectiveBytes`) and ``ledger`` (fsdp_mini's own record, None for torch), ``calls``
    (the collectives of that step), ``first_seconds`` (step 0, with the one-off set-up) and the
    median ``seconds`` of the warm steps between (``first_opt_seconds``, ``opt_seconds``: the same
    for ``opt.step()`` alone), ``losses``. Under ``"dtensor"``: what FSDP2 made of the
    first parameters (placements, local and full shapes, ``full_tensor()`` equal to the
    unsharded weight)."""
    import fsdp_mini

    from ...memory import PERSISTENT
    from ...models import GPTConfig, SyntheticText, make_model
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model)
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
            with (fsdp_mini.track_memory(net, opt) if last else nullcontext()) as mem, \
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


# -- HSDP: bytes inside a shard group and across groups ----------------------------------------

def measure_hsdp(rank, world_size, shard_size, model="tiny", steps=2, global_batch=4):
    """Train the GPT under ``hsdp`` with ``shard_size`` ranks per group; this rank's bytes of the
    last step by ledger group (``"shard"``, ``"replicate"``) and by group and collective
    (``by_op``: ``{"replicate all_reduce": ..., ...}``), the formulas' total
    (``expected_costs``), the padded Ψ and the losses."""
    import fsdp_mini

    from ...models import GPTConfig, SyntheticText, make_model
    from ...training import train
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    net = make_model(cfg)
    net, opt = fsdp_mini.parallelize(net, "hsdp", units=list(net.blocks), shard_size=shard_size,
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
            "expected": fsdp_mini.expected_costs(net)["sent_bytes_per_step"],
            "padded": net.fsdp_mini.padded_numel(), "losses": run.losses}
