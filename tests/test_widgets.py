"""The live dashboard and its static figures, fed with synthetic telemetry (no kernel, no ranks).

``synthetic_run`` writes the events a recorder would write for a small FSDP (or DDP / ZeRO) job:
units gathered and freed, one collective per unit and phase, memory at every phase boundary.
"""

from __future__ import annotations

import json
import os
import random

import pytest

matplotlib = pytest.importorskip("matplotlib")
pytest.importorskip("ipywidgets")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from fsdp_mini import plots, widgets  # noqa: E402
from fsdp_mini.memory import CATEGORIES  # noqa: E402
from fsdp_mini.telemetry.runstate import Runs, RunState  # noqa: E402
from fsdp_mini.telemetry.units import busbw, busbw_factor, fmt_bytes, fmt_rate, fmt_seconds  # noqa: E402

RECORDED = os.path.join(os.path.dirname(__file__), "data", "events_fsdp_ws4.jsonl")
UNITS = [("root", 84_224)] + [(f"blocks.{i}", 787_456) for i in range(4)]  # parameters per unit
PSI = sum(p for _, p in UNITS)


# -- a synthetic job ----------------------------------------------------------------------------

class _Rank:
    """Writes one rank's events with a fake clock and fake memory counters."""

    def __init__(self, rank, n, run, t0):
        self.rank, self.n, self.run, self.t, self.step = rank, n, run, t0, 0
        self.mem = dict.fromkeys(CATEGORIES, 0)
        self.events = []

    def emit(self, kind, **fields):
        self.events.append({"type": kind, "rank": self.rank, "step": self.step, "run": self.run,
                            **fields})

    def mark(self, label):
        self.emit("memory", time=self.t, label=label, total_bytes=sum(self.mem.values()),
                  by_category=dict(self.mem))

    def coll(self, op, label, payload, seconds, overlap=0.0):
        """A collective of ``seconds``; the clock moves on by ``(1 - overlap) * seconds``."""
        factor = busbw_factor(op, self.n)
        self.emit("collective", op=op, label=label, payload_bytes=payload,
                  sent_bytes=factor * payload, start=self.t, end=self.t + seconds)
        self.t += (1 - overlap) * seconds

    def add(self, category, nbytes):
        self.mem[category] += nbytes


def _fsdp_step(rk, act=2_000_000):
    n = rk.n
    for name, p in UNITS:  # forward: gather, compute, free (the root stays gathered)
        rk.coll("all_gather", f"{name}/forward", 4 * p, 0.004)
        rk.add("gathered_params", 4 * p)
        rk.mark(f"{name}/gathered")
        rk.t += 0.015
        rk.add("activations", act)
        if name != "root":
            rk.add("gathered_params", -4 * p)
        rk.mark(f"{name}/forward_done")
    for name, p in reversed(UNITS):  # backward: gather again, compute, reduce-scatter, free
        if name != "root":
            rk.coll("all_gather", f"{name}/backward", 4 * p, 0.004, overlap=0.5)
            rk.add("gathered_params", 4 * p)
            rk.mark(f"{name}/gathered")
        rk.t += 0.025
        rk.add("activations", -act)
        rk.add("comm_buffers", 4 * p)
        rk.coll("reduce_scatter", f"{name}/grad", 4 * p, 0.005, overlap=0.8)
        rk.add("comm_buffers", -4 * p)
        rk.add("grads", 4 * p // n)
        rk.add("gathered_params", -4 * p)
        rk.mark(f"{name}/backward_done")
    rk.mark("backward_end")


def _bucketed_step(rk, strategy, buckets=4):
    rk.t += 0.08
    rk.add("activations", 8_000_000)
    rk.mark("forward")
    for b in range(buckets):
        rk.t += 0.02
        op = "all_reduce" if strategy == "ddp" else "reduce_scatter"
        rk.coll(op, f"bucket{b}", 4 * PSI // buckets, 0.01, overlap=0.7)
    rk.add("activations", -8_000_000)
    rk.add("grads", 4 * PSI if strategy in ("ddp", "zero1") else 4 * PSI // rk.n)
    rk.mark(f"{strategy}/backward_end")
    if strategy != "ddp":
        rk.t += 0.01
        for b in range(buckets):
            rk.coll("all_gather", f"params{b}", 4 * PSI // buckets, 0.006)


THEORY = {  # persistent bytes, bytes sent per step (ring model, fp32 Adam)
    "ddp": lambda n: (16 * PSI, 2 * (n - 1) / n * 4 * PSI),
    "zero1": lambda n: (8 * PSI + 8 * PSI / n, 2 * (n - 1) / n * 4 * PSI),
    "zero2": lambda n: (4 * PSI + 12 * PSI / n, 2 * (n - 1) / n * 4 * PSI),
    "fsdp": lambda n: (16 * PSI / n, (n - 1) / n * 4 * (3 * PSI - UNITS[0][1])),
}


def synthetic_run(strategy="fsdp", world_size=4, steps=3, run=None, t0=1.7e9):
    """Every event of a small job on ``world_size`` ranks, rank after rank."""
    n, events = world_size, []
    persistent, sent = THEORY[strategy](n)
    for r in range(n):
        rk = _Rank(r, n, run or strategy, t0 + 0.0003 * r)
        rk.emit("meta", time=rk.t, world_size=n, strategy=strategy, params=PSI,
                theory={"sent_bytes_per_step": sent, "persistent_bytes": persistent},
                units=[{"name": u, "bytes": 4 * p} for u, p in UNITS] if strategy == "fsdp"
                else [], device="cpu", backend="gloo")
        shard = 4 * PSI // n if strategy == "fsdp" else 4 * PSI
        rk.add("params", shard)
        for u, p in UNITS:
            rk.coll("broadcast", f"sync/{u}.weight", 4 * p, 0.002)
        for step in range(1, steps + 1):
            rk.step = step
            start = rk.t
            rk.mark("step_start")
            (_fsdp_step(rk) if strategy == "fsdp" else _bucketed_step(rk, strategy))
            rk.t += 0.01
            opt = 8 * PSI // n if strategy != "ddp" else 8 * PSI
            rk.mem["optimizer_state"] = opt
            rk.mark("step_end")
            rk.emit("step", loss=5.6 - 0.2 * step + 0.01 * r, start=start, end=rk.t)
            rk.mem["grads"] = 0  # zero_grad
        rk.step += 1
        rk.emit("end", time=rk.t)
        events += rk.events
    return events


def interleave(events, seed=0):
    """The same events in a random order across ranks, each rank's own order kept."""
    by_rank = {}
    for ev in events:
        by_rank.setdefault(ev["rank"], []).append(ev)
    rng, out = random.Random(seed), []
    while by_rank:
        r = rng.choice(sorted(by_rank))
        out.append(by_rank[r].pop(0))
        if not by_rank[r]:
            del by_rank[r]
    return out


def _sum(events, **match):
    return sum(ev["sent_bytes"] for ev in events if ev["type"] == "collective"
               and all(ev.get(k) == v for k, v in match.items()))


class Shown(list):
    """What the widgets passed to IPython's display(), updates of a display_id included."""

    def __call__(self, obj, display_id=None):
        self.append(obj)
        return self if display_id else None

    def update(self, obj, raw=False):
        self.updates.append(obj)
        self[-1] = _Bundle(obj) if raw else obj


class _Bundle(dict):
    """A raw mime bundle passed to a display update; ``.data`` is its PNG, decoded."""

    @property
    def data(self) -> bytes:
        import base64
        return base64.b64decode(self["image/png"])


@pytest.fixture
def shown(monkeypatch):
    seen = Shown()
    seen.updates = []
    monkeypatch.setattr(widgets.live, "display", seen)  # where the widgets show themselves
    return seen


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


# -- readable numbers and the bandwidth formulas -------------------------------------------------

@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"),
                                     (12_953_600, "12.4 MiB"), (250 * 2**20, "250 MiB"),
                                     (1.5 * 2**30, "1.50 GiB"), (-3 * 2**20, "-3.00 MiB"),
                                     (None, "–"), (float("nan"), "–")])
def test_fmt_bytes(n, text):
    assert fmt_bytes(n) == text


def test_fmt_rate_and_seconds():
    assert fmt_rate(2.5e9) == "2.50 GB/s"
    assert fmt_rate(532e6) == "532 MB/s"
    assert fmt_rate(12_345) == "12.3 kB/s"
    assert fmt_rate(float("nan")) == "–"
    assert fmt_seconds(0.2448) == "245 ms"
    assert fmt_seconds(2.5) == "2.50 s"
    assert fmt_seconds(5e-5) == "50 µs"
    assert fmt_seconds(125) == "2 min 5 s"


def test_busbw_and_algbw_follow_nccl_tests():
    assert busbw("all_reduce", 1e9, 0.5, 4) == pytest.approx(2e9 * 2 * 3 / 4)
    assert busbw("all_gather", 1e9, 0.5, 4) == pytest.approx(2e9 * 3 / 4)
    assert busbw("reduce_scatter", 1e9, 0.5, 8) == pytest.approx(2e9 * 7 / 8)
    run = RunState("x", world_size=4)
    for start in (0.0, 1.0):  # two all-reduces of 1 GB, 0.25 s each
        run.add({"type": "collective", "rank": 0, "step": 1, "op": "all_reduce", "label": "b0",
                 "payload_bytes": 10**9, "sent_bytes": 1.5e9, "start": start, "end": start + 0.25})
    (row,) = run.bandwidth()
    assert row["calls"] == 2 and row["seconds"] == pytest.approx(0.5)
    assert row["algbw"] == pytest.approx(4e9) and row["busbw"] == pytest.approx(6e9)


# -- the aggregator ------------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_totals_equal_the_sum_of_the_events(world_size):
    events = synthetic_run("fsdp", world_size, steps=3)
    runs = Runs()
    for i in range(0, len(events), 7):  # small batches, ranks interleaved
        runs.add(interleave(events)[i:i + 7])
    run = runs.latest
    assert run.rank_ids() == list(range(world_size)) and run.last_step() == 3
    for r in range(world_size):
        for op in ("all_gather", "reduce_scatter", "broadcast"):
            assert run.sent(r)[op] == pytest.approx(_sum(events, rank=r, op=op))
        assert run.sent_total(r) == pytest.approx(_sum(events, rank=r))
        for step in (0, 1, 2, 3):
            assert run.sent_total(r, step) == pytest.approx(_sum(events, rank=r, step=step))
        peak = max(ev["total_bytes"] for ev in events if ev["type"] == "memory" and ev["rank"] == r)
        assert run.peak(r) == peak
    assert run.sent_per_step() == pytest.approx(run.theory_sent_per_step())
    assert run.persistent(0) == pytest.approx(run.theory_persistent(), rel=1e-3)
    assert run.loss() == pytest.approx(sum(5.0 + 0.01 * r for r in range(world_size)) / world_size)


def test_units_and_phases_of_the_last_step():
    run = plots.as_run(synthetic_run("fsdp", 4))
    by_unit = run.sent_by_unit(0, 3)
    assert set(by_unit) == {u for u, _ in UNITS}
    assert set(by_unit["blocks.1"]) == {"forward", "backward", "grad"}
    assert set(by_unit["root"]) == {"forward", "grad"}  # the root stays gathered for backward
    assert sum(sum(p.values()) for p in by_unit.values()) == pytest.approx(run.sent_total(0, 3))


def test_compute_and_comm_cover_the_step():
    run = plots.as_run(synthetic_run("fsdp", 2))
    start, end, compute, comm = plots.compute_and_comm(run, 0, 3)
    busy = sum(e - s for s, e in plots._union([(s, e) for s, e, _o, _l in comm]))
    assert sum(e - s for s, e in compute) + busy == pytest.approx(end - start)
    assert len(comm) == 2 * len(UNITS) - 1 + len(UNITS)  # gathers (root once more) + scatters


def test_a_long_run_keeps_details_of_recent_steps_only_and_exact_totals():
    events = synthetic_run("fsdp", 2, steps=20)
    run = plots.as_run(events)
    assert sorted(run.rank(0).collectives) == list(range(13, 21))
    assert sorted(run.rank(1).points) == list(range(13, 21))
    assert run.sent_total(1) == pytest.approx(_sum(events, rank=1))
    assert run.recent_memory_steps() == [19, 20] and run.last_step() == 20


def test_a_second_run_with_the_same_name_replaces_the_first():
    events = synthetic_run("fsdp", 2)
    runs = Runs()
    runs.add(events)
    runs.add(events)
    assert len(runs) == 1 and runs.latest.sent_total(0) == pytest.approx(_sum(events, rank=0))


# -- the dashboard -------------------------------------------------------------------------------

def test_dashboard_shows_one_bar_per_rank_with_readable_sizes():
    events = synthetic_run("fsdp", 4)
    dash = widgets.Dashboard.from_events(interleave(events))
    run = dash.run
    assert len(dash.bars.children) == 4
    for r, bar in enumerate(dash.bars.children):
        assert f"rank {r}" in bar.value and f"peak {fmt_bytes(run.peak(r))}" in bar.value
    assert "MiB" in fmt_bytes(run.peak(0))
    assert fmt_bytes(run.theory_persistent()) in dash.memory_legend.value
    assert fmt_bytes(run.theory_with_unit()) in dash.memory_legend.value
    assert fmt_bytes(run.theory_sent_per_step()) in dash.traffic.value
    assert fmt_bytes(run.sent_total(0, 3)) in dash.traffic.value
    assert "blocks.3" in dash.units_table.value and "busbw" in dash.bandwidth.value
    assert dash.steps.value.count("rank ") >= 4 and "step 3" in dash.header.value
    svg = dash.timeline.value  # the live timeline: inline SVG, one polygon per category
    assert svg.startswith("<svg") and svg.count("<polygon") == len(CATEGORIES)
    assert svg.count("<polyline") == 4 and "step 3" in svg  # one total line per rank


def test_update_is_throttled_and_finish_draws_and_shows_a_figure(shown):
    clock = FakeClock()
    dash = widgets.Dashboard(clock=clock)
    dash.start(4)
    assert shown == [dash]  # start() displays a dashboard nobody displayed yet
    base = dash.redraws
    events = interleave(synthetic_run("fsdp", 4))
    for i in range(50):  # 50 updates within 100 ms
        dash.update(events[i * 5:(i + 1) * 5])
        clock.t += 0.002
    assert dash.redraws - base <= 2
    clock.t += 0.2
    dash.tick()  # what launch_poll does: draws what came in, even if nothing new comes
    assert dash.redraws - base <= 3 and dash.run.last_step() is not None
    dash.tick()
    assert dash.redraws - base <= 3  # nothing new: no redraw
    rest = events[250:]
    base, chunk = dash.redraws, len(rest) // 20 + 1
    for i in range(20):  # 20 updates, 100 ms apart: at least 4 redraws a second
        dash.update(rest[i * chunk:(i + 1) * chunk])
        clock.t += 0.1
    assert dash.redraws - base >= 8
    assert dash.run.sent_total(2) == pytest.approx(_sum(events, rank=2))  # nothing dropped
    before = dash.redraws
    dash.finish(True)
    assert dash.redraws == before + 1 and "finished" in dash.header.value
    assert isinstance(dash.figure, Figure) and len(dash.figure.axes) >= 6
    assert shown[-1].data.startswith(b"\x89PNG")  # the static figure, for nbconvert and GitHub


def test_start_does_not_display_twice(shown):
    dash = widgets.Dashboard()
    dash._repr_mimebundle_()  # what display(dash) or a cell's last expression does
    dash.start(2)
    assert shown == []


def test_launch_protocol_reads_event_files(tmp_path, shown):
    pytest.importorskip("fsdp_mini.telemetry")
    dash = widgets.Dashboard()
    dash.launch_started(2, str(tmp_path))
    events = synthetic_run("fsdp", 2)
    for r in (0, 1):
        with open(tmp_path / f"events_rank{r}.jsonl", "w") as f:
            f.writelines(json.dumps(ev) + "\n" for ev in events if ev["rank"] == r)
    dash.launch_finished(True)
    assert dash.run.sent_total(1) == pytest.approx(_sum(events, rank=1))
    assert isinstance(dash.figure, Figure) and shown[-1].data.startswith(b"\x89PNG")


def test_from_events_reads_a_jsonl_file(tmp_path):
    events = synthetic_run("zero2", 2)
    path = tmp_path / "events_rank0.jsonl"
    path.write_text("".join(json.dumps(ev) + "\n" for ev in events))
    dash = widgets.Dashboard.from_events(str(path))
    assert dash.run.name == "zero2" and "recorded" in dash.header.value
    assert dash.run.sent_total(0) == pytest.approx(_sum(events, rank=0))


def test_static_figures_draw(tmp_path):
    events = synthetic_run("fsdp", 3)
    for draw in (plots.memory_bars, plots.memory_timeline, plots.traffic, plots.traffic_by_unit,
                 plots.step_timeline, plots.bandwidth):
        assert isinstance(draw(events), Figure)
    fig = plots.dashboard_figure(events)
    fig.savefig(tmp_path / "dash.png", dpi=40)
    assert (tmp_path / "dash.png").stat().st_size > 10_000


# -- several strategies ----------------------------------------------------------------------------

def test_comparison_shows_four_strategies(shown):
    cmp = widgets.Comparison()
    for i, strategy in enumerate(("ddp", "zero1", "zero2", "fsdp")):  # one launch each
        cmp.start(4)
        cmp.update(synthetic_run(strategy, 4, t0=1.7e9 + 10 * i))
        cmp.finish(True)
    assert len(shown) == 1 and shown.updates[0] is not cmp  # one output: the widget ...
    assert len(shown.updates) == 4               # ... given its figure after each launch
    assert shown[-1]["application/vnd.jupyter.widget-view+json"]["model_id"] == cmp.model_id
    runs = plots.ordered_runs(cmp.runs)
    assert [run.name for run in runs] == ["ddp", "zero1", "zero2", "fsdp"]
    for run in runs:
        assert f"<b>{run.name}</b>" in cmp.table.value
        assert fmt_bytes(run.theory_persistent()) in cmp.table.value
        assert run.sent_per_step() == pytest.approx(run.theory_sent_per_step())
    labels = [t.get_text() for t in cmp.figure.axes[0].get_xticklabels()]
    assert labels == [run.name for run in runs] and shown[-1].data.startswith(b"\x89PNG")


# -- a recorded job, when there is one -------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists(RECORDED), reason="no recorded events in tests/data")
def test_recorded_fsdp_job():
    with open(RECORDED) as f:
        events = [json.loads(line) for line in f if line.strip()]
    dash = widgets.Dashboard.from_events(events)
    run = dash.run
    for r in run.rank_ids():
        assert run.sent_total(r) == pytest.approx(_sum(events, rank=r, run=run.name))
    assert run.sent_per_step() == pytest.approx(run.theory_sent_per_step())
    assert isinstance(plots.dashboard_figure(run), Figure)


RECORDED_COMPARE = os.path.join(os.path.dirname(__file__), "data", "events_compare_ws2.jsonl")


@pytest.mark.skipif(not os.path.exists(RECORDED_COMPARE), reason="no recorded comparison")
def test_recorded_comparison(shown):
    with open(RECORDED_COMPARE) as f:
        events = [json.loads(line) for line in f if line.strip()]
    cmp = widgets.Comparison.from_events(events)
    runs = plots.ordered_runs(cmp.runs)
    assert [run.strategy for run in runs] == ["ddp", "zero1", "zero2", "fsdp"]
    for run in runs:
        assert run.sent_per_step() == pytest.approx(run.theory_sent_per_step())
        assert f"<b>{run.name}</b>" in cmp.table.value


# -- on a GPU: the allocator and the device beside the tensors ----------------------------------

def _stand_in_gpu(allocated=10 * 2**20, reserved=16 * 2**20, used=600 * 2**20):
    """What fsdp_mini.memory.cuda_figures returns on a CUDA rank (a stand-in for the CPU)."""
    return lambda: {"allocated_bytes": allocated, "peak_allocated_bytes": allocated,
                    "reserved_bytes": reserved, "device_used_bytes": used,
                    "device_total_bytes": 80 * 10**9, "device_source": "nvml"}


def test_a_recorder_on_a_gpu_writes_the_allocators_and_the_devices_figures():
    from helpers import record_one_tiny_step

    from fsdp_mini.telemetry import Recorder
    rec = Recorder(run="single", device_memory=_stand_in_gpu())
    record_one_tiny_step(rec)
    memory = [e for e in rec.events if e["type"] == "memory"]
    assert memory and all(e["cuda"] == _stand_in_gpu()() for e in memory)
    plain = Recorder(run="single")  # on the CPU: no such figures
    record_one_tiny_step(plain)
    assert not any("cuda" in e for e in plain.events)


def test_the_dashboard_on_a_gpu_shows_allocated_reserved_and_nvidia_smi_with_each_gap():
    events = synthetic_run("fsdp", 2)
    for ev in events:
        if ev["type"] == "memory":
            gpu = _stand_in_gpu(allocated=ev["total_bytes"] + 2**20)()
            ev["cuda"] = gpu
    dash = widgets.Dashboard.from_events(interleave(events))
    dash.render(final=True)
    for bar in dash.bars.children:
        assert "allocator" in bar.value and "16.0 MiB reserved" in bar.value
        assert "nvidia-smi 600 MiB used" in bar.value
    note = dash.device_memory.value
    assert "On the GPU" in note and note.count("<li>") == 3
    assert "(+1.00 MiB): live blocks the categories do not see" in note
    assert "the caching allocator keeps for reuse" in note and "empty_cache" in note
    assert "(+584 MiB): the CUDA context, NCCL's communication buffers" in note
    assert "via NVML" in note
    plain = widgets.Dashboard.from_events(interleave(synthetic_run("fsdp", 2)))
    assert plain.device_memory.value == ""  # CPU ranks: nothing to say
