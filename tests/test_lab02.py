"""Lab 02's checker passes the reference ring all-reduce and rings written otherwise; it names
the first message (or step's tensor) that differs; the kit's sweep and drawing that lab 02 uses.

The wrong rings a learner writes, each with the words its verdict must contain, are in
tests/wrong_answers/lab02.py (run by tests/test_wrong_answers.py).
"""

import statistics
import tempfile

import pytest
import torch
from wrong_answers.lab02 import RIGHT, never_waits, no_modulo, rank_0_never_sends, reference

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.comm.p2p import Messages
from fsdp_mini.labs.lab02 import checks as lab02
from fsdp_mini.plots import plot_bandwidth, show_collective
from fsdp_mini.telemetry import all_reduce_sweep, bandwidth_summary


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    """Outside CI a failed check returns its result (in CI it raises, failing the notebook)."""
    monkeypatch.setenv("CI", "")


def stub(tensor, rank, world_size, send, recv):
    ...


def _text(result):
    return "\n".join(msg + " " + hint for _ok, msg, hint in result.lines)


def test_the_reference_and_a_ring_written_otherwise_pass_on_every_configuration():
    ref, *others = lab02.JUDGES["02_ring_all_reduce"]([reference, *RIGHT])
    assert ref.passed and all(o.passed for o in others), [str(r) for r in (ref, *others)]
    configs = list(ref.facts["records"])
    assert len(configs) == 20 and {c["world_size"] for c in configs} == {1, 2, 3, 4}
    assert {c["dtype"] for c in configs} == {"float32", "bfloat16"}
    assert any(c["numel"] < c["world_size"] for c in configs)      # empty chunks
    assert configs[-6:] == lab02._configs((2, 3), lab02.RING_SIZES)[1]  # the lab's own, last


def test_sent_bytes_are_the_notebook_s_and_2_n_minus_1_over_n_of_the_tensor():
    result = labs.check_ring_all_reduce(reference)
    sent = result.facts["sent_bytes"]
    assert sorted(sent) == [(2, 12), (2, 13), (2, 12288), (3, 12), (3, 13), (3, 12288)]
    assert sent[(3, 12)] == [64, 64, 64]                        # 2(3-1)/3 x 48 B
    assert sent[(2, 12)] == [48, 48]                            # 2(2-1)/2 x 48 B
    assert sum(sent[(3, 13)]) / 3 == pytest.approx(2 * 2 / 3 * 52)  # uneven: on average


def test_each_message_is_written_down_with_its_step_peer_and_chunk():
    """What the reference's rank 1 sent and received on 3 ranks, 13 elements (chunks 5, 4, 4)."""
    records = labs.check_ring_all_reduce(reference, world_sizes=(3,), sizes=(13,)).facts["records"]
    record = next(mine for c, (mine, _) in records.items()
                  if c == {"world_size": 3, "numel": 13, "dtype": "float32"})
    at = [lab02._where(k, 3) for k in (1, 2, 3, 4)]
    assert [record.get("send part", rank=1, **w) for w in at] == [
        "chunk 1, elements 5-8", "chunk 0, elements 0-4", "chunk 2, elements 9-12",
        "chunk 1, elements 5-8"]
    assert [w["phase"] for w in at] == ["reduce-scatter"] * 2 + ["all-gather"] * 2
    assert {record.get("send peer", rank=1, **w) for w in at} == {"rank 2"}
    assert {record.get("recv peer", rank=1, **w) for w in at} == {"rank 0"}
    assert record.get("recv into", rank=1, **at[0]) == "5 elements"   # chunk 0 arrives


def test_a_missing_wait_is_named_at_its_first_message():
    result = lab02.JUDGES["02_ring_all_reduce"]([never_waits])[0]
    assert "at world size 2, numel 3, dtype 'float32': whether rank 0 waited for its send of " \
           "step 1 (reduce-scatter step 0): yours False, the reference True" in _text(result)


def test_an_exception_in_a_rank_is_one_line_and_a_stub_is_not_written_yet(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where launch makes its folder
    result = labs.check_ring_all_reduce(no_modulo)
    text = _text(result)
    assert not list(tmp_path.iterdir()), "the checker left the failed launch's folder behind"
    assert not result.passed and len(result.lines) == 1, text
    assert "your code raised ValueError: send to rank 0 from rank 0" in text and \
        "Traceback" not in text, text
    stubbed = labs.check_ring_all_reduce(stub)
    assert "not written yet" in _text(stubbed) and not stubbed.passed


def test_a_hang_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = labs.check_ring_all_reduce(rank_0_never_sends, world_sizes=(2,), sizes=(12,),
                                        timeout=5)
    text = _text(result)
    assert not result.passed and len(result.lines) == 1, text
    assert "at world size 2" in text and "the ranks hung" in text, text
    assert "every send to rank r+1 meet a recv from rank r-1" in text, text
    assert not list(tmp_path.iterdir()), "the checker left the failed launch's folder behind"


def test_the_checker_fails_the_notebook_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(labs.CheckFailed, match="not written yet"):
        labs.check_ring_all_reduce(stub)
    with pytest.raises(ValueError, match="world_sizes"):
        labs.check_ring_all_reduce(reference, world_sizes=(0,))


# -- the kit's point-to-point messages, sweep and drawing -----------------------------------------

def _names_parts(rank, world_size):
    x = torch.arange(10.0)
    msgs = Messages(x, x.tensor_split(3))
    return [msgs.part(t) for t in (x[4:7], x[4:7].clone(), x, x[1:3], torch.ones(3), x[10:])]


def test_a_message_is_named_by_where_it_lies_or_what_it_holds():
    assert fsdp_mini.launch(_names_parts, 1, backend="gloo")[0] == [
        "chunk 1, elements 4-6", "chunk 1, elements 4-6", "the whole tensor, elements 0-9",
        "elements 1-2", "a tensor of 3 elements, no chunk", "no elements"]


def _rows(seconds_by_bytes):
    return [{"bytes": b, "seconds": t, "busbw": b / t} for b, t in seconds_by_bytes.items()]


def test_bandwidth_summary_finds_the_latency_floor_and_half_bandwidth_size():
    rows = _rows({b: 1e-4 + b / 1e9 for b in (4, 4096, 2**20, 2**24)})
    s = bandwidth_summary(rows)
    assert s["latency_floor"] == pytest.approx(1e-4 + 4e-9)  # the only size up to 1 KiB
    assert s["n_half"] == 2**20  # 2**20 B reaches 0.91 GB/s, half of the peak (0.99 GB/s)
    plot_bandwidth(rows, {"one block": 2**18})


def test_one_slow_small_message_does_not_move_the_latency_floor():
    """On a loaded laptop one run took 3.4 ms for 4 B while 16 B to 1 KiB took ~2 ms."""
    small = {4: 3.4e-3, 16: 1.9e-3, 64: 2.1e-3, 256: 1.8e-3, 1024: 2.0e-3}
    s = bandwidth_summary(_rows({**small, 2**16: 3e-3, 2**22: 40e-3}))
    assert s["latency_floor"] == statistics.median(small.values()) == 2.0e-3
    assert s["small_sizes"] == 5 and s["small_spread"] == pytest.approx(3.4 / 1.8)


def test_the_sweep_times_every_size_on_every_rank():
    rows = fsdp_mini.launch(all_reduce_sweep, 2, [4, 1024, 2**16], 3, backend="gloo")
    assert rows[0] == rows[1]  # the slowest rank's round times, the same table on every rank
    assert [r["bytes"] for r in rows[0]] == [4, 1024, 2**16]
    assert all(r["seconds"] > 0 and r["busbw"] == pytest.approx(r["algbw"]) for r in rows[0])


def test_show_collective_prints_one_row_per_rank(capsys):
    show_collective("all-reduce", [torch.tensor([1.0]), torch.tensor([2.0])],
                    [torch.tensor([3.0]), torch.tensor([3.0])])
    assert capsys.readouterr().out.splitlines() == [
        "all-reduce", "  rank  before  after", "  0     [1]     [3]", "  1     [2]     [3]"]
