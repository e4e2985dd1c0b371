"""What the decks show, measured at build time: one run of the kit, or a report recorded elsewhere.

    measured = measure("laptop")                              # runs the kit now (about a minute)
    measured = measure("laptop", compare_json="gpu8.json")    # the main job's numbers from a GPU box

Four sources, each drawn by ``fsdp_mini.plots`` and each number formatted for the slides:

    the main job     fsdp-mini compare: memory by category, state, bytes per step, per strategy
                     (run now, or read from ``fsdp-mini compare --json`` files); run here, each
                     rank also keeps its breakdown at the peak (``at_peak``) and its state by
                     category (``state_by_category``), which the figures draw
    a telemetry run  ddp and fsdp with a Recorder: the saw-tooth, and on timelines how much of
                     the communication ran under compute (the slides claim an overlap only
                     where it was measured)
    the kit itself   a unit's flat buffer (``FlatLayout``, ``ShardPieces``) at the run's world
                     size; lab 02's reference ring all-reduce, run on threads, step by step
    the planner      fsdp_mini.plan for 7B on 8 GPUs and 70B on 64 GPUs (formulas, no ranks)

Every placeholder a deck uses (``{{ fsdp.state }}``) is a key of ``Measured.numbers``; a deck
asking for one that no run produced fails the build. Every figure's texts (what it says, in what
size, and whether it is inside the picture) are kept in ``Measured.texts``, so that a test can
read each number back from the run.
"""

from __future__ import annotations

import io
import queue
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

import fsdp_mini
from fsdp_mini import plots
from fsdp_mini.buffers.flat import FlatLayout, ParamSlot
from fsdp_mini.comm.ledger import ring_bytes
from fsdp_mini.fsdp.units import assign_slots, check_units
from fsdp_mini.jobs.compare import CompareConfig, gather_report, run_info
from fsdp_mini.launcher.inputs import pick_backend
from fsdp_mini.memory import PERSISTENT
from fsdp_mini.models import GPTConfig, make_model
from fsdp_mini.plots import diagrams
from fsdp_mini.telemetry import load_events
from fsdp_mini.telemetry.units import fmt_bytes, fmt_seconds

from compare_report import (STRATEGIES, RANK_FIELDS, ReportError, check_report,  # noqa: F401
                            read_report)

# Note: the ranks are fresh processes that cannot import this file (it is no package): the rank
# function below travels by value, like a notebook's.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SIZES = {  # what "laptop" and "ci" run (the labs' sizes: 4 ranks of the default GPT, or tiny)
    "laptop": {"world_size": 4, "model": "default", "steps": 8, "global_batch": 8},
    "ci": {"world_size": 2, "model": "tiny", "steps": 4, "global_batch": 4},
}
SHOWS_OVERLAP = 0.25  # the share of a rank's communication under compute that a timeline shows


@dataclass
class Measured:
    numbers: dict[str, str] = field(default_factory=dict)   # placeholder -> its text
    figures: dict[str, bytes] = field(default_factory=dict)  # figure name -> PNG
    sources: dict[str, str] = field(default_factory=dict)    # figure name -> where it came from
    texts: dict[str, list[dict]] = field(default_factory=dict)  # figure name -> its texts
    report: dict = field(default_factory=dict)               # the main job's report behind them
    runs: object = None                                      # the telemetry run (plots.Runs)
    layouts: dict[str, FlatLayout] = field(default_factory=dict)  # the flat buffers drawn
    ring: dict = field(default_factory=dict)                 # the ring all-reduce, recorded
    overlap: dict[str, dict] = field(default_factory=dict)   # ddp/fsdp: compute vs comm


def measure(size: str = "laptop", compare_json: str | None = None,
            report: dict | None = None) -> Measured:
    """Run (or read) everything the decks show; see the module docstring. ``report``: the
    report of ``compare_json`` already read (and checked) by :func:`read_report`."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    if report is None:
        report = read_report(compare_json) if compare_json is not None \
            else run_compare(SIZES[size])
    out = Measured(report=report)
    where = describe(report, compare_json)
    out.numbers.update(report_numbers(report))
    out.numbers["main_job.source"] = where
    add_figure(out, "memory_by_strategy", diagrams.peak_memory(report), where)
    add_figure(out, "zero_partition", diagrams.zero_partition(report), where)
    add_figure(out, "traffic_by_strategy", plots.report_traffic(report), where, (10.8, 3.6),
               headroom=1.15)
    events = run_telemetry(SIZES[size])
    out.runs = runs = plots.as_runs(events)
    fsdp, ddp = runs.runs["fsdp"], runs.runs["ddp"]
    telemetry_where = f"measured at build time: {fsdp.world_size} ranks, {fsdp.device}/{fsdp.backend}"
    add_figure(out, "fsdp_memory_timeline", plots.memory_timeline(fsdp), telemetry_where,
               (11.2, 4.1))
    add_figure(out, "fsdp_step_timeline", plots.step_timeline(fsdp), telemetry_where, (11.2, 3.9))
    add_figure(out, "ddp_step_timeline", plots.step_timeline(ddp), telemetry_where, (11.2, 3.9))
    out.numbers["telemetry.source"] = telemetry_where
    for name, run in (("ddp", ddp), ("fsdp", fsdp)):
        out.overlap[name] = overlap(run)
        out.numbers.update(overlap_numbers(name, out.overlap[name], fsdp.backend,
                                           fsdp.world_size))
    kit_diagrams(out, SIZES[size], fsdp.world_size)
    for key, kwargs in PLANS.items():
        planned = fsdp_mini.plan(**kwargs)
        out.numbers.update(plan_numbers(key, planned))
        add_figure(out, f"plan_{key}", plots.plan_bars(planned), "the planner's formulas",
                   (10.8, 3.5), headroom=1.1)
    return out


# -- the main job -------------------------------------------------------------------------------

def compare_with_breakdown(rank: int, world_size: int, config: CompareConfig) -> dict:
    """``fsdp-mini compare``'s own rank function, and for each strategy this rank ran, what its
    memory tracker held *at* the peak (``at_peak``) and after the step, by category (the state
    kept: ``state_by_category``): the report's ``peak_by_category`` is each category's own
    peak, which never happen at the same moment."""
    from fsdp_mini.jobs import compare as job
    seen, original = [], job.train

    def train(*args, **kwargs):
        run = original(*args, **kwargs)
        mem = run.memory
        seen.append({"at_peak": dict(mem.at_peak),
                     "state_by_category": {c: mem.snapshots[-1].by_category[c]
                                           for c in PERSISTENT}})
        return run
    job.train = train
    try:
        out = job.compare_on_rank(rank, world_size, config)
    finally:
        job.train = original
    # Note: a rank trains the strategies in the config's order (single on rank 0 only), so
    # the trackers seen and the strategies it returns pair up one by one.
    return {"results": out, "extra": dict(zip(out, seen))}


def run_compare(size: dict) -> dict:
    """``fsdp-mini compare`` at ``size``, as its JSON report, each rank with its breakdown at
    the peak and its state by category."""
    config = CompareConfig(strategies=STRATEGIES, steps=size["steps"],
                           global_batch=size["global_batch"], model=size["model"])
    backend = pick_backend(None, size["world_size"])
    per_rank = fsdp_mini.launch(compare_with_breakdown, size["world_size"], config,
                                backend=backend, timeout=300)
    params = make_model(config.gpt()).num_params()
    report = gather_report([p["results"] for p in per_rank], size["world_size"], params, None,
                           run_info(config, backend))
    for rank, p in enumerate(per_rank):
        for name, extra in p["extra"].items():
            entry = next(r for r in report["strategies"][name]["ranks"]
                         if r["rank"] == (0 if name == "single" else rank))
            entry.update(extra)
            if sum(extra["at_peak"].values()) != entry["peak_bytes"]:
                raise RuntimeError(f"{name} rank {rank}: the breakdown at the peak adds up to "
                                   f"{sum(extra['at_peak'].values())} B, its peak is "
                                   f"{entry['peak_bytes']} B: the memory tracker is wrong")
    return report


def describe(report: dict, path: str | None) -> str:
    """Where the main job's numbers come from, in words: never a path of this machine (it would
    show on every slide that cites it)."""
    run = report.get("run") or {}
    what = (f"{report['world_size']} ranks, {run.get('device', '?')}/{run.get('backend', '?')}, "
            f"torch {run.get('torch', '?')}")
    return (f"recorded with fsdp-mini compare --json: {what}" if path is not None
            else f"measured at build time: {what}")


def report_numbers(report: dict) -> dict[str, str]:
    """``ddp.state``, ``fsdp.sent``, ``ratio.sent_fsdp_ddp``…: rank 0's figures, formatted."""
    s, n = report["strategies"], {}
    n["params"] = f"{report['params'] / 1e6:.2f} M"
    n["world_size"] = str(report["world_size"])
    for name, entry in s.items():
        r = entry["ranks"][0]
        n[f"{name}.state"] = fmt_bytes(r["persistent_bytes"])
        n[f"{name}.state_formula"] = fmt_bytes(entry["theory"]["persistent_bytes"])
        n[f"{name}.peak"] = fmt_bytes(r["peak_bytes"])
        n[f"{name}.activations"] = fmt_bytes(r["peak_by_category"].get("activations", 0))
        n[f"{name}.gathered"] = fmt_bytes(r["peak_by_category"].get("gathered_params", 0))
        n[f"{name}.sent"] = fmt_bytes(r["sent_bytes_per_step"])
        n[f"{name}.step"] = f"{r['step_seconds'] * 1e3:.0f} ms"
    state = {k: s[k]["ranks"][0]["persistent_bytes"] for k in s}
    sent = {k: s[k]["ranks"][0]["sent_bytes_per_step"] for k in s}
    n["ratio.state_ddp_fsdp"] = f"{state['ddp'] / state['fsdp']:.2f}×"
    n["ratio.sent_fsdp_ddp"] = f"{sent['fsdp'] / sent['ddp']:.2f}×"
    n["ratio.sent_zero2_ddp"] = f"{sent['zero2'] / sent['ddp']:.2f}×"
    n["ratio.activations_fsdp_ddp"] = (
        f"{s['fsdp']['ranks'][0]['peak_by_category'].get('activations', 0) / max(1, s['ddp']['ranks'][0]['peak_by_category'].get('activations', 0)):.2f}×")
    losses = {k: sum(r["final_loss"] for r in s[k]["ranks"]) / len(s[k]["ranks"]) for k in s}
    n["loss.single"] = f"{losses['single']:.4f}"
    n["loss.fsdp"] = f"{losses['fsdp']:.4f}"
    return n


# -- a run with telemetry, for the timelines ---------------------------------------------------

BUCKET_MB = 2.0  # DDP's buckets on the timeline: the main job's size (CompareConfig), several


def train_for_timelines(rank: int, world_size: int, strategies, steps: int, model: str,
                        global_batch: int) -> None:
    """``fsdp_mini.jobs.train_gpt`` for each strategy, with a Recorder, but DDP in buckets of
    ``BUCKET_MB`` (the main job's; train_gpt keeps DDP's default of one big bucket, which
    would leave the timeline nothing to overlap)."""
    from fsdp_mini.jobs.gpt import train_gpt
    from fsdp_mini.registry import get_strategy
    from fsdp_mini.telemetry import Recorder
    from fsdp_mini.training import train
    from fsdp_mini.models import SyntheticText
    from fsdp_mini.launcher import rank_device
    from functools import partial
    for name in strategies:
        if "bucket_mb" not in get_strategy(name).options():
            train_gpt(rank, world_size, name, steps, model, global_batch)
            continue
        device, cfg = rank_device(), GPTConfig.sized(model)
        data = SyntheticText(cfg.vocab_size, cfg.block_size)
        recorder = Recorder.from_env(run=name)
        net = make_model(cfg).to(device)
        net, optimizer = fsdp_mini.parallelize(
            net, name, units=list(net.blocks), recorder=recorder, bucket_mb=BUCKET_MB,
            optimizer=partial(torch.optim.AdamW, lr=1e-3))
        train(net, optimizer, lambda step: tuple(
            t.to(device) for t in data.local_batch(step, global_batch, rank, world_size)),
            steps, recorder=recorder)
        recorder.close()


def run_telemetry(size: dict) -> list[dict]:
    """ddp then fsdp, 3 steps each, with a Recorder on every rank: their events."""
    with tempfile.TemporaryDirectory(prefix="fsdp_mini_slides_") as folder:
        fsdp_mini.launch(train_for_timelines, size["world_size"], ("ddp", "fsdp"), 3,
                         size["model"], size["global_batch"],
                         env={"FSDP_MINI_EVENTS_DIR": folder},
                         backend=pick_backend(None, size["world_size"]), timeout=300)
        return load_events(folder)


def _intersection(a: list, b: list) -> float:
    """Seconds two sorted lists of disjoint (start, end) intervals share."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(run) -> dict:
    """Per rank, in the step the timeline draws (the last one): its communication (the union of
    its collectives, issue to done), and how much of it ran while the rank computed (the lanes
    of ``plots.step_timeline`` overlapping). ``shows``: every rank had at least
    ``SHOWS_OVERLAP`` of its communication under compute."""
    step, ranks = run.last_step(), {}
    for r in run.rank_ids():
        found = plots.compute_and_comm(run, r, step)
        if not found:
            continue
        start, end, compute, comm = found
        busy = plots._union([(s, e) for s, e, _op, _label in comm])
        ranks[r] = {"step": end - start, "comm": sum(e - s for s, e in busy),
                    "hidden": _intersection(busy, compute)}
    shows = bool(ranks) and all(v["comm"] > 0 and v["hidden"] >= SHOWS_OVERLAP * v["comm"]
                                for v in ranks.values())
    return {"step": step, "ranks": ranks, "shows": shows}


OVERLAP_WORDS = {
    "ddp": ("the all-reduces", "backward", "each bucket's all-reduce", "backward computed"),
    "fsdp": ("the collectives", "the units' compute", "the next unit's all-gather",
             "the units computed"),
}


def overlap_numbers(name: str, found: dict, backend: str, world_size: int) -> dict[str, str]:
    """``ddp.overlap_title``, ``ddp.overlap`` (a sentence for the slide), ``ddp.overlap_note``:
    an overlap claimed only where the timeline shows it; otherwise what these ranks cannot
    show and what a GPU box's would."""
    what, under, gpu, during = OVERLAP_WORDS[name]
    r0 = found["ranks"].get(0, {"comm": 0.0, "hidden": 0.0, "step": 0.0})
    comm, hidden = fmt_seconds(r0["comm"]), fmt_seconds(r0["hidden"])
    share = f"{100 * r0['hidden'] / r0['comm']:.0f} %" if r0["comm"] else "0 %"
    n = {f"{name}.comm": comm, f"{name}.hidden": hidden, f"{name}.hidden_share": share,
         f"{name}.step_time": fmt_seconds(r0["step"])}
    if found["shows"]:
        n[f"{name}.overlap_title"] = f"{what} under {under}"
        n[f"{name}.overlap"] = (f"On rank 0, {hidden} of {what}' {comm} ran while {during} "
                                f"({share}): the coloured bars under the grey ones.")
        n[f"{name}.overlap_note"] = (f"The timeline shows the overlap: on rank 0 {hidden} of "
                                     f"{comm} of communication ran under compute.")
    else:
        n[f"{name}.overlap_title"] = "what CPU ranks cannot show"
        n[f"{name}.overlap"] = (
            f"On these ranks ({backend}) {what} took {comm} of rank 0's step, only {hidden} of "
            f"it while {during} ({share}): CPU ranks share their cores between the two. On "
            f"GPUs, NCCL runs {gpu} on its own stream, beside {under}: a deck built on a box of "
            f"{world_size} GPUs or more draws this timeline from its NCCL ranks "
            f"(`--compare-json` brings only a GPU box's memory and bytes).")
        n[f"{name}.overlap_note"] = (
            f"Do not claim an overlap here: the timeline does not show one ({hidden} of {comm} "
            f"under compute on rank 0). Explain what a GPU's separate communication stream "
            f"changes, and show lab 03's or lab 06's timeline on a GPU box if one is at hand.")
    return n


# -- diagrams of the kit's own data structures --------------------------------------------------

def example_layout() -> FlatLayout:
    """``fsdp_mini/buffers/flat.py``'s docstring example: w (2x3) and b (3) on N = 4 ranks."""
    slots = [ParamSlot(torch.nn.Parameter(torch.zeros(shape)), [name], [])
             for name, shape in (("w", (2, 3)), ("b", (3,)))]
    return FlatLayout(slots, 4)


def unit_layout(model: str, world_size: int, unit: str = "root") -> FlatLayout:
    """The flat buffer FSDP builds for ``unit`` of the run's GPT on ``world_size`` ranks: the
    kit's wrapping policy (``check_units``, ``assign_slots``), then ``FlatLayout``, as
    ``fsdp_mini/fsdp/algorithm.py`` does for each unit."""
    net = make_model(GPTConfig.sized(model))
    names = check_units(net, list(net.blocks))
    names[id(net)] = "root"
    slots = {names[uid]: s for uid, s in assign_slots(net, names).items()}[unit]
    return FlatLayout([s for s in slots if s.requires_grad], world_size)


SOLUTIONS = Path(__file__).resolve().parent.parent / "labs" / "solutions"


def reference_solution(name: str, attribute: str):
    """``attribute`` of the lab's reference solution ``labs/solutions/<name>.py``, loaded as
    ``labs.show_solution`` shows it (without importing the lab kit)."""
    path = SOLUTIONS / f"{name}.py"
    namespace = {"__name__": f"solution_{name}"}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    return namespace[attribute]


class _Sent:
    def wait(self):
        return None


def ring_record(world_size: int) -> dict:
    """Lab 02's reference ring all-reduce, run on ``world_size`` threads with in-memory sends:
    what every rank holds after each step. Rank r starts with ``2**r`` in every chunk (one
    element each), so a chunk's value says exactly which ranks' values it has summed."""
    ring, n = reference_solution("02_ring_all_reduce", "ring_all_reduce"), world_size
    boxes = {(a, b): queue.Queue() for a in range(n) for b in range(n)}
    tensors = [torch.full((n,), float(2 ** r)) for r in range(n)]
    states, sent, errors = {r: [] for r in range(n)}, [0] * n, []

    def held(t):
        return [frozenset(b for b in range(n) if int(v) >> b & 1) for v in t.tolist()]

    def rank(r):
        def send(t, to):
            states[r].append(held(tensors[r]))  # Note: before step k's send: k steps done
            sent[r] += t.numel() * t.element_size()
            boxes[(r, to)].put(t.clone())
            return _Sent()

        def recv(t, frm):
            t.copy_(boxes[(frm, r)].get(timeout=30))
        try:
            ring(tensors[r], r, n, send, recv)
            states[r].append(held(tensors[r]))
        except Exception as err:  # noqa: BLE001 (named below)
            errors.append(f"rank {r}: {type(err).__name__}: {err}")
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors or any(len(s) != 2 * (n - 1) + 1 for s in states.values()):
        raise RuntimeError(f"lab 02's reference ring did not run on {n} threads: {errors}")
    steps = [[states[r][k] for r in range(n)] for k in range(2 * (n - 1) + 1)]
    received = []
    for k in range(1, len(steps)):
        got = []
        for r in range(n):
            changed = [c for c in range(n) if steps[k][r][c] != steps[k - 1][r][c]]
            got.append(changed[0] if len(changed) == 1 else None)
        received.append(got)
    payload = n * tensors[0].element_size()
    return {"world_size": n, "states": steps, "received": received, "sent": sent[0],
            "sent_by_rank": sent, "payload": payload,
            "ring_bytes": ring_bytes("all_reduce", payload, n),
            "final": [[sorted(c) for c in steps[-1][r]] for r in range(n)]}


def kit_diagrams(out: Measured, size: dict, world_size: int) -> None:
    example, unit = example_layout(), unit_layout(size["model"], world_size)
    out.layouts = {"example": example, "root": unit}
    add_figure(out, "flat_layout", diagrams.flat_layout([
        (diagrams.layout_title("flat.py's example, w (2×3) and b (3)", example), example, True),
        (diagrams.layout_title(f"this run's root unit on {world_size} ranks", unit), unit,
         False)]), "the kit's FlatLayout and ShardPieces")
    n = out.numbers
    n["layout.ranks"] = str(world_size)
    n["layout.numel"] = f"{unit.numel:,}"
    n["layout.padded"] = f"{unit.padded_numel:,}"
    n["layout.shard"] = f"{unit.shard_numel:,}"
    n["layout.padding"] = f"{diagrams.padding_of(unit):,}"
    n["layout.params"] = str(len(unit.slots))
    n["layout.example_padding"] = str(diagrams.padding_of(example))
    n["layout.example_ranks"] = str(example.world_size)
    out.ring = ring = ring_record(world_size)
    add_figure(out, "ring_steps", diagrams.ring_steps(ring), "lab 02's reference ring, run here")
    n["ring.ranks"] = str(ring["world_size"])
    n["ring.steps"] = str(ring["world_size"] - 1)
    n["ring.messages"] = str(2 * (ring["world_size"] - 1))
    n["ring.factor"] = f"{ring['sent'] / ring['payload']:.2f}×"


# -- the planner ---------------------------------------------------------------------------------

PLANS = {"7b": {"model": "7b", "gpus": 8, "gpu_mem_gb": 80},
         "70b": {"model": "70b", "gpus": 64, "gpu_mem_gb": 80, "checkpointing": True}}


def plan_numbers(key: str, planned) -> dict[str, str]:
    n = {f"plan{key}.params": f"{planned.params / 1e9:.1f}B", f"plan{key}.gpus": str(planned.gpus),
         f"plan{key}.gpu_mem": f"{planned.gpu_mem_bytes / 1e9:g} GB"}
    for name, strategy in planned.strategies.items():
        n[f"plan{key}.{name}.state"] = f"{strategy.persistent_bytes / 1e9:.1f} GB"
        n[f"plan{key}.{name}.peak"] = f"{strategy.peak_bytes / 1e9:.1f} GB"
        n[f"plan{key}.{name}.fits"] = "fits" if strategy.fits else "does not fit"
    return n


# -- figures -------------------------------------------------------------------------------------

def for_slide(figure, size: tuple[float, float] | None = None, headroom: float = 1.0):
    """A figure of ``fsdp_mini.plots`` made to read on a slide: ``size`` inches (x 100 dpi =
    the pixels it is shown at), no text under ``diagrams.SLIDE_PT``, and ``headroom`` times its
    y range (for the labels on top of its bars, once they are bigger)."""
    if size is not None:
        figure.set_size_inches(*size)
    if headroom != 1.0:
        for ax in figure.axes:
            low, high = ax.get_ylim()
            ax.set_ylim(low, low + (high - low) * headroom)
    for text in figure.findobj(Text):
        if text.get_text() and text.get_fontsize() < diagrams.SLIDE_PT:
            text.set_fontsize(diagrams.SLIDE_PT)
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_tick_params(labelsize=max(diagrams.SLIDE_PT,
                                               axis.get_ticklabels()[0].get_fontsize()
                                               if axis.get_ticklabels() else 0))
        legend = ax.get_legend()
        if legend is not None and len(legend.get_texts()) > 6:
            legend.set_ncols(4)
    _texts_inside_their_axes(figure)
    return figure


CLEARANCE_PX = 4  # between a label drawn in a plot and the plot's frame


def _data_texts(ax) -> list:
    """The labels an axes places at data coordinates (those at the frame's own coordinates,
    such as a timeline's "step 2" under its top edge, are placed against the frame on purpose)."""
    return [t for t in ax.texts if t.get_transform() == ax.transData]


def _texts_inside_their_axes(figure, rounds: int = 3) -> None:
    """Widen an axes' x (right) and y (top) limits until the labels drawn in it (a timeline's
    "12 ms, comm 3 ms", a bar's value) lie inside its frame, ``CLEARANCE_PX`` from it."""
    canvas = FigureCanvasAgg(figure)
    for _ in range(rounds):
        canvas.draw()
        renderer, moved = canvas.get_renderer(), False
        for ax in figure.axes:
            box = ax.get_window_extent(renderer)
            room = box.x1 - CLEARANCE_PX, box.y1 - CLEARANCE_PX
            placed = _data_texts(ax)
            over_x = max([t.get_window_extent(renderer).x1 - room[0] for t in placed] + [0])
            over_y = max([t.get_window_extent(renderer).y1 - room[1] for t in placed] + [0])
            if over_x > 0 and not ax.xaxis_inverted():
                lo, hi = ax.get_xlim()
                ax.set_xlim(lo, hi + (hi - lo) * (over_x + 4) / box.width)
                moved = True
            if over_y > 0 and not ax.yaxis_inverted():
                lo, hi = ax.get_ylim()
                ax.set_ylim(lo, hi + (hi - lo) * (over_y + 4) / box.height)
                moved = True
        if not moved:
            return


def figure_texts(figure, dpi: int) -> list[dict]:
    """Every text the saved figure shows: its words, its size in pixels, its kind (tick, legend,
    title, text) and whether it lies inside the picture (a label cut by the frame does not)."""
    renderer = figure.canvas.get_renderer()
    width, height = figure.bbox.width, figure.bbox.height
    ticks, drawn, legends, titles = set(), set(), set(), set()
    in_axes = {id(t): ax.get_window_extent(renderer) for ax in figure.axes
               for t in _data_texts(ax)}
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for which, locs in ((axis.get_major_ticks, axis.get_majorticklocs()),
                                (axis.get_minor_ticks, axis.get_minorticklocs())):
                for tick, loc in zip(which(len(locs)), locs):
                    ticks.update((id(tick.label1), id(tick.label2)))
                    # Note: a locator gives ticks past the view too; matplotlib draws only these
                    if ax.axison and lo - 1e-9 * abs(hi - lo) <= loc <= hi + 1e-9 * abs(hi - lo):
                        drawn.update(id(t) for t in (tick.label1, tick.label2)
                                     if t.get_visible())
        if ax.get_legend() is not None:
            legends.update(id(t) for t in ax.get_legend().get_texts())
        titles.update(id(t) for t in (ax.title, ax._left_title, ax._right_title))
    if figure._suptitle is not None:
        titles.add(id(figure._suptitle))
    out = []
    for text in figure.findobj(Text):
        words = text.get_text()
        if not words.strip() or not text.get_visible() or (id(text) in ticks and
                                                           id(text) not in drawn):
            continue
        box = text.get_window_extent(renderer)
        kind = ("tick" if id(text) in ticks else "legend" if id(text) in legends
                else "title" if id(text) in titles else "text")
        frame = in_axes.get(id(text))
        out.append({"text": words, "kind": kind, "px": text.get_fontsize() * dpi / 72,
                    "inside": box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1
                    and box.y1 <= height + 1,
                    "in_frame": frame is None or (box.x1 <= frame.x1 - CLEARANCE_PX + 1 and
                                                  box.y1 <= frame.y1 - CLEARANCE_PX + 1)})
    return out


def add_figure(out: Measured, name: str, figure, source: str,
               size: tuple[float, float] | None = None, headroom: float = 1.0) -> None:
    for_slide(figure, size, headroom)
    FigureCanvasAgg(figure)  # Note: the canvas whose renderer measures the texts below
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=diagrams.SLIDE_DPI)
    out.figures[name], out.sources[name] = buffer.getvalue(), source
    out.texts[name] = figure_texts(figure, diagrams.SLIDE_DPI)
