"""From telemetry events to the totals every dashboard panel shows.

:class:`RunState` is fed the events of one run (one strategy on N ranks). The live widgets
(:mod:`fsdp_mini.widgets`) and the static figures (:mod:`fsdp_mini.plots`) both read it, so a
number on screen and the same number in a saved figure always agree. :class:`Runs` keeps several
runs apart, for the comparison view.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..comm.ledger import OPS
from ..memory import PERSISTENT
from .units import PHASES, algbw, busbw_factor, unit_and_phase

# -- aggregation --------------------------------------------------------------------------------

@dataclass
class RankState:
    """Everything one rank has reported so far."""

    meta: dict | None = None
    memory: dict | None = None      # latest memory snapshot
    peak: dict | None = None        # snapshot with the highest total
    state: int = 0                  # highest params + grads + optimizer state seen
    points: dict = field(default_factory=dict)       # step -> memory events (recent steps only)
    collectives: dict = field(default_factory=dict)  # step -> collective events (recent steps only)
    sent_by_op: dict = field(default_factory=dict)   # op -> bytes sent, whole run
    sent_by_step: dict = field(default_factory=dict)  # step -> op -> bytes sent
    op_stats: dict = field(default_factory=dict)     # op -> [calls, payload, seconds, sim. seconds]
    steps: dict = field(default_factory=dict)        # step -> step event
    ended: bool = False

    def keep_recent(self, table: dict, step: int, keep: int) -> list:
        """The list of ``table`` for ``step``, forgetting steps older than the last ``keep``."""
        if step not in table:
            table[step] = []
            for old in [s for s in table if s <= step - keep]:
                del table[old]
        return table[step]


class RunState:
    """The totals of one run (one strategy on N ranks), fed one event at a time with :meth:`add`.

    Totals (bytes per op, per step, per rank) are exact sums of every event. Detailed lists
    (memory snapshots, collective intervals) are kept for the last ``keep_steps`` steps only, so
    a long run does not grow without bound.
    """

    def __init__(self, name: str, world_size: int | None = None, keep_steps: int = 8):
        self.name, self.world_size, self.keep_steps = name, world_size, keep_steps
        self.strategy, self.params, self.theory, self.units = name, None, {}, []
        self.formulas: dict[str, str] = {}
        self.device = self.backend = None
        self.link: dict | None = None  # {bandwidth_gbs, latency_us} of a simulated link
        self.ranks: dict[int, RankState] = {}
        self.events = 0

    def rank(self, r: int) -> RankState:
        return self.ranks.setdefault(int(r), RankState())

    def add(self, ev: dict) -> None:
        self.events += 1
        handler = getattr(self, "_on_" + str(ev.get("type")), None)
        if handler is not None:
            handler(ev, self.rank(ev.get("rank", 0)))

    def _on_meta(self, ev, rs):
        rs.meta = ev
        self.world_size = ev.get("world_size", self.world_size)
        self.strategy = ev.get("strategy", self.strategy)
        self.params, self.theory = ev.get("params"), ev.get("theory") or {}
        self.formulas = ev.get("formulas") or _formulas_of(self.strategy)
        self.units = ev.get("units") or []
        self.device, self.backend = ev.get("device"), ev.get("backend")
        self.link = ev.get("link")

    def _on_memory(self, ev, rs):
        rs.memory = ev
        if rs.peak is None or ev["total_bytes"] > rs.peak["total_bytes"]:
            rs.peak = ev
        rs.state = max(rs.state, sum(ev["by_category"].get(c, 0) for c in PERSISTENT))
        rs.keep_recent(rs.points, ev.get("step", 0), self.keep_steps).append(ev)

    def _on_collective(self, ev, rs):
        op, step, sent = ev["op"], ev.get("step", 0), float(ev.get("sent_bytes", 0.0))
        rs.sent_by_op[op] = rs.sent_by_op.get(op, 0.0) + sent
        per_step = rs.sent_by_step.setdefault(step, {})
        per_step[op] = per_step.get(op, 0.0) + sent
        stats = rs.op_stats.setdefault(op, [0, 0, 0.0, 0.0])
        stats[0] += 1
        stats[1] += ev.get("payload_bytes", 0)
        stats[2] += max(0.0, ev["end"] - ev["start"])
        stats[3] += max(0.0, ev["sim_end"] - ev["sim_start"]) if "sim_end" in ev else 0.0
        rs.keep_recent(rs.collectives, step, self.keep_steps).append(ev)

    def _on_step(self, ev, rs):
        rs.steps[ev["step"]] = ev

    def _on_end(self, ev, rs):
        rs.ended = True

    # -- questions the panels ask ----------------------------------------------------------------

    def rank_ids(self) -> list[int]:
        known = set(range(self.world_size or 0))
        return sorted(known | set(self.ranks))

    def last_step(self) -> int | None:
        """The last step every rank has completed (None before that)."""
        done = [max(self.rank(r).steps, default=None) for r in self.rank_ids()]
        return None if not done or None in done else min(done)

    def completed_steps(self) -> list[int]:
        per_rank = [set(self.rank(r).steps) for r in self.rank_ids()]
        return sorted(set.intersection(*per_rank)) if per_rank else []

    def sent(self, r: int, step: int | None = None) -> dict[str, float]:
        """Bytes rank ``r`` sent per op: in ``step``, or over the whole run."""
        rs = self.rank(r)
        return dict(rs.sent_by_op if step is None else rs.sent_by_step.get(step, {}))

    def sent_total(self, r: int, step: int | None = None) -> float:
        return sum(self.sent(r, step).values())

    def sent_per_step(self) -> float | None:
        """Median over completed steps of the most any rank sent in the step."""
        per_step = [max(self.sent_total(r, s) for r in self.rank_ids())
                    for s in self.completed_steps()]
        return statistics.median(per_step) if per_step else None

    def sent_by_unit(self, r: int, step: int) -> dict[str, dict[str, float]]:
        """unit -> phase -> bytes that rank ``r`` sent in ``step`` (a recent step); units in the
        order of the meta event, then the others (buckets, sync) by name."""
        found: dict[str, dict[str, float]] = {}
        for ev in self.rank(r).collectives.get(step, []):
            unit, phase = ((ev["unit"], ev["phase"]) if "unit" in ev  # events of older runs:
                           else unit_and_phase(ev.get("label", ev["op"]), ev["op"]))  # labels
            phases = found.setdefault(unit, {})
            phases[phase] = phases.get(phase, 0.0) + float(ev.get("sent_bytes", 0.0))
        known = [u["name"] for u in self.units if u["name"] in found]
        order = known + sorted(set(found) - set(known))
        return {u: dict(sorted(found[u].items(), key=lambda kv: phase_order(kv[0])))
                for u in order}

    def bandwidth(self) -> list[dict]:
        """Per op over all ranks and calls: calls, payload, busy seconds, algbw and busbw.

        With a simulated link, ``sim_seconds`` is the time on the link and algbw and busbw are
        computed from it (busbw is then the link's bandwidth, less the latency terms)."""
        rows = []
        for op in sorted({op for rs in self.ranks.values() for op in rs.op_stats}, key=_op_order):
            calls, payload, seconds, sim = (sum(rs.op_stats[op][i] for rs in self.ranks.values()
                                                if op in rs.op_stats) for i in range(4))
            alg = algbw(payload, sim if self.link else seconds)
            rows.append({"op": op, "calls": calls, "payload_bytes": payload, "seconds": seconds,
                         "sim_seconds": sim if self.link else None,
                         "algbw": alg, "busbw": alg * busbw_factor(op, self.world_size or 1)})
        return [row for row in rows if row["op"] != "barrier"]

    def step_seconds(self) -> float | None:
        """Median over completed steps of the slowest rank's step time."""
        times = [max(self.rank(r).steps[s]["end"] - self.rank(r).steps[s]["start"]
                     for r in self.rank_ids()) for s in self.completed_steps()]
        return statistics.median(times) if times else None

    def loss(self, step: int | None = None) -> float | None:
        step = self.last_step() if step is None else step
        losses = [self.rank(r).steps[step]["loss"] for r in self.rank_ids()
                  if step in self.rank(r).steps]
        return sum(losses) / len(losses) if losses else None

    def intervals(self, r: int, step: int) -> tuple[float, float, list[tuple]] | None:
        """(step start, step end, [(start, end, op, label), ...]) of rank ``r`` in ``step``:
        issue to done, or, with a simulated link, when the link carried it."""
        step_ev = self.rank(r).steps.get(step)
        if step_ev is None:
            return None
        comm = [(ev.get("sim_start", ev["start"]), ev.get("sim_end", ev["end"]), ev["op"],
                 ev.get("label", ""))
                for ev in self.rank(r).collectives.get(step, []) if ev["op"] != "barrier"]
        return step_ev["start"], step_ev["end"], sorted(comm)

    def blocked(self, r: int, step: int) -> list[tuple[float, float]]:
        """Where rank ``r`` waited for a collective in ``step`` (from its wait to its end); an
        asynchronous collective before its wait overlapped with computation."""
        return sorted((ev.get("waited", ev["start"]), ev["end"])
                      for ev in self.rank(r).collectives.get(step, []) if ev["op"] != "barrier")

    def memory_points(self, r: int, steps: list[int]) -> list[dict]:
        pts = [ev for s in steps for ev in self.rank(r).points.get(s, [])]
        return sorted(pts, key=lambda ev: ev["time"])

    def finished(self) -> bool:
        return bool(self.ranks) and all(self.rank(r).ended for r in self.rank_ids())

    def recent_memory_steps(self, n: int = 2) -> list[int]:
        """The last ``n`` steps with memory snapshots: the one in progress while the run goes
        on, completed ones once it is over."""
        steps = sorted({s for rs in self.ranks.values() for s in rs.points})
        if self.finished():
            steps = [s for s in steps if s in set(self.completed_steps())] or steps
        return ([s for s in steps if s > 0] or steps)[-n:]

    def peak(self, r: int) -> int:
        p = self.rank(r).peak
        return p["total_bytes"] if p else 0

    def persistent(self, r: int) -> int | None:
        """Measured model state: the highest params + grads + optimizer state of any snapshot.

        Note: not the state at the step's end: ``zero_grad()`` frees the gradients there, while
        the ZeRO formulas count them (they all exist together from backward to the step)."""
        rs = self.rank(r)
        return rs.state if rs.peak is not None else None

    def theory_persistent(self) -> float | None:
        return self.theory.get("persistent_bytes")

    def theory_with_unit(self) -> float | None:
        """FSDP (and HSDP): persistent state plus the largest unit gathered."""
        if self.strategy not in ("fsdp", "hsdp") or not self.units or \
                self.theory_persistent() is None:
            return None
        return self.theory_persistent() + max(u["bytes"] for u in self.units)

    def theory_sent_per_step(self) -> float | None:
        return self.theory.get("sent_bytes_per_step")


def _op_order(op: str) -> int:
    return OPS.index(op) if op in OPS else len(OPS)


def phase_order(phase: str) -> tuple[int, str]:
    """Sort key: forward, backward, grad, then other phases (ops) by name."""
    return (list(PHASES).index(phase) if phase in PHASES else len(PHASES), phase)


class Runs:
    """Several runs told apart by the events' ``"run"`` (the strategy when absent).

    A second ``meta`` event from a rank that already sent one starts the run afresh, so
    re-running a launch replaces the old numbers instead of adding to them.
    """

    def __init__(self, keep_steps: int = 8):
        self.keep_steps = keep_steps
        self.runs: dict[str, RunState] = {}
        self.latest: RunState | None = None

    def add(self, events) -> None:
        for ev in events:
            name = str(ev.get("run") or ev.get("strategy") or "run")
            run = self.runs.get(name)
            if run is None or (ev.get("type") == "meta" and run.rank(ev.get("rank", 0)).meta):
                run = self.runs[name] = RunState(name, keep_steps=self.keep_steps)
            if ev.get("type") == "meta" or self.latest is None:
                self.latest = run
            run.add(ev)

    def __iter__(self):
        return iter(self.runs.values())

    def __len__(self) -> int:
        return len(self.runs)


def _formulas_of(strategy: str | None) -> dict[str, str]:
    """The formulas of a strategy this process knows (events recorded before the meta event
    carried them); none for one it does not."""
    from ..registry import get_strategy
    try:
        return get_strategy(strategy).formulas()
    except ValueError:
        return {}
