"""Lab 06's checker runs the answer beside the reference on 1,625 jobs and names the first
difference (the edges, exact ties, a wrong term measured from the answers); the sweep's analysis
fits the bytes and intercepts it is fed; one short sweep on 2 ranks.

The wrong answers (the reference formula with one slip each) are in tests/wrong_answers/lab06.py,
run by tests/test_wrong_answers.py. (Under CI=true, set by conftest, a failed check raises
CheckFailed.)
"""

import math

import pytest

from fsdp_mini import labs
from fsdp_mini.labs.lab06 import checks as lab06

predict = labs.load_solution("06_predict_crossover", "predict_crossover")


def complaint(fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        labs.check_predict_crossover(fn)
    return str(info.value)


def test_the_reference_passes_on_every_job_and_the_kits_answer_is_it():
    result = labs.check_predict_crossover(predict)
    assert result.passed and "1625 configurations" in str(result)
    assert result.checker == "check_predict_crossover"
    assert predict(3.2e6, 4, 4, 0.2, 50, 0.1) == pytest.approx(0.414, abs=1e-3)
    assert labs.alpha_beta_crossover(7e9, 64, 64, 2.0, 10.0, 0.1) == predict(7e9, 64, 64, 2.0,
                                                                               10.0, 0.1)


def test_the_jobs_hold_every_edge():
    jobs = lab06.configs()
    got = [predict(*(c[a] for a in lab06.ARGS)) for c in jobs]
    assert 0.0 in got and math.inf in got and any(0 < g < math.inf for g in got)
    assert {c["world_size"] for c in jobs} >= {1, 2, 3, 4, 8, 64}
    assert {c["margin"] for c in jobs} >= {0.0, 0.5, 2.0}
    tie = next(c for c in jobs if c["world_size"] == 1 and c["margin"] == 0)
    assert lab06._model(tie) == (0.0, 0.0)       # no bytes extra, no time left: an exact tie


def test_a_stub_is_not_written_yet():
    def stub(psi, world_size, units, compute_s, latency_us, margin):
        """doc"""
        ...  # noqa: PIE790  (a stub, as in the notebook)

    assert "not written yet" in complaint(stub)


def test_an_unknown_answer_is_told_where_it_first_differs_and_the_formula():
    text = complaint(lambda *args: 1.0)
    assert "at world size 1, units 1," in text and "yours 1, the reference " in text
    assert "solve T_f(b) = (1 + m)·T_d(b) for b" in text


def test_an_error_is_one_line_with_its_place():
    def raises(*args):
        raise ZeroDivisionError("oops")

    text = complaint(raises)
    assert "your code raised ZeroDivisionError: oops" in text and "in raises" in text


def test_a_wrong_latency_term_is_measured_from_the_answers():
    def four_per_unit(psi, n, units, c, alpha_us, m):
        a = alpha_us * 1e-6
        extra = (3 - 2 * (1 + m)) * (n - 1) / n * 4 * psi
        left = (1 + m) * (c + 2 * (n - 1) * a) - c - 4 * units * (n - 1) * a
        if extra <= 0:
            return 0.0 if left > 0 else math.inf
        return math.inf if left <= 0 else extra / left / 1e9
    assert "your FSDP latency is 4·units·(N−1)α and DDP's 2·(N−1)α" in complaint(four_per_unit)


def test_solve_crossover_edges():
    assert lab06.solve_crossover((1, 0, 10), (1, 0, 10), 0.1) == 0.0        # never loses
    assert lab06.solve_crossover((1, 0.5, 20), (1, 0, 10), 0.1) == math.inf  # latency alone


def fake_sweep(bandwidths, c=0.02, steps=3, n=2, alpha_us=50.0, carried=1.0, overhead=0.0):
    """per_rank as crossover_rank returns it, every step exactly C + L + B/b (the link carrying
    ``carried`` x the ledger's bytes), FSDP's plus ``overhead`` seconds."""
    ops = {"ddp": [("all_reduce", 100_000)], "fsdp": [("all_gather", 50_000)] * 6}
    out = {}
    for bw in bandwidths or [None]:
        for s in ("ddp", "fsdp"):
            recs = [{"op": op, "payload_bytes": p} for op, p in ops[s]]
            lat, b = lab06.ledger_costs(recs, n, alpha_us)
            blocked = lat + carried * b / (bw * 1e9) if bw else lat
            extra = overhead if s == "fsdp" else 0.0
            out[s, bw] = {"seconds": [c + blocked + extra] * steps, "blocked": [blocked] * steps,
                          "compute": [c + extra] * steps, "records": recs}
    return [out] * n


def test_the_sweep_of_an_exact_model_fits_the_ledgers_bytes_and_the_models_intercepts():
    kit = labs.predict_from_ledger(fake_sweep([]), 50.0, 0.2)
    (c, l_d, b_d), (_, l_f, b_f) = kit["base"]["ddp"], kit["base"]["fsdp"]
    assert c == pytest.approx(0.02) and b_d == 100_000 and b_f == 150_000
    assert l_d == pytest.approx(100e-6) and l_f == pytest.approx(300e-6)
    assert kit["no_link"]["fsdp"] == pytest.approx(c + l_f)
    bws = [kit["predicted"] * f for f in (1 / 16, 1 / 8, 1 / 4, 1 / 2)]
    sweep = labs.crossover_table(fake_sweep(bws), bws, kit, 0.2)
    assert sweep["seen_bytes"]["fsdp"] == pytest.approx(150_000)
    assert sweep["fit"]["ddp"][0] == pytest.approx(c + l_d)        # the intercept: C + L
    assert sweep["with_overhead"] == pytest.approx(kit["predicted"])  # no overhead: the model
    for row in sweep["rows"]:
        assert row["ddp"] == pytest.approx(row["ddp model"]) and row["ratio"] > 1.2


def test_fsdps_overhead_raises_the_crossover_and_past_the_margin_makes_it_inf():
    kit = labs.predict_from_ledger(fake_sweep([], overhead=0.002), 50.0, 0.2)
    bws = [kit["predicted"] * f for f in (1 / 16, 1 / 8)]
    sweep = labs.crossover_table(fake_sweep(bws, overhead=0.002), bws, kit, 0.2)
    assert math.inf > sweep["with_overhead"] > sweep["predicted"]
    assert sweep["fit"]["fsdp"][0] == pytest.approx(0.02 + 300e-6 + 0.002)
    kit = labs.predict_from_ledger(fake_sweep([], overhead=0.01), 50.0, 0.2)  # 1.5x DDP's step
    assert labs.crossover_table(fake_sweep(bws, overhead=0.01), bws, kit, 0.2)["with_overhead"] \
        == math.inf


def test_a_short_sweep_on_two_ranks_records_the_ledgers_bytes():
    import fsdp_mini
    per_rank = fsdp_mini.launch(lab06.crossover_rank, 2, "tiny", [0.05], 2, 50.0, 4, timeout=120)
    assert set(per_rank[0]) == {("ddp", 0.05), ("fsdp", 0.05)}
    recs = {s: per_rank[0][s, 0.05]["records"] for s in ("ddp", "fsdp")}
    (l_d, b_d), (l_f, b_f) = (lab06.ledger_costs(recs[s], 2, 50.0) for s in ("ddp", "fsdp"))
    assert l_d == pytest.approx(2 * 50e-6) and l_f == pytest.approx(8 * 50e-6)  # 1 and 8 collectives
    assert 1.3 < b_f / b_d <= 1.5                       # the root is not gathered again for backward
    run = per_rank[0]["fsdp", 0.05]
    assert len(run["seconds"]) == 1 and all(r["simulated_seconds"] > 0 for r in run["records"])


def test_the_timelines_legend_has_the_colours_of_the_ops_it_draws():
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.colors import to_hex
    rec = lambda op, start, waited: {"op": op, "start": start, "seconds": 0.004, "waited": waited}  # noqa: E731
    per_rank = [{"v": {"records": [rec("all_gather", 0.0, 0.0), rec("all_gather", 0.001, 0.002),
                                   rec("reduce_scatter", 0.005, 0.003)]}}]
    ax = lab06.timeline(per_rank, ["v"])
    legend = ax.get_legend()
    said = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert said == {"all_gather: rank waiting": "#4c72b0", "all_gather: rank computing": "#c9d5e7",
                    "reduce_scatter: rank waiting": "#dd8452",
                    "reduce_scatter: rank computing": "#f5dacb"}          # no all_reduce: none drawn
    assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1  # outside the bars
    assert all(p.get_alpha() is None for p in ax.patches)                 # opaque: no blended hues


def test_the_measured_crossover_is_read_between_the_links_that_bracket_it():
    rows = [{"bw": 0.1, "ratio": 1.44}, {"bw": 0.4, "ratio": 1.0}, {"bw": 1.6, "ratio": 0.9}]
    assert labs.measured_crossover(rows, 0.2) == pytest.approx(0.2)      # log-interpolated
    assert labs.measured_crossover(rows[::-1], 0.2) == pytest.approx(0.2)  # any order
    assert labs.measured_crossover([{"bw": 1, "ratio": 1.3}, {"bw": 2, "ratio": 1.5}], 0.2) \
        == math.inf                                       # FSDP lost at every link swept
    assert labs.measured_crossover([{"bw": 1, "ratio": 1.1}], 0.2) == 0.0
