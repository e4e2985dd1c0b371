"""Lab 02's checker passes the reference ring all-reduce and names each typical wrong one.

Every wrong ring below is what a learner writes; the test asserts the plain-word message the
checker gives for it. The checker launches 3 ranks and runs rings of 2 and 3 on them.
"""

import pytest
import torch

from fsdp_mini import labs
from fsdp_mini.labs import lab02

reference = labs.load_solution("02_ring_all_reduce", "ring_all_reduce")


@pytest.fixture(autouse=True)
def not_ci(monkeypatch):
    """Outside CI a failed check returns its result (in CI it raises, failing the notebook)."""
    monkeypatch.setenv("CI", "")


def naive_all_to_all(tensor, rank, world_size, send, recv):
    """Sends the whole tensor to every other rank: right sums, (N-1) x P bytes."""
    total = tensor.clone()
    for step in range(1, world_size):
        request = send(tensor, (rank + step) % world_size)
        incoming = torch.empty_like(tensor)
        recv(incoming, (rank - step) % world_size)
        request.wait()
        total += incoming
    tensor.copy_(total)


def no_all_gather(tensor, rank, world_size, send, recv):
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], (rank + 1) % n)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, (rank - 1) % n)
        request.wait()
        chunks[inc].add_(incoming)


def off_by_one(tensor, rank, world_size, send, recv):
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step) % n  # receives into the chunk it sent
        request = send(chunks[out].clone(), (rank + 1) % n)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, (rank - 1) % n)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], (rank + 1) % n)
        recv(chunks[inc], (rank - 1) % n)
        request.wait()


def floor_division_chunks(tensor, rank, world_size, send, recv):
    """Chunks of size // N: the last elements of a size not divisible by N are never summed."""
    n = world_size
    chunks = tensor.view(-1).split(tensor.numel() // n)[:n]
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], (rank + 1) % n)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, (rank - 1) % n)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], (rank + 1) % n)
        recv(chunks[inc], (rank - 1) % n)
        request.wait()


def averaging(tensor, rank, world_size, send, recv):
    reference(tensor, rank, world_size, send, recv)
    tensor /= world_size


def no_modulo(tensor, rank, world_size, send, recv):
    send(tensor, (rank + 1) % world_size)
    recv(tensor, rank - 1)  # rank 0 has no rank -1


def stub(tensor, rank, world_size, send, recv):
    ...


def _text(result):
    return "\n".join(msg + " " + hint for _ok, msg, hint in result.lines)


# Note: one launch judges many rings (each alone, exactly as check_ring_all_reduce does), so the
# file stays quick: a launch costs seconds of process start-up on 2 cores.
WRONG = {
    naive_all_to_all: (None, "did you send the whole tensor to every other rank"),
    no_all_gather: ("only one chunk per rank holds the full sum", "all-gather phase is missing"),
    off_by_one: ("wrong sums on rank(s)", "check the chunk indices"),
    floor_division_chunks: ("right when the size divides by N, wrong for 13 elements", None),
    averaging: ("every rank holds the mean, not the sum", None),
}


@pytest.fixture(scope="module")
def judged():
    fns = [reference, *WRONG, stub]
    return dict(zip(fns, lab02._check_rings(fns)))


def test_reference_passes_on_2_and_3_ranks_with_a_size_not_divisible_by_n(judged):
    result = judged[reference]
    assert result.passed, result
    assert result.facts["sent_bytes"][(3, 12)] == [64, 64, 64]  # 2(3-1)/3 x 48 B
    assert result.facts["sent_bytes"][(2, 12)] == [48, 48]      # 2(2-1)/2 x 48 B


@pytest.mark.parametrize("fn", list(WRONG), ids=lambda f: f.__name__)
def test_typical_mistakes_are_named(judged, fn):
    result, (sums, bytes_) = judged[fn], WRONG[fn]
    assert not result.passed, result
    text = _text(result)
    for expected in (sums, bytes_):
        assert expected is None or expected in text, text
    assert "Traceback" not in text


def test_off_by_one_also_names_a_send_recv_size_mismatch(judged):
    assert "a send and its recv differ in size" in _text(judged[off_by_one])


def test_an_exception_in_a_rank_is_one_line_and_a_stub_is_not_written_yet(judged):
    result = labs.check_ring_all_reduce(no_modulo)
    text = _text(result)
    assert not result.passed and len(result.lines) == 1, text
    assert "your code raised on rank" in text and "Traceback" not in text, text
    assert "rank 0: [2 ranks, 12 elements] ValueError: recv from rank -1 from rank 0" in text, text
    assert "not written yet" in _text(judged[stub]) and not judged[stub].passed


def test_the_checker_fails_the_notebook_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(labs.CheckFailed, match="not written yet"):
        labs.check_ring_all_reduce(stub)


def test_bandwidth_summary_finds_the_latency_floor_and_half_bandwidth_size():
    rows = [{"bytes": b, "seconds": 1e-4 + b / 1e9} for b in (4, 4096, 2**20, 2**24)]
    for r in rows:
        r["busbw"] = r["bytes"] / r["seconds"]
    s = labs.bandwidth_summary(rows)
    assert s["latency_floor"] == pytest.approx(1e-4 + 4e-9)
    assert s["n_half"] == 2**20  # 2**20 B reaches 0.91 GB/s, half of the peak (0.99 GB/s)
    labs.plot_bandwidth(rows, {"one block": 2**18})


def test_show_collective_prints_one_row_per_rank(capsys):
    labs.show_collective("all-reduce", [torch.tensor([1.0]), torch.tensor([2.0])],
                         [torch.tensor([3.0]), torch.tensor([3.0])])
    assert capsys.readouterr().out.splitlines() == [
        "all-reduce", "  rank  before  after", "  0     [1]     [3]", "  1     [2]     [3]"]
