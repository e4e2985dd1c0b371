"""The assessment, task 2: on a slow link, is DDP or FSDP faster per step? The α-β model (lab
06) of the ledger's collectives, T = C + Σ (latency steps × α + sent bytes / b), beside the
reference on 300 pairs of runs (DDP against fsdp in fp32, bf16-mixed and with checkpointing,
three kinds of units, no compute or some, 1 to 64 ranks, 1 MB/s to 100 GB/s), then the job's
runs on its link and three others, as measured and on 8 ranks. Example, N = 2, an all-reduce of
400 kB, C = 20 ms, 0.05 GB/s and 2000 µs: 20 + 2 × 2 + 400 / 50 = 32 ms.
"""

from __future__ import annotations

import copy
import hashlib

from ...comm.ledger import ring_bytes
from ...comm.link import Link, latency_steps
from ...planner.units import collectives_of
from ..common.configurations import describe
from ..common.differential import Check, Hint
from ..common.exercise import load_solution, not_written_yet
from ..common.records import Config
from ..common.report import CheckResult, verdict_of_check
from ..common.facts import fit_terms, right_only_with, terms_words, unit_words
from ..common.facts import only_at_two_words, right_only_at_two
from .bytes import UNITS

__all__ = ["JOB_LINK", "LINK_CASES", "check_faster_on_link", "link_model"]

JOB_LINK = Link(bandwidth_gbs=0.05, latency_us=2000)   # the job's: 400 Mbit/s, 2 ms a message
# (GB/s, µs): the job's link, one where bytes decide, one where latency decides, one between
LINK_CASES = ((0.05, 2000.0), (0.001, 10.0), (10.0, 2000.0), (0.005, 100.0))
DDP = {"strategy": "ddp", "precision": "fp32", "checkpointing": False}
MODEL = {"compute": 1, "latency": 1, "sent bytes / b": 1}
RUNS: dict = {}   # each configuration's runs, by (its name, N, compute)


def link_model(runs: dict, world_size: int, bandwidth_gbs: float, latency_us: float) -> dict:
    """The kit's answer (the reference solution): each run's step on the link, and the faster."""
    return _reference()(runs, world_size, bandwidth_gbs, latency_us)


def _runs(c) -> dict:
    return RUNS[c["runs"], c["world_size"], c["compute"]]


def _observe(fn, c, record) -> None:
    got, names = fn(copy.deepcopy(_runs(c)), c["world_size"], c["bandwidth_gbs"],
                    c["latency_us"]), sorted(_runs(c))
    if not isinstance(got, dict) or set(got) != {*names, "faster"} or got["faster"] not in names:
        return record.see("seconds", f"{got!r}: return a dict with the keys {', '.join(names)} "
                                     f"(seconds) and faster (the name of the faster run)")
    record.see("seconds", {n: got[n] for n in names})
    record.see("faster", "a tie" if len({got[n] for n in names}) == 1 else got["faster"])


def _terms(c, name) -> dict:
    """The terms of one run's step, as the lesson names them."""
    col, n, a = _runs(c)[name]["collectives"], c["world_size"], c["latency_us"] * 1e-6
    b = c["bandwidth_gbs"] * 1e9
    return {"compute": _runs(c)[name]["compute_s"], "α per collective": len(col) * a,
            "latency": sum(latency_steps(x["op"], n) for x in col) * a,
            "(N−1)α per all-reduce": sum(x["op"] == "all_reduce" for x in col) * (n - 1) * a,
            "sent bytes / b": sum(x["sent_bytes"] for x in col) / b,
            "payload / b": sum(x["payload_bytes"] for x in col) / b}


def _fit(d) -> dict | None:
    """How many times your step times count each term of the lesson (least squares)."""
    fit = fit_terms([(_terms(c, k), m[k]) for c, (mine, _) in d.table.items()
                     if isinstance(m := mine.get("seconds"), dict) for k in m], 1e-6)
    return fit if fit and any(abs(fit[k] - MODEL.get(k, 0)) > 1e-3 for k in fit) else None


def _ratio(d) -> float | None:
    """yours / the reference's, where that is one number for every run and configuration."""
    r = [m[k] / w[k] for _, m, w in d.pairs("seconds") if isinstance(m, dict) for k in w if w[k]]
    return r[0] if len(r) > 1 and all(abs(x / r[0] - 1) < 1e-6 for x in r) else None


def _named_fewer_bytes(d) -> bool:
    """Wherever yours names another run, it is the one that sends fewer bytes."""
    def sent(c, k):
        return sum(x["sent_bytes"] for x in _runs(c)[k]["collectives"])
    rows = [(c, m.get("faster")) for c, (m, w) in d.table.items()
            if m.get("faster") != w.get("faster") and w.get("faster") != "a tie"]
    return bool(rows) and all(sent(c, f) == min(sent(c, k) for k in _runs(c)) for c, f in rows)


HINTS = [
    Hint(lambda d: d.raised is not None, "runs[name] holds compute_s (seconds) and collectives "
         "(a list of {{op, payload_bytes, sent_bytes}}); return {{name: seconds, ..., 'faster': "
         "name}}"),
    Hint(lambda d: d.observable == "seconds" and isinstance(d.whole[0], str), "return a dict: "
         "each run's seconds, and faster"),
    Hint(lambda d: unit_words(_ratio(d)), lambda d: f"your times are {_ratio(d):g}x the "
         f"model's: {unit_words(_ratio(d))}: return seconds"),
    Hint(lambda d: d.observable == "seconds" and right_only_at_two(d), only_at_two_words(
        "a count of latency steps (N−1 per all-gather or reduce-scatter, 2(N−1) per all-reduce) "
        "or a ring share")),
    Hint(lambda d: d.observable == "seconds" and _fit(d), lambda d: "from your step times: "
         f"{terms_words(_fit(d), MODEL)}. The model: compute + latency (Σ latency steps × α: "
         "N−1 for an all-gather or a reduce-scatter, 2(N−1) for an all-reduce) + the ledger's "
         "sent bytes / (bandwidth_gbs × 10⁹)"),
    Hint(lambda d: d.observable == "seconds" and right_only_with(d, "compute", lambda v: v == 0),
         "right only where there is no compute: the compute and the communication add up, T = "
         "C + latency + bytes / b (these runs wait for their collectives: nothing hides them)"),
    Hint(lambda d: d.observable == "faster" and _named_fewer_bytes(d), "your times are right, "
         "but you named the run that sends fewer bytes: on a link with a large α many messages "
         "cost more than the bytes they save; the faster is the run with the smaller time"),
    Hint(lambda d: d.observable == "faster", "your times are right, but not the run you named: "
         "the faster is the run with the smaller time"),
]

CHECK = Check("task 2: your faster_on_link", _observe, [], ("seconds", "faster"),
              tolerance={"seconds": 1e-6}, hints=HINTS,
              words={"seconds": "the step times", "faster": "the faster run"},
              agreed="the α-β step times and the faster run of the reference")


def _run(config, units, n, compute) -> dict:
    return {"compute_s": compute * (4 / 3 if config["checkpointing"] else 1), "collectives": [
        {k: c[k] for k in ("op", "payload_bytes", "sent_bytes")}
        for c in collectives_of(config, units, n)]}


def configs(own: list = ()) -> list[Config]:
    out = []
    for n, compute, units, fsdp in ((n, c, u, f) for n in (1, 2, 3, 8, 64) for c in (0.0, 0.02)
                                    for u in ("equal", "unequal") for f in (
                                        ("fp32", False), ("bf16-mixed", False),
                                        ("bf16-mixed", True))):
        fsdp = {"strategy": "fsdp", "precision": fsdp[0], "checkpointing": fsdp[1]}
        name = f"ddp fp32, {describe(fsdp)}, {units} units"
        RUNS[name, n, compute] = {"ddp": _run(DDP, UNITS[units], n, compute),
                                  "fsdp": _run(fsdp, UNITS[units], n, compute)}
        out += [Config(world_size=n, compute=compute, runs=name, bandwidth_gbs=bw,
                       latency_us=lat) for bw, lat in ((0.001, 10.0), (0.005, 100.0),
                                                       (0.05, 2000.0), (10.0, 2000.0), (100.0, 1.0))]
    return out + list(own)


def _own(runs: dict, n: int) -> list[Config]:
    """The runs as measured on ``n`` ranks, and the same collectives on 8 ranks."""
    eight = {k: {**r, "collectives": [{**x, "sent_bytes": ring_bytes(x["op"], x["payload_bytes"],
                                                                      8)} for x in r["collectives"]]}
             for k, r in runs.items()}
    out, name = [], f"yours ({hashlib.sha256(repr(runs).encode()).hexdigest()[:8]})"
    for r, m in [(runs, n)] + ([(eight, 8)] if n != 8 else []):
        RUNS[name, m, -1] = r
        out += [Config(world_size=m, compute=-1, runs=name, bandwidth_gbs=bw, latency_us=lat)
                for bw, lat in LINK_CASES]
    return out


def _reference():
    return load_solution("11_faster_on_link", "faster_on_link")


JUDGES = {"11_faster_on_link": lambda answers: CHECK.judge_many(answers, _reference(), configs())}


@verdict_of_check
def check_faster_on_link(fn, runs: dict, world_size: int) -> CheckResult:
    """Check ``fn(runs, world_size, bandwidth_gbs, latency_us)`` beside the reference on
    :func:`configs`, then on ``runs`` (the job's link and three others, and on 8 ranks)."""
    result = CheckResult(CHECK.what)
    if not_written_yet(fn):
        result.facts["verdict"] = "faster_on_link is not written yet"
        return result.wrong("faster_on_link is not written yet: write its body in the cell "
                            "above", hint="T = C + Σ (latency steps × α + sent bytes / b)"
                            ).finish()
    plain = {k: {"compute_s": r["compute_s"], "collectives": r["collectives"]}
             for k, r in sorted(runs.items())}
    own = _own(plain, world_size)
    CHECK(fn, _reference(), result, configs=configs(own))
    for c in own if result.passed else ():
        got = result.facts["records"][c][1].get("seconds")
        result.ok(f"{c['bandwidth_gbs']:g} GB/s, {c['latency_us']:g} µs, {c['world_size']} ranks"
                  + " (the job's link)" * (c is own[0]) + ": " + ", ".join(
                      f"{k.upper()} {v * 1e3:.1f} ms" for k, v in got.items()) +
                  f": {min(got, key=got.get).upper()} is faster")
    job = link_model(plain, world_size, *LINK_CASES[0])
    wrong = [msg for ok, msg, _ in result.lines if not ok]
    result.facts.update(job=job, verdict=wrong[0] if wrong else (
        f"the α-β step times on all {len(result.facts['records'])} links and runs; on the job's "
        f"link {job['faster'].upper()} is faster"))
    return result.finish()
