"""Lab 06's measurements: the fsdp variants side by side on one link, and DDP against FSDP on
links of several bandwidths (the rank functions; the α-β analysis of what they measure is the
kit's :mod:`fsdp_mini.telemetry.crossover`, the timeline :mod:`fsdp_mini.plots.overlap`).

    per_rank = fsdp_mini.launch(options_rank, N, "tiny", OPTION_VARIANTS, 4, Link(0.02, 200))
    alone = fsdp_mini.launch(crossover_rank, N, "tiny", [], 4, 50.0)      # no link
    kit = predict_from_ledger(alone, 50.0, margin=0.2)                    # C, L, B -> b*
    swept = fsdp_mini.launch(crossover_rank, N, "tiny", [kit["predicted"] / 4], 4, 50.0)
    crossover_table(swept, [kit["predicted"] / 4], kit, 0.2)              # fitted bytes
"""

from __future__ import annotations

from functools import partial

from ...comm.link import Link
from ...plots.overlap import timeline
from ...telemetry.crossover import (crossover_table, ledger_costs, measured_crossover,
                                    predict_from_ledger, solve_crossover)

__all__ = ["OPTION_VARIANTS", "crossover_rank", "crossover_table", "ledger_costs",
           "measured_crossover", "options_rank", "predict_from_ledger", "solve_crossover",
           "timeline"]

# name: (units, fsdp options); units "root" (none: the root unit holds all), "blocks", "layers"
# (each block's attention and MLP: finer). Note: all on one link, so that waiting shows.
OPTION_VARIANTS = {"root only": ("root", {}), "blocks": ("blocks", {}),
                   "layers": ("layers", {}), "blocks, prefetch": ("blocks", {"prefetch": 1}),
                   "blocks, keep gathered": ("blocks", {"reshard_after_forward": False})}


def _units(model, kind: str):
    if kind == "root":
        return None
    if kind == "blocks":
        return list(model.blocks)
    return [m for b in model.blocks for m in (b.attn, b.mlp)]


def _build(kind, strategy, options, link, cfg):
    import torch

    from ...api import parallelize
    from ...models import make_model
    m = make_model(cfg)
    units = _units(m, kind) if strategy == "fsdp" else None
    return parallelize(m, strategy, units=units, link=link,
                       optimizer=partial(torch.optim.AdamW, lr=1e-3), **options)


def _run(rank, world_size, cfg, models: dict, steps: int, global_batch: int) -> dict:
    """The models in turns (:func:`~fsdp_mini.training.train_in_turns`); step 0 is warm-up."""
    from ...models import SyntheticText
    from ...training import train_in_turns
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    return train_in_turns(models, lambda step: data.local_batch(step, global_batch, rank,
                                                                world_size), steps)


def options_rank(rank, world_size, model, variants, steps, link, global_batch=4) -> dict:
    """Each fsdp variant of ``variants`` ({name: (units, options)}) on ``link``: step seconds,
    compute, the last step's ledger records, and the peak of gathered parameters."""
    import torch

    from ...memory import track_memory
    from ...models import GPTConfig, SyntheticText
    from ...training import train_step
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model)
    models = {n: _build(kind, "fsdp", opts, link, cfg) for n, (kind, opts) in variants.items()}
    out = _run(rank, world_size, cfg, models, steps, global_batch)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    for name, (net, opt) in models.items():  # Note: one more step, alone, to read the peak
        with track_memory(net, opt) as mem:
            train_step(net, opt, data.local_batch(0, global_batch, rank, world_size))
        out[name]["gathered_peak"] = mem.peak_by_category["gathered_params"]
    return out


def crossover_rank(rank, world_size, model, bandwidths, steps, latency_us, global_batch=4) -> dict:
    """ddp and fsdp (units = blocks, no prefetch) on ``Link(b, latency_us)`` for each b (both
    without a link when ``bandwidths`` is empty: key None), in turns step by step:
    {(name, b): seconds, blocked, compute, records}."""
    import torch

    from ...models import GPTConfig
    torch.set_num_threads(1)
    cfg = GPTConfig.sized(model)
    out = {}
    for bw in bandwidths or [None]:
        link = Link(bw, latency_us) if bw else None
        models = {s: _build("blocks", s, {}, link, cfg) for s in ("ddp", "fsdp")}
        got = _run(rank, world_size, cfg, models, steps, global_batch)
        out.update({(s, bw): v for s, v in got.items()})
    return out
