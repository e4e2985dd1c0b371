"""Telemetry streams every collective, memory phase and step from the ranks, losslessly, live."""

import time

import pytest
import workers

from fsdp_mini import LaunchError, launch
from fsdp_mini.jobs import train_gpt
from fsdp_mini.telemetry import EventLog, EventTail, Recorder, load_events


@pytest.fixture(scope="module")
def fsdp_run():
    log = EventLog()
    results = launch(train_gpt, 3, "fsdp", 4, "tiny", 12, monitor=log)
    return results, log


def test_telemetry_totals_equal_the_ledger(fsdp_run):
    results, log = fsdp_run
    for rank, res in enumerate(results):
        mine = [e for e in log.events if e["rank"] == rank and e["type"] == "collective"]
        by_op = {}
        for e in mine:
            by_op[e["op"]] = by_op.get(e["op"], 0) + e["sent_bytes"]
        assert by_op == pytest.approx(res["sent_bytes_by_op"], rel=1e-12)
        assert sum(e["sent_bytes"] for e in mine) == pytest.approx(res["sent_bytes"], rel=1e-12)


def test_every_kind_of_event_arrives(fsdp_run):
    results, log = fsdp_run
    for rank in range(3):
        events = [e for e in log.events if e["rank"] == rank]
        kinds = [e["type"] for e in events]
        assert kinds[0] == "meta" and kinds[-1] == "end"
        meta = events[0]
        assert meta["strategy"] == "fsdp" and meta["world_size"] == 3
        assert [u["name"] for u in meta["units"]] == ["blocks.0", "blocks.1", "root"]
        steps = [e for e in events if e["type"] == "step"]
        assert [e["step"] for e in steps] == [1, 2, 3, 4]
        assert [e["loss"] for e in steps] == pytest.approx(results[rank]["losses"])
        labels = {e["label"] for e in events if e["type"] == "memory"}
        assert {"blocks.0/gathered", "blocks.0/forward_done", "blocks.0/backward_done",
                "backward_end", "step_end"} <= labels
        gathered = [e["by_category"]["gathered_params"] for e in events
                    if e["type"] == "memory" and e["step"] == 2]
        assert max(gathered) > 0 and min(gathered) == 0  # gather / free saw-tooth
        # per step, bytes equal the formula
        for s in (2, 3):
            sent = sum(e["sent_bytes"] for e in events if e["type"] == "collective"
                       and e["step"] == s)
            assert sent == pytest.approx(meta["theory"]["sent_bytes_per_step"], rel=1e-12)


def test_the_monitor_is_fed_while_the_ranks_run():
    """Events arrive in several batches while the ranks train, not only at the end.

    Note: a run of its own, long enough (60 steps, about a second) for the monitor's 0.1 s polls
    to find new events several times: ranks start warm now, and the 4 steps above can be over
    before a second poll."""
    log = EventLog()
    launch(train_gpt, 2, "fsdp", 60, "tiny", 4, monitor=log)
    assert log.updates >= 2
    assert sum(e["type"] == "step" for e in log.events) == 2 * 60


def test_recorder_files_can_be_loaded_afterwards(tmp_path, monkeypatch):
    """The torchrun path: ranks write JSONL into FSDP_MINI_EVENTS_DIR; load or tail it."""
    results = launch(train_gpt, 2, "zero2", 2, "tiny", 4, env={"FSDP_MINI_EVENTS_DIR": tmp_path})
    events = load_events(str(tmp_path))
    assert {e["rank"] for e in events} == {0, 1}
    assert sum(e["sent_bytes"] for e in events if e["type"] == "collective"
               and e["rank"] == 0) == pytest.approx(results[0]["sent_bytes"])
    assert len(load_events(str(tmp_path / "events_rank1.jsonl"))) == sum(
        e["rank"] == 1 for e in events)


def test_tail_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "events_rank0.jsonl"
    path.write_text('{"type": "step", "rank": 0}\n{"type": "me')
    tail = EventTail(str(tmp_path))
    assert tail.read() == [{"type": "step", "rank": 0}]
    with open(path, "a") as f:
        f.write('mory", "rank": 0}\n')
    assert tail.read() == [{"type": "memory", "rank": 0}]
    assert tail.read() == []


def test_recorder_without_a_folder_keeps_events_in_memory():
    from helpers import record_one_tiny_step
    rec = Recorder(run="single")
    record_one_tiny_step(rec)
    assert [e["type"] for e in rec.events][0] == "meta"
    assert rec.events[-1]["type"] == "end"


def test_mismatched_collectives_fail_fast_with_both_sides_named(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch(workers.skip_a_unit, 2, True, str(tmp_path), timeout=60)
    # from the moment the ranks start the forward pass to the error in our hands
    elapsed = time.time() - min(float(p.read_text()) for p in tmp_path.glob("forward*"))
    text = str(info.value)
    assert "collective mismatch at step 0" in text
    assert "rank 0 issues all_gather 'blocks.0/forward'" in text
    assert "rank 1 issues all_gather 'blocks.1/forward'" in text
    assert info.value.exc_type.endswith("CollectiveMismatchError")
    assert elapsed < 10, f"took {elapsed:.1f} s"


def test_a_monitor_gets_every_event_even_when_it_never_polled():
    """The last events are read before the launch folder is removed (a slow caller, say)."""
    log = EventLog()
    log.poll_seconds = 1e12  # never reads while the job runs: only at the end
    launch(train_gpt, 2, "ddp", 2, "tiny", 4, monitor=log)
    assert sorted(e["rank"] for e in log.events if e["type"] == "end") == [0, 1]
    assert len([e for e in log.events if e["type"] == "step"]) == 4


def test_asynchronous_collectives_overlap_compute_on_the_timeline():
    """A reduce-scatter runs while the next unit's backward computes: its wait comes later than
    its issue, and the timeline's compute lane overlaps it (compute = the step less the waits)."""
    from fsdp_mini.plots import compute_and_comm
    from fsdp_mini.telemetry import Runs
    log = EventLog()
    launch(train_gpt, 2, "fsdp", 3, "tiny", 4, monitor=log)
    runs = Runs()
    runs.add(log.events)
    run = runs.runs["fsdp"]
    step = run.last_step()
    scatters = [ev for ev in run.rank(0).collectives[step] if ev["op"] == "reduce_scatter"]
    assert any(ev["waited"] > ev["start"] for ev in scatters), scatters
    assert all(ev["waited"] == ev["start"] for ev in run.rank(0).collectives[step]
               if ev["op"] == "all_gather")  # blocking: the rank waited from the issue on
    start, end, compute, comm = compute_and_comm(run, 0, step)
    overlap = sum(max(0.0, min(e, ce) - max(s, cs)) for s, e, op, _ in comm
                  if op == "reduce_scatter" for cs, ce in compute)
    assert overlap > 0, (compute, comm)


def test_the_model_state_on_the_dashboard_is_sampled_after_the_whole_step():
    """zero1 frees its reduce-scattered gradient shard after torch's step: sampling in torch's
    post-step hook read 4Ψ/N too much. The state shown must be the formula's (AdamW's step
    counters, a few bytes per parameter tensor, are all the formula leaves out)."""
    from fsdp_mini.telemetry import Runs
    log = EventLog()
    launch(train_gpt, 2, "zero1", 2, "tiny", 4, monitor=log)
    runs = Runs()
    runs.add(log.events)
    run = runs.runs["zero1"]
    for r in run.rank_ids():
        extra = run.persistent(r) - run.theory_persistent()
        assert 0 <= extra < 1024, (r, extra)
