"""Lab 01's measurements: one training step in this process, marked at each phase, and its
timeline drawn by memory category.

    mem = labs.measure_step(GPTConfig.tiny(), batch_size=4)     # one step, in this process
    labs.draw_timeline(mem)                                      # memory by category, per phase
"""

from __future__ import annotations

from functools import partial

import torch

from ...memory import CATEGORIES, MemoryTracker, track_memory
from ...models import GPTConfig, make_model
from ...telemetry.units import fmt_bytes

__all__ = ["OPTIMIZERS", "at_peak_named", "draw_timeline", "make_optimizer", "measure_step",
           "peak_phase", "snapshot_table"]

OPTIMIZERS = ("sgd", "momentum", "adam")  # no state; one buffer; two moments per parameter
PHASES = ("start", "forward", "backward", "step", "zero_grad")  # the marks of measure_step


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    """``"sgd"``, ``"momentum"`` (SGD with momentum 0.9) or ``"adam"``, over ``params``.

    Note: ``foreach=False`` keeps the update to one parameter at a time. The for-each update
    (the default on GPUs) allocates temporaries as large as the whole model state, which would
    show up in the catch-all "activations" during ``optimizer.step()`` (``at_peak_named`` calls
    them what they are there: the step's temporaries).
    """
    makers = {"sgd": partial(torch.optim.SGD, lr=1e-3, foreach=False),
              "momentum": partial(torch.optim.SGD, lr=1e-3, momentum=0.9, foreach=False),
              "adam": partial(torch.optim.Adam, lr=1e-3, foreach=False)}
    if name not in makers:
        raise ValueError(f"unknown optimizer {name!r}; use one of {OPTIMIZERS}")
    return makers[name](params)


def _mark_inside(model, mem: MemoryTracker) -> list:
    """Marks after each block's forward and after each gradient is ready (labels start '· ')."""
    def marker(label):
        def hook(*_):
            mem.mark(label)  # Note: returns None; a forward hook's return value replaces the output
        return hook
    handles = [block.register_forward_hook(marker(f"· forward block {k}"))
               for k, block in enumerate(model.blocks)]
    handles += [p.register_post_accumulate_grad_hook(marker(f"· grad {n}"))
                for n, p in model.named_parameters()]
    return handles


def measure_step(config: GPTConfig, batch_size: int, seq_len: int | None = None,
                 optimizer: str = "adam", device="cpu", fine: bool = False) -> MemoryTracker:
    """Train a fresh GPT on random tokens and measure one step with ``track_memory``.

    The step measured is a steady one: Adam and momentum make their state at their first
    ``step()``, so that step runs first. Marks: ``PHASES``, and with ``fine=True`` one after
    each block's forward and one after each gradient. ``seq_len`` defaults to the block size.

        mem = measure_step(GPTConfig.tiny(), batch_size=2, optimizer="sgd")
        mem.peak_by_category["params"]      # 4 B x 27,840 parameters = 111,360 B
    """
    seq_len = config.block_size if seq_len is None else seq_len
    if batch_size < 1 or not 1 <= seq_len <= config.block_size:
        raise ValueError(f"need batch_size >= 1 and 1 <= seq_len <= block_size "
                         f"({config.block_size}); got {batch_size} and {seq_len}")
    model = make_model(config).to(device)
    opt = make_optimizer(optimizer, model.parameters())
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(config.vocab_size, (batch_size, seq_len), generator=g).to(device)
            for _ in range(2))
    if optimizer != "sgd":  # a first step, which creates the optimizer's state
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    with track_memory(model, opt) as mem:
        handles = _mark_inside(model, mem) if fine else []
        mem.mark("start")
        loss = model(x, y)[1]  # Note: no variable keeps the logits alive after backward
        mem.mark("forward")
        loss.backward()
        mem.mark("backward")
        opt.step()
        mem.mark("step")
        opt.zero_grad()  # set_to_none=True, torch's default: the gradients are freed
        mem.mark("zero_grad")
    for h in handles:
        h.remove()
    return mem


# What the catch-all category "activations" holds, by the phase it is read in: in forward and
# backward what autograd saved (and backward's temporaries); in optimizer.step() only the step's
# own temporaries (the activations are freed by then); after zero_grad, the loss alone.
HELD_IN = {"forward": "activations (saved for backward)",
           "backward": "activations and backward's temporaries",
           "step": "temporaries of optimizer.step()", "zero_grad": "activations", "start": "activations"}


def _phase_of(label: str) -> str:
    """The phase a mark ends: "1: step" -> "step", "· grad wte.weight" -> "backward"."""
    name = label.split(":", 1)[-1].strip()
    if "zero_grad" in name:
        return "zero_grad"
    for phase, words in (("step", ("step",)), ("backward", ("backward", "grad")),
                         ("forward", ("forward",)), ("start", ("start",))):
        if any(w in name for w in words):
            return phase
    return name


def peak_phase(mem: MemoryTracker) -> str:
    """The phase in which the step's peak happened: "forward", "backward", "step"... — the one
    ended by the first mark at which the tracker's peak had reached its final value."""
    mark = next((s.label for s in mem.snapshots if s.own_peak_bytes >= mem.own_peak_bytes), None)
    return "after the last mark" if mark is None else _phase_of(mark)


def at_peak_named(mem: MemoryTracker) -> dict[str, int]:
    """``mem.at_peak`` with the catch-all "activations" named for what it holds at the peak: in
    ``optimizer.step()`` those bytes are the step's temporaries, not activations."""
    held = HELD_IN.get(peak_phase(mem), "activations, temporaries")
    return {(held if c == "activations" else c): b for c, b in mem.at_peak.items() if b}


def snapshot_table(snapshots) -> str:
    """The snapshots of a tracker as a text table: one row per mark, one column per category."""
    cats = ("params", "grads", "optimizer_state", "activations")
    rows = [["mark"] + [c.replace("optimizer_state", "optimizer") for c in cats] + ["total"]]
    for s in snapshots:
        own = sum(s.by_category.values())
        rows.append([s.label] + [fmt_bytes(s.by_category[c]) for c in cats] + [fmt_bytes(own)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))) for row in rows)


def draw_timeline(mem: MemoryTracker, title: str = "", ax=None):
    """A bar per mark of ``mem``, stacked by category, and the peak as a line: a matplotlib Figure.
    Marks whose label starts with '· ' (``fine=True``) get no tick label."""
    # Note: imported here, so that the checkers work where matplotlib is not installed.
    from matplotlib.figure import Figure

    from ...plots import CATEGORY_COLORS, CATEGORY_NAMES, _byte_axis
    if ax is None:
        ax = Figure(figsize=(8, 3.6), layout="constrained").add_subplot()
    snaps = mem.snapshots
    bottom = [0] * len(snaps)
    for cat in CATEGORIES:
        heights = [s.by_category.get(cat, 0) for s in snaps]
        if any(heights):
            # Note: at a mark the step's temporaries are already freed: the bars' "activations"
            # are what forward saved (and backward's temporaries), never the step's
            name = ("activations (saved), backward's temporaries" if cat == "activations"
                    else CATEGORY_NAMES[cat])
            ax.bar(range(len(snaps)), heights, bottom=bottom, width=0.85,
                   color=CATEGORY_COLORS[cat], label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
    phase = peak_phase(mem)
    ax.axhline(mem.own_peak_bytes, color="black", ls="--", lw=1,
               label=f"peak, in {phase} (between marks): {fmt_bytes(mem.own_peak_bytes)}")
    ticks = [(i, s.label) for i, s in enumerate(snaps) if not s.label.startswith("· ")]
    crowded = len(ticks) > 6 and len(ticks) == len(snaps)
    ax.set_xticks([i for i, _ in ticks], [label for _, label in ticks], fontsize=8,
                  rotation=40 if crowded else 0, ha="right" if crowded else "center")
    if len(ticks) < len(snaps):
        _stagger(ax, [i for i, _ in ticks], [label for _, label in ticks], len(snaps))
    _byte_axis(ax.yaxis)
    ax.set_ylim(0, mem.own_peak_bytes * 1.3)
    ax.set_title(title or "Memory at each mark, by category", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", ncol=2, frameon=False)
    return ax.figure


def _stagger(ax, where, labels, n_bars, fontsize=8):
    """Labels of neighbouring bars (backward, step, zero_grad) would overlap: each label goes to
    the highest row where it fits, on a tick that reaches down to that row."""
    per_bar = ax.get_position().width * ax.figure.get_figwidth() * 72 / n_bars  # points
    row_ends: list[float] = []  # per row, where (in bars) its last label ends
    for tick, i, label in zip(ax.xaxis.get_major_ticks(len(where)), where, labels):
        half = (0.3 * fontsize * len(label) + 2) / per_bar  # half a label, in bars (a guess)
        row = next((k for k, end in enumerate(row_ends) if i - half > end), len(row_ends))
        row_ends[row:row + 1] = [i + half]
        tick.tick1line.set_markersize(3.5 + 1.4 * fontsize * row)
        tick.set_pad(3.5 + 1.4 * fontsize * row)
