"""A simulated network (fsdp_mini.Link): every collective takes at least its α-β ring time."""

import math

import link_workers
import pytest
import torch
from test_cli import _main_in_process

from fsdp_mini import Link, launch, parallelize
from fsdp_mini.comm.collectives import Comm
from fsdp_mini.comm.ledger import ring_bytes
from fsdp_mini.telemetry import RunState

SLOW = Link(bandwidth_gbs=0.05, latency_us=100)  # 1 MB all-reduce at N = 2: 20.2 ms


# ---------------------------------------------------------------- the formula, no processes
def test_cost_per_op_is_the_alpha_beta_ring_model():
    link = Link(bandwidth_gbs=1.0, latency_us=50)
    a, n, payload = 50e-6, 4, 4_000_000
    assert link.cost("all_gather", payload, n) == pytest.approx(3 * a + 0.75 * payload / 1e9)
    assert link.cost("all_gather", payload, n) == pytest.approx(3.15e-3)  # the docstring's
    assert link.cost("reduce_scatter", payload, n) == pytest.approx(3.15e-3)
    assert link.cost("all_reduce", payload, n) == pytest.approx(6.30e-3)
    assert link.cost("broadcast", payload, n) == pytest.approx(3.15e-3)
    assert link.cost("barrier", 0, n) == pytest.approx(3 * a)
    for op in ("all_gather", "reduce_scatter", "all_reduce", "broadcast"):  # the ledger's bytes
        assert link.cost(op, 1000, 3) == pytest.approx(
            link.cost(op, 0, 3) + ring_bytes(op, 1000, 3) / 1e9)
        assert link.cost(op, payload, 1) == 0  # world size 1: nothing sent, no message


def test_the_link_is_a_fifo_queue():
    link = Link(bandwidth_gbs=1.0)
    assert link.reserve(10.0, 2.0) == 10.0
    assert link.reserve(11.0, 1.0) == 12.0   # issued while busy: starts when the first ends
    assert link.reserve(20.0, 1.0) == 20.0   # issued once idle: starts at once


def test_bad_links_are_explained():
    bad = [((0,), ValueError, "bandwidth_gbs must be a finite number of GB/s > 0"),
           ((-1.0,), ValueError, "bandwidth_gbs"), ((math.nan,), ValueError, "got nan"),
           ((math.inf,), ValueError, "got inf"), (("1",), TypeError, r"got '1' \(str\)"),
           ((True,), TypeError, "got True"), ((1, math.inf), ValueError, "latency_us must be"),
           ((1, -5), ValueError, "microseconds >= 0"), ((1, math.nan), ValueError, "got nan"),
           ((1, None), TypeError, "latency_us")]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            Link(*args)
    with pytest.raises(TypeError, match=r"link must be None or a fsdp_mini.Link"):
        Comm(link=1.0)
    with pytest.raises(TypeError, match=r"link must be None or a fsdp_mini.Link"):
        parallelize(torch.nn.Linear(2, 2), "ddp", link={"bandwidth_gbs": 1})


def test_world_size_one_is_unaffected():
    comm = Comm(link=SLOW)
    comm.all_reduce(torch.ones(10**6), label="x")
    record = comm.ledger.records[0]  # nothing sent: the link charges no time and queues none
    assert (record.simulated_seconds, record.simulated_queue) == (0.0, 0.0)


# ---------------------------------------------------------------- gloo, world size 2
# Note: wall-clock times are bounded from below only (a busy machine only makes them longer);
# what the link itself adds is checked on its own clock (each handle's simulated end).
@pytest.fixture(scope="module")
def timings():
    return launch(link_workers.timings, 2, SLOW.bandwidth_gbs, SLOW.latency_us, timeout=60)


def test_a_blocking_collective_takes_its_simulated_time(timings):
    cost = SLOW.cost("all_reduce", 10**6, 2)
    for res in timings:
        assert res["blocking"] >= cost, (res["blocking"], cost)
        blocking = next(r for r in res["records"] if r[1] == "blocking")
        assert blocking[3] == pytest.approx(cost) and blocking[4] == 0  # charged once, no queue
        assert res["summed"] == 2.0  # the collective itself still ran


def test_collectives_in_flight_together_share_the_link(timings):
    bytes_ = ring_bytes("all_reduce", 10**6, 2) + ring_bytes("all_gather", 10**6, 2)
    for res in timings:
        assert res["two"] >= bytes_ / SLOW.bytes_per_second
        first, second = [r for r in res["records"] if r[1] in ("first", "second")]
        end_first, end_second = res["ends"]
        assert end_second >= end_first + second[3] - 1e-9  # it began once the first had ended


def test_a_collective_hidden_behind_compute_costs_nothing_at_wait(timings):
    cost = SLOW.cost("all_reduce", 10**6, 2)
    for res in timings:
        assert res["hidden_link_left"] == 0.0, (res["hidden_link_left"], cost)
        assert res["hidden"] >= res["hidden_compute"]


def test_ledger_records_carry_simulated_seconds(timings):
    for res in timings:
        for op, label, payload, simulated, queue, seconds in res["records"]:
            assert simulated == pytest.approx(SLOW.cost(op, payload, 2)), label
            assert queue >= 0 and seconds >= simulated + queue - 1e-6, label
        assert all(math.isnan(s) and math.isnan(q) for s, q in res["plain"])  # no link: nan


@pytest.fixture(scope="module")
def trained():
    link = Link(bandwidth_gbs=0.01, latency_us=50)
    return link, launch(link_workers.train_with_and_without, 2, ("ddp", "fsdp"), link,
                        timeout=60)


def test_a_link_changes_time_only(trained):
    link, results = trained
    for res in results:
        for strategy in ("ddp", "fsdp"):
            plain, linked = res[strategy, "plain"], res[strategy, "linked"]
            assert linked["losses"] == plain["losses"], strategy
            for name, t in plain["state"].items():
                assert torch.equal(linked["state"][name], t), (strategy, name)
            assert [r[:2] for r in linked["records"]] == [r[:2] for r in plain["records"]]
            for seconds, sent in zip(linked["step_seconds"], linked["sent_bytes"]):
                assert sent > 0 and seconds >= sent / link.bytes_per_second, strategy


def test_telemetry_and_dashboard_show_the_simulated_link(trained):
    from fsdp_mini import widgets
    link, results = trained
    events = [ev for res in results for ev in res["fsdp", "linked"]["events"]]
    collectives = [ev for ev in events if ev["type"] == "collective"]
    assert collectives and all(ev["start"] <= ev["sim_start"] <= ev["sim_end"]
                               for ev in collectives)
    run = RunState("fsdp")
    for ev in events:
        run.add(ev)
    assert run.link == {"bandwidth_gbs": 0.01, "latency_us": 50.0}
    for row in run.bandwidth():
        assert row["sim_seconds"] > 0
        if row["op"] == "all_gather":  # big messages: the link's bandwidth, less latency
            assert row["busbw"] < link.bytes_per_second
    dash = widgets.Dashboard.from_events(events)
    dash.render(final=True)
    assert "simulated link: 0.01 GB/s, 50 µs" in dash.bandwidth.value
    assert "on link" in dash.bandwidth.value and "simulated link" in dash.header.value
    figure = dash.static_figure()  # the same figures, static: titles say so too
    assert any("simulated link" in ax.get_title() for ax in figure.axes)
    plain = [ev for res in results for ev in res["fsdp", "plain"]["events"]]
    assert not any("sim_end" in ev or "link" in ev for ev in plain)


# ---------------------------------------------------------------- fsdp-mini compare
LINK_ARGUMENTS = [
    (["--link-bandwidth", "0"], "--link-bandwidth must be a finite number of GB/s > 0, e.g. 1.0, got 0"),
    (["--link-bandwidth", "-1"], "--link-bandwidth must be a finite number of GB/s > 0, e.g. 1.0, got -1"),
    (["--link-bandwidth", "nan"], "--link-bandwidth must be a finite number of GB/s > 0, e.g. 1.0, got nan"),
    (["--link-bandwidth", "inf"], "--link-bandwidth must be a finite number of GB/s > 0, e.g. 1.0, got inf"),
    (["--link-bandwidth", "1", "--link-latency", "-3"],
     "--link-latency must be a finite number of microseconds >= 0, e.g. 50, got -3"),
    (["--link-bandwidth", "1", "--link-latency", "inf"],
     "--link-latency must be a finite number of microseconds >= 0, e.g. 50, got inf"),
    (["--link-latency", "50"],
     ("--link-latency needs --link-bandwidth: a simulated link has both, e.g. --link-bandwidth 1 "
      "--link-latency 50")),
]


@pytest.mark.parametrize("args, message", LINK_ARGUMENTS)
def test_bad_link_flags_fail_in_one_line_before_any_rank(args, message, monkeypatch, capsys):
    code, out, err, seconds = _main_in_process(["--world-size", "2", *args], monkeypatch, capsys)
    assert (code, out, err) == (2, "", f"fsdp-mini compare: error: {message}\n")
    assert seconds < 3


def test_link_flags_reach_the_config():
    from fsdp_mini.jobs.cli import _check_args, _parser
    from fsdp_mini.jobs.compare import CompareConfig
    args = _parser().parse_args(["compare", "--world-size", "2", "--link-bandwidth", "1.5",
                                 "--link-latency", "20"])
    _, _, config = _check_args(args)
    assert config.link() == Link(bandwidth_gbs=1.5, latency_us=20)
    args = _parser().parse_args(["compare", "--world-size", "2", "--link-bandwidth", "2"])
    assert _check_args(args)[2].link() == Link(2.0, 0.0)
    assert CompareConfig().link() is None
    with pytest.raises(ValueError, match="link_latency_us needs link_bandwidth_gbs"):
        CompareConfig(link_latency_us=5.0)
    with pytest.raises(ValueError, match="Link bandwidth_gbs must be"):
        CompareConfig(link_bandwidth_gbs=0.0)
