"""The assessment, task 2: on a slow link, which is faster per step, DDP or FSDP? Predicted with
the α-β model (lab 06) from what the ledger counted in a run without a link.

    labs.check_faster_on_link(faster_on_link, {"ddp": runs["ddp"], "fsdp": runs["fsdp"]}, N)

One step on a link of bandwidth b (GB/s = 10⁹ B/s) and latency α per message takes
T = C + Σ over the step's collectives of (latency steps × α + sent bytes / b): C the compute,
latency steps (N−1) for an all-gather or a reduce-scatter and 2(N−1) for an all-reduce (each
rank sends that many messages one after another in a ring), sent bytes what the ledger counted
for one rank ((N−1)/N of the payload, twice that for an all-reduce). Example, N = 2, one
all-reduce of 400 kB payload, C = 20 ms, on 0.05 GB/s and 2000 µs: 20 + 2 × 2 + 400 / 50 =
32 ms. FSDP in bf16 sends fewer bytes than DDP in fp32, in many more messages: which is faster
depends on the link.
"""

from __future__ import annotations

import copy
import math

from ...comm.ledger import ring_bytes
from ...comm.link import Link, latency_steps
from ..common.exercise import not_written_yet
from ..common.report import CheckResult, verdict_of_check

__all__ = ["JOB_LINK", "LINK_CASES", "check_faster_on_link", "link_model"]

JOB_LINK = Link(bandwidth_gbs=0.05, latency_us=2000)   # the job's: 400 Mbit/s, 2 ms a message
# Note: (GB/s, µs): the job's link, one where bytes decide (FSDP's fewer bytes win), one where
# latency decides (DDP's one message wins), and one in between.
LINK_CASES = ((0.05, 2000.0), (0.001, 10.0), (10.0, 2000.0), (0.005, 100.0))
SCALED_RANKS = 8  # the checker also asks about the same collectives on 8 ranks
TOL = 0.01

# mistake: what it is, in plain words; the hint
MISTAKES = {
    "alpha once": ("you paid α once per collective: a ring collective pays it N−1 times (an "
                   "all-reduce 2(N−1)), one message after another",
                   "latency = Σ latency_steps(op, N) × α: (N−1) for all_gather and "
                   "reduce_scatter, 2(N−1) for all_reduce"),
    "all-reduce alpha": ("you paid (N−1)α for the all-reduce: it is a reduce-scatter then an "
                         "all-gather, 2(N−1) messages", "2(N−1)α for each all_reduce"),
    "no latency": ("you left out the latency: every collective also pays (N−1)α, and FSDP "
                   "issues many more of them than DDP", "add Σ latency_steps(op, N) × α"),
    "payload": ("you divided the whole payload by the bandwidth: one rank sends (N−1)/N of it "
                "(2(N−1)/N for an all-reduce), what the ledger's sent_bytes says",
                "use each collective's sent_bytes, not its payload_bytes"),
    "bits": ("off by 8 on the bytes' time: GB/s is 10⁹ bytes per second, not bits",
             "time = bytes / (bandwidth_gbs × 1e9)"),
    "GiB": ("the bandwidth read as GiB/s (2³⁰ B/s): GB/s is 10⁹ B/s", "bandwidth_gbs × 1e9"),
    "no compute": ("you left out the compute: a step is C + its communication",
                   "add run['compute_s'] to each strategy's time"),
    "overlap": ("you assumed the communication hidden behind the compute (max): these runs wait "
                "for their collectives", "T = C + latency + bytes / bandwidth, a sum"),
    "milliseconds": ("your times are in milliseconds: return seconds", ""),
    "fewer bytes": ("your times are right, but you called the run that sends fewer bytes the "
                    "faster one: on a link with a large α, FSDP's many messages cost more than "
                    "its fewer bytes save", "faster = the run with the smaller predicted time"),
    "reversed": ("your times are right, but you named the slower run as the faster one",
                 "faster = the run with the smaller time"),
}


def link_model(runs: dict, world_size: int, bandwidth_gbs: float, latency_us: float,
               mistake: str | None = None) -> dict:
    """The kit's answer (or, with ``mistake``, what that slip gives): each run's predicted step
    on the link, seconds, and which is faster.

    >>> runs = {"ddp": {"compute_s": 0.02, "collectives": [
    ...     {"op": "all_reduce", "payload_bytes": 400e3, "sent_bytes": 400e3}]}}
    >>> round(link_model(runs, 2, 0.05, 2000)["ddp"] * 1e3, 1)
    32.0
    """
    b = bandwidth_gbs * {"bits": 1e9 / 8, "GiB": 2**30}.get(mistake, 1e9)
    alpha = 0.0 if mistake == "no latency" else latency_us * 1e-6
    out = {}
    for name, run in runs.items():
        latency = sum(alpha * _steps(c["op"], world_size, mistake) for c in run["collectives"])
        key = "payload_bytes" if mistake == "payload" else "sent_bytes"
        comm = latency + sum(c[key] for c in run["collectives"]) / b
        compute = 0.0 if mistake == "no compute" else run["compute_s"]
        out[name] = max(compute, comm) if mistake == "overlap" else compute + comm
        out[name] *= 1e3 if mistake == "milliseconds" else 1.0
    names = sorted(runs, key=out.get)
    if mistake == "fewer bytes":
        names = sorted(runs, key=lambda n: sum(c["sent_bytes"] for c in runs[n]["collectives"]))
    out["faster"] = names[-1] if mistake == "reversed" else names[0]
    return out


def _steps(op: str, n: int, mistake) -> int:
    if mistake == "alpha once":
        return 1
    if mistake == "all-reduce alpha":
        return n - 1
    return latency_steps(op, n)


def scaled(runs: dict, world_size: int) -> dict:
    """The same collectives on ``world_size`` ranks: the same payloads, each rank sending its
    ring share of them (padding aside)."""
    return {name: {"compute_s": run["compute_s"],
                   "collectives": [{**c, "sent_bytes": ring_bytes(c["op"], c["payload_bytes"],
                                                                  world_size)}
                                   for c in run["collectives"]]}
            for name, run in runs.items()}


def _cases(runs: dict, world_size: int):
    """(runs, N, GB/s, µs) of every question the checker asks."""
    sets = [(runs, world_size)]
    if world_size != SCALED_RANKS:
        sets.append((scaled(runs, SCALED_RANKS), SCALED_RANKS))
    return [(r, n, bw, lat) for r, n in sets for bw, lat in LINK_CASES]


def _same(got: dict, want: dict, names) -> bool:
    return got.get("faster") == want["faster"] and all(
        math.isclose(got[n], want[n], rel_tol=TOL) for n in names)


def _valid(answer, names) -> str:
    if not isinstance(answer, dict) or set(answer) != {*names, "faster"}:
        return (f"returned {answer!r}: return a dict with the keys {', '.join(names)} (seconds) "
                f"and faster (the name of the faster run)")
    if answer["faster"] not in names or not all(
            isinstance(answer[n], (int, float)) and not isinstance(answer[n], bool) for n in names):
        return f"returned {answer!r}: seconds as numbers, faster one of {', '.join(names)}"
    return ""


def _where(bw: float, lat: float, n: int, world_size: int) -> str:
    job = (bw, lat) == LINK_CASES[0] and n == world_size
    return f"{bw:g} GB/s, {lat:g} µs, {n} ranks" + (" (the job's link)" if job else "")


def _says(answer: dict, names) -> str:
    times = ", ".join(f"{n.upper()} {answer[n] * 1e3:.1f} ms" for n in names)
    return f"{times}: {answer['faster'].upper()} is faster"


@verdict_of_check
def check_faster_on_link(fn, runs: dict, world_size: int) -> CheckResult:
    """Check ``fn(runs, world_size, bandwidth_gbs, latency_us)`` against :func:`link_model` on
    the job's link and three others, for ``runs`` as measured and on 8 ranks; a set of answers
    a known slip gives is named."""
    result = CheckResult("task 2: your faster_on_link")
    if not_written_yet(fn):
        result.facts["verdict"] = "faster_on_link is not written yet"
        return result.wrong("faster_on_link is not written yet: write its body in the cell "
                            "above", hint="T = C + Σ (latency steps × α + sent bytes / b)"
                            ).finish()
    names = sorted(runs)
    plain = {n: {"compute_s": runs[n]["compute_s"], "collectives": runs[n]["collectives"]}
             for n in names}
    answers, cases = [], _cases(plain, world_size)
    for r, n, bw, lat in cases:
        try:
            answer = fn(copy.deepcopy(r), n, bw, lat)  # Note: a copy, whatever fn does to it
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            result.facts["verdict"] = f"faster_on_link raised {type(e).__name__}"
            return result.wrong(f"faster_on_link(runs, {n}, {bw:g}, {lat:g}) raised "
                                f"{type(e).__name__}: {e}").finish()
        if (bad := _valid(answer, names)):
            result.facts["verdict"] = "faster_on_link returned an answer of the wrong form"
            return result.wrong(bad).finish()
        answers.append(answer)
    for answer, (r, n, bw, lat) in zip(answers, cases):
        want, where = link_model(r, n, bw, lat), _where(bw, lat, n, world_size)
        if _same(answer, want, names):
            result.ok(f"{where}: {_says(want, names)}")
        else:
            result.wrong(f"{where}: you say {_says(answer, names)}; the α-β model says "
                         f"{_says(want, names)}")
    job = link_model(plain, world_size, *LINK_CASES[0])
    result.facts.update(job=job, verdict=(
        f"the α-β step times on all {len(cases)} links and rank counts; on the job's link "
        f"{job['faster'].upper()} is faster"))
    if not result.passed:
        result.facts["verdict"] = "wrong step times or verdicts on some links"
        for mistake, (words, hint) in MISTAKES.items():
            if all(_same(a, link_model(r, n, bw, lat, mistake), names)
                   for a, (r, n, bw, lat) in zip(answers, cases)):
                result.wrong(words, hint=hint)
                result.facts["verdict"] = words
                break
    return result.finish()
