"""Lab 02's checker passes the reference ring all-reduce; more on some of its verdicts.

The wrong rings a learner writes, each with the words its verdict must contain, are in
tests/wrong_answers/lab02.py. The checker launches 3 ranks and runs rings of 2 and 3 on them.
"""

import statistics
import tempfile

import pytest
import torch
from wrong_answers.lab02 import (adds_in_all_gather, never_waits, no_all_gather, no_modulo,
                                 off_by_one, rank_0_never_sends, reference)

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs.lab02 import checks as lab02


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    """Outside CI a failed check returns its result (in CI it raises, failing the notebook)."""
    monkeypatch.setenv("CI", "")


def stub(tensor, rank, world_size, send, recv):
    ...


def _text(result):
    return "\n".join(msg + " " + hint for _ok, msg, hint in result.lines)


NEVER_WAITED = ("rank 0 never called .wait() on 2 of the 2 requests its sends returned "
                "(12 elements on 2 ranks)")

# Note: the wrong rings and the words their verdicts must contain are in
# tests/wrong_answers/lab02.py (run by tests/test_wrong_answers.py); the tests below check more of
# a few of them: one launch judges them all (each alone, exactly as check_ring_all_reduce does).
@pytest.fixture(scope="module")
def judged():
    fns = [reference, off_by_one, no_all_gather, adds_in_all_gather, never_waits, stub]
    return dict(zip(fns, lab02._check_rings(fns)))


def test_reference_passes_on_2_and_3_ranks_with_a_size_not_divisible_by_n(judged):
    result = judged[reference]
    assert result.passed, result
    assert result.facts["sent_bytes"][(3, 12)] == [64, 64, 64]  # 2(3-1)/3 x 48 B
    assert result.facts["sent_bytes"][(2, 12)] == [48, 48]      # 2(2-1)/2 x 48 B


def test_off_by_one_also_names_a_send_recv_size_mismatch(judged):
    assert "a send and its recv differ in size" in _text(judged[off_by_one])


def test_each_phase_mistake_gets_its_own_diagnosis(judged):
    """A missing all-gather phase and one that adds are told apart, each with its own advice."""
    missing, adds = _text(judged[no_all_gather]), _text(judged[adds_in_all_gather])
    assert "add the all-gather phase" in missing and "do not add it" not in missing
    assert "do not add it" in adds and "add the all-gather phase" not in adds
    assert "reduce-scatter phase leaves it" not in adds
    ok = [msg for good, msg, _ in judged[adds_in_all_gather].lines if good]
    assert any("waited for each of its sends" in m for m in ok)  # its bytes and waits are right
    assert any("2(N-1)/N x the payload" in m for m in ok)


def test_a_missing_wait_is_the_only_thing_wrong_with_never_waits(judged):
    result = judged[never_waits]
    assert [msg for good, msg, _ in result.lines if not good] == [NEVER_WAITED]


def test_an_exception_in_a_rank_is_one_line_and_a_stub_is_not_written_yet(judged, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where launch makes its folder
    result = labs.check_ring_all_reduce(no_modulo)
    text = _text(result)
    assert not list(tmp_path.iterdir()), "the checker left the failed launch's folder behind"
    assert not result.passed and len(result.lines) == 1, text
    assert "your code raised on rank" in text and "Traceback" not in text, text
    assert "rank 0: [2 ranks, 12 elements] ValueError: recv from rank -1 from rank 0" in text, text
    assert "not written yet" in _text(judged[stub]) and not judged[stub].passed


def test_a_hang_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = labs.check_ring_all_reduce(rank_0_never_sends, world_sizes=(2,), sizes=(12,),
                                        timeout=3)
    text = _text(result)
    assert not result.passed and len(result.lines) == 1, text
    assert "the ranks did not finish" in text and "never came" in text, text
    assert "every send to rank r+1 meet a recv from rank r-1" in text, text
    assert not list(tmp_path.iterdir()), "the checker left the failed launch's folder behind"


def test_the_checker_fails_the_notebook_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(labs.CheckFailed, match="not written yet"):
        labs.check_ring_all_reduce(stub)


def _rows(seconds_by_bytes):
    return [{"bytes": b, "seconds": t, "busbw": b / t} for b, t in seconds_by_bytes.items()]


def test_bandwidth_summary_finds_the_latency_floor_and_half_bandwidth_size():
    rows = _rows({b: 1e-4 + b / 1e9 for b in (4, 4096, 2**20, 2**24)})
    s = labs.bandwidth_summary(rows)
    assert s["latency_floor"] == pytest.approx(1e-4 + 4e-9)  # the only size up to 1 KiB
    assert s["n_half"] == 2**20  # 2**20 B reaches 0.91 GB/s, half of the peak (0.99 GB/s)
    labs.plot_bandwidth(rows, {"one block": 2**18})


def test_one_slow_small_message_does_not_move_the_latency_floor():
    """On a loaded laptop one run took 3.4 ms for 4 B while 16 B to 1 KiB took ~2 ms."""
    small = {4: 3.4e-3, 16: 1.9e-3, 64: 2.1e-3, 256: 1.8e-3, 1024: 2.0e-3}
    s = labs.bandwidth_summary(_rows({**small, 2**16: 3e-3, 2**22: 40e-3}))
    assert s["latency_floor"] == statistics.median(small.values()) == 2.0e-3
    assert s["small_sizes"] == 5 and s["small_spread"] == pytest.approx(3.4 / 1.8)


def test_the_sweep_times_every_size_on_every_rank():
    rows = fsdp_mini.launch(labs.all_reduce_sweep, 2, [4, 1024, 2**16], 3, backend="gloo")
    assert rows[0] == rows[1]  # the slowest rank's round times, the same table on every rank
    assert [r["bytes"] for r in rows[0]] == [4, 1024, 2**16]
    assert all(r["seconds"] > 0 and r["busbw"] == pytest.approx(r["algbw"]) for r in rows[0])


def test_show_collective_prints_one_row_per_rank(capsys):
    labs.show_collective("all-reduce", [torch.tensor([1.0]), torch.tensor([2.0])],
                         [torch.tensor([3.0]), torch.tensor([3.0])])
    assert capsys.readouterr().out.splitlines() == [
        "all-reduce", "  rank  before  after", "  0     [1]     [3]", "  1     [2]     [3]"]
