"""Lab 01, where the memory goes on one device: measure a training step, draw it, bound the peak.

    from fsdp_mini import labs
    mem = labs.measure_step(GPTConfig.tiny(), batch_size=4)     # one step, in this process
    labs.draw_timeline(mem)                                      # memory by category, per phase
    labs.check_peak_predictor(predict_peak)                      # the exercise: a peak bound

Everything runs in the calling process: one device needs no ranks.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ...memory import CATEGORIES, MemoryTracker, track_memory
from ...models import GPTConfig, make_model
from ...telemetry.units import fmt_bytes
from ..common.exercise import not_written_yet
from ..common.report import CheckResult

__all__ = ["OPTIMIZERS", "at_peak_named", "check_peak_predictor", "draw_timeline",
           "make_optimizer", "measure_step", "peak_phase", "snapshot_table"]

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


# -- the checker of the exercise -------------------------------------------------------------

TOLERANCE = 0.01  # see check_peak_predictor's docstring
_PATTERNS = (  # (bytes per parameter for sgd, momentum, adam), what went wrong, hint
    ((8, 8, 8), "you left out the optimizer state",
     "Adam keeps two moments per parameter (m and v, 4 B each); SGD with momentum keeps one"),
    ((8, 12, 12), "you counted one moment for Adam; it keeps two",
     "Adam stores m (the mean of gradients) and v (the mean of squared gradients): 8 B"),
    ((8, 8, 16), "you left out the momentum buffer of SGD with momentum (4 B per parameter)", ""),
    ((4, 8, 12), "you left out the gradients (or the parameters): each is 4 B per parameter",
     "after backward every parameter has a .grad of its own size"),
    ((16, 16, 16), "you counted Adam's state for every optimizer: plain SGD keeps none",
     "did your function ignore its optimizer argument?"),
    ((0, 4, 8), "you counted only the optimizer state", "add the parameters and the gradients"),
    ((8, 12, 20), "you counted an fp32 master copy of the weights for Adam: that belongs to "
     "mixed precision (bf16 weights, fp32 master); in this fp32 step the parameters are the "
     "master", "Adam here: parameters 4 B + gradients 4 B + m and v 8 B = 16 B"),
    ((12, 16, 20), "you counted one 4-byte copy per parameter too many",
     "parameters 4 B + gradients 4 B + optimizer state (0, 4 or 8 B)"),
)
_SCALES = ((0.5, "you used 2 bytes per value (fp16/bf16 thinking); this step is fp32: 4 B each"),
           (8, "you counted bits, not bytes (32 bits = 4 bytes)"),
           *((scale, f"you returned {unit}, not bytes") for scale, unit in (
               (1e-3, "kB"), (1e-6, "MB"), (1e-9, "GB"), (2 ** -10, "KiB"), (2 ** -20, "MiB"),
               (2 ** -30, "GiB"))))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * abs(b)


def _fmt(values) -> str:
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"


def _measure_configs(config: GPTConfig, device) -> list[dict]:
    """The steps the checker measures: three models, three batch sizes, three optimizers."""
    cases = ((GPTConfig.tiny(), 2, "sgd"),
             (GPTConfig.tiny(n_layer=3, n_embd=48, n_head=4), 8, "momentum"), (config, 4, "adam"))
    out = []
    for cfg, batch, opt in cases:
        mem = measure_step(cfg, batch, optimizer=opt, device=device)
        peaks = mem.peak_by_category
        n = make_model(cfg).num_params()
        out.append({"what": f"GPT of {n:,} parameters, batch {batch}, {opt}", "n": n,
                    "optimizer": opt, "activations": peaks["activations"],
                    "state": peaks["params"] + peaks["grads"] + peaks["optimizer_state"],
                    "peak": mem.own_peak_bytes, "phase": peak_phase(mem)})
    return out


def _call(fn, result: CheckResult, *args):
    """fn(*args) as a float, or None after a ✘ line saying what went wrong."""
    call = f"predict_peak{args}"
    try:
        value = fn(*args)
    except Exception as exc:  # the learner's code: any error becomes one line
        result.wrong(f"{call} raised {type(exc).__name__}: {exc}",
                     hint=f"n_params and activation_bytes are numbers; optimizer: {OPTIMIZERS}")
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        result.wrong(f"{call} returned {value!r} ({type(value).__name__})",
                     hint="return the number of bytes, an int or a float")
        return None
    return float(value)


def _diagnose_state(per_param: dict, measured: dict, result: CheckResult):
    """Compare the learner's bytes per parameter (no activations) with the measured ones.

    Returns (right, scale): ``scale`` is the factor of a units mistake (MB for bytes...) that
    scales the whole answer, activations included, else None."""
    if all(_close(per_param[o], measured[o]) for o in OPTIMIZERS):
        for o in OPTIMIZERS:
            result.ok(f"model state with {o}: {per_param[o]:.1f} B per parameter, as measured")
        return True, None
    got = tuple(per_param[o] for o in OPTIMIZERS)
    versus = (f"(your formula: {_fmt(got)} B per parameter for sgd, momentum, adam; "
              f"measured: {_fmt(measured[o] for o in OPTIMIZERS)})")
    for pattern, message, hint in _PATTERNS:
        if all(_close(g, p) for g, p in zip(got, pattern)):
            result.wrong(f"{message} {versus}", hint)
            return False, None
    ratios = [per_param[o] / measured[o] for o in OPTIMIZERS]
    for scale, message in _SCALES:
        if all(_close(r, scale) for r in ratios):
            result.wrong(f"{message} {versus}")
            return False, (scale if scale < 0.5 else None)
    for o in OPTIMIZERS:
        result.check(_close(per_param[o], measured[o]),
                     f"model state with {o}: {per_param[o]:.1f} B per parameter, as measured",
                     f"model state with {o}: your formula gives {per_param[o]:.3g} B per "
                     f"parameter, measured {measured[o]:.3g}",
                     hint="parameters 4 B + gradients 4 B + optimizer state per parameter")
    return False, None


def check_peak_predictor(fn, config: GPTConfig | None = None, device="cpu") -> CheckResult:
    """Check ``fn(n_params, activation_bytes, optimizer)``: an upper bound of the peak bytes of
    one fp32 step, the model state plus the activations (what a memory planner budgets).

    The checker measures three steps with ``measure_step`` (the tiny GPT with SGD, a wider one
    with momentum, ``config`` with Adam; ``config`` defaults to the tiny GPT) and calls ``fn``
    with each model's parameter count and the peak of its "activations" category:

    - the model state, ``fn(n, 0, optimizer)``, must be the measured parameters + gradients +
      optimizer state, within ``TOLERANCE`` = 1 %. The formula leaves out only Adam's step
      counters (4 B per parameter tensor, 0.02 % of the tiny GPT's state); a mistake is 25 %
      off or more (a 4-byte value out of 16);
    - ``fn(n, A, optimizer) - fn(n, 0, optimizer)`` must be ``A``, within 1 %;
    - then the bound must not be below the measured peak (no category is ever above its own
      peak). How far above it is is reported, not judged: the true peak is lower, because the
      gradients appear while backward frees the activations.

    A wrong answer is named when it matches a known mistake (the optimizer state left out, one
    Adam moment, no gradients, 2 bytes per value, activations counted twice, MB not bytes...).
    """
    result = CheckResult("your upper bound of the peak memory")
    if not_written_yet(fn):
        result.wrong("predict_peak is not written yet: write its body in the cell above",
                     hint="labs.show_solution('01_predict_peak') shows one way")
        return result.finish()
    cases = _measure_configs(config or GPTConfig.tiny(), device)
    measured = {c["optimizer"]: c["state"] / c["n"] for c in cases}
    per_param = {}
    for c in cases:
        state = _call(fn, result, c["n"], 0, c["optimizer"])
        if state is None:
            return result.finish()
        per_param[c["optimizer"]] = state / c["n"]
    state_ok, scale = _diagnose_state(per_param, measured, result)
    activations_ok = True
    for c in cases:
        total = _call(fn, result, c["n"], c["activations"], c["optimizer"])
        if total is None:
            return result.finish()
        added = (total - per_param[c["optimizer"]] * c["n"]) / c["activations"]
        c["predicted"] = total
        if scale is not None and _close(added, scale):
            activations_ok = False  # the units mistake, already named
        elif not _close(added, 1.0):
            activations_ok = False
            what = ("you counted the activations twice" if _close(added, 2.0) else
                    "you left out the activations" if abs(added) < TOLERANCE else
                    f"your bound grows by {added:.3g} x the activation bytes")
            result.wrong(f"{what} ({c['what']})",
                         hint="the activations are alive once: saved in forward, freed in "
                              "backward; add activation_bytes once")
            break
    if activations_ok:
        result.ok("activation_bytes added once, as measured")
    why = {"backward": " (the true peak is lower: the gradients appear while backward frees the "
                       "activations)",
           "step": " (the true peak is lower: it is in optimizer.step(), when the activations "
                   "are freed and only the step's temporaries are alive)"}
    told = set()
    for c in cases if state_ok and activations_ok else []:
        said = "" if c["phase"] in told else why.get(c["phase"], "")
        told.add(c["phase"])
        result.check(c["predicted"] >= c["peak"] * (1 - TOLERANCE),
                     f"{c['what']}: your bound {fmt_bytes(c['predicted'])} is "
                     f"{c['predicted'] / c['peak'] - 1:.0%} above the measured peak "
                     f"{fmt_bytes(c['peak'])}, in {c['phase']}" + said,
                     f"{c['what']}: your bound {fmt_bytes(c['predicted'])} is below the measured "
                     f"peak {fmt_bytes(c['peak'])}: a bound must not be")
    result.facts["cases"] = cases
    return result.finish()
