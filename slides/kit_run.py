"""What the decks show, measured at build time: one run of the kit, or a report recorded elsewhere.

    measured = measure("laptop")                              # runs the kit now (about a minute)
    measured = measure("laptop", compare_json="gpu8.json")    # the main job's numbers from a GPU box

Three sources, each drawn by ``fsdp_mini.plots`` and each number formatted for the slides:

    the main job     fsdp-mini compare: memory by category, state, bytes per step, per strategy
                     (run now, or read from ``fsdp-mini compare --json`` files)
    a telemetry run  ddp and fsdp with a Recorder: the saw-tooth and the overlap on timelines
    the planner      fsdp_mini.plan for 7B on 8 GPUs and 70B on 64 GPUs (formulas, no ranks)

Every placeholder a deck uses (``{{ fsdp.state }}``) is a key of ``Measured.numbers``; a deck
asking for one that no run produced fails the build.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass, field

import fsdp_mini
from fsdp_mini import plots
from fsdp_mini.jobs.compare import CompareConfig, compare_on_rank, gather_report, run_info
from fsdp_mini.jobs.gpt import train_strategies
from fsdp_mini.launcher.inputs import pick_backend
from fsdp_mini.models import make_model
from fsdp_mini.telemetry import load_events
from fsdp_mini.telemetry.units import fmt_bytes

from compare_report import (STRATEGIES, RANK_FIELDS, ReportError, check_report,  # noqa: F401
                            read_report)

SIZES = {  # what "laptop" and "ci" run (the labs' sizes: 4 ranks of the default GPT, or tiny)
    "laptop": {"world_size": 4, "model": "default", "steps": 8, "global_batch": 8},
    "ci": {"world_size": 2, "model": "tiny", "steps": 4, "global_batch": 4},
}


@dataclass
class Measured:
    numbers: dict[str, str] = field(default_factory=dict)   # placeholder -> its text
    figures: dict[str, bytes] = field(default_factory=dict)  # figure name -> PNG
    sources: dict[str, str] = field(default_factory=dict)    # figure name -> where it came from
    report: dict = field(default_factory=dict)               # the main job's report behind them


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
    for name, draw in (("memory_by_strategy", plots.report_memory),
                       ("traffic_by_strategy", plots.report_traffic)):
        add_figure(out, name, draw(report), where)
    events = run_telemetry(SIZES[size])
    runs = plots.as_runs(events)
    fsdp, ddp = runs.runs["fsdp"], runs.runs["ddp"]
    telemetry_where = f"measured at build time: {fsdp.world_size} ranks, {fsdp.device}/{fsdp.backend}"
    add_figure(out, "fsdp_memory_timeline", plots.memory_timeline(fsdp), telemetry_where)
    add_figure(out, "fsdp_step_timeline", plots.step_timeline(fsdp), telemetry_where)
    add_figure(out, "ddp_step_timeline", plots.step_timeline(ddp), telemetry_where)
    out.numbers["telemetry.source"] = telemetry_where
    for key, kwargs in PLANS.items():
        planned = fsdp_mini.plan(**kwargs)
        out.numbers.update(plan_numbers(key, planned))
        add_figure(out, f"plan_{key}", plots.plan_bars(planned), "the planner's formulas")
    return out


# -- the main job -------------------------------------------------------------------------------

def run_compare(size: dict) -> dict:
    """``fsdp-mini compare`` at ``size``, as its JSON report."""
    config = CompareConfig(strategies=STRATEGIES, steps=size["steps"],
                           global_batch=size["global_batch"], model=size["model"])
    backend = pick_backend(None, size["world_size"])
    per_rank = fsdp_mini.launch(compare_on_rank, size["world_size"], config, backend=backend,
                                timeout=300)
    params = make_model(config.gpt()).num_params()
    return gather_report(per_rank, size["world_size"], params, None, run_info(config, backend))


def describe(report: dict, path: str | None) -> str:
    run = report.get("run") or {}
    what = (f"{report['world_size']} ranks, {run.get('device', '?')}/{run.get('backend', '?')}, "
            f"torch {run.get('torch', '?')}")
    return f"from {path}: {what}" if path is not None else f"measured at build time: {what}"


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

def run_telemetry(size: dict) -> list[dict]:
    """ddp then fsdp, 3 steps each, with a Recorder on every rank: their events."""
    with tempfile.TemporaryDirectory(prefix="fsdp_mini_slides_") as folder:
        fsdp_mini.launch(train_strategies, size["world_size"], ("ddp", "fsdp"), 3, size["model"],
                         size["global_batch"], env={"FSDP_MINI_EVENTS_DIR": folder},
                         backend=pick_backend(None, size["world_size"]), timeout=300)
        return load_events(folder)


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

def add_figure(out: Measured, name: str, figure, source: str) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    out.figures[name], out.sources[name] = buffer.getvalue(), source
