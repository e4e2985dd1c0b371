"""The communication layer: correct results, and exact logical bytes in the ledger."""

import pytest
import torch
import workers

from fsdp_mini import launch
from fsdp_mini.comm.collectives import Comm, Ledger


def test_collectives_and_their_bytes_at_world_size_3():
    n = 3
    results = launch(workers.collectives, n)
    for rank, res in enumerate(results):
        assert torch.equal(res["gathered"], torch.arange(n).repeat_interleave(5).float())
        expected_mine = n * torch.arange(5.0 * n)[rank * 5:(rank + 1) * 5]
        assert torch.equal(res["mine"], expected_mine)
        assert torch.equal(res["summed"], torch.full((7,), float(sum(range(1, n + 1)))))
        assert torch.equal(res["broadcast"], torch.full((3,), float(n - 1)))
        assert res["records"] == [
            ("all_gather", "ag", 60, 40, True),          # (N-1) x shard bytes
            ("reduce_scatter", "rs", 60, 40, True),
            ("all_reduce", "ar", 28, 2 * 2 * 28 / 3, True),  # 2(N-1)/N x payload
            ("broadcast", "bc", 12, 2 * 12 / 3, True),       # (N-1)/N x payload
            ("barrier", "barrier", 0, 0, True),
        ]


def test_single_process_collectives_are_local_copies():
    comm = Comm()
    assert (comm.rank, comm.world_size) == (0, 1)
    out = torch.empty(4)
    comm.all_gather(out, torch.arange(4.0), label="x")
    assert torch.equal(out, torch.arange(4.0))
    comm.reduce_scatter(out, torch.ones(4), label="y")
    assert torch.equal(out, torch.ones(4))
    assert comm.ledger.sent_bytes() == 0
    assert [r.op for r in comm.ledger.records] == ["all_gather", "reduce_scatter"]


def test_ledger_totals_per_op_and_step():
    comm = Comm(ledger=Ledger())
    comm.ledger.next_step()
    comm.all_gather(torch.empty(8), torch.ones(8), label="a")
    comm.all_gather(torch.empty(8), torch.ones(8), label="b")
    comm.ledger.next_step()
    comm.all_reduce(torch.ones(2), label="c")
    totals = comm.ledger.totals(step=1)
    assert totals["all_gather"].calls == 2 and totals["all_gather"].payload_bytes == 64
    assert set(comm.ledger.totals()) == {"all_gather", "all_reduce"}
    assert comm.ledger.steps() == [1, 2]
    seen = []
    comm.ledger.subscribe(seen.append)
    comm.all_reduce(torch.ones(2), label="d")
    assert [r.label for r in seen] == ["d"]
    comm.ledger.reset()
    assert comm.ledger.records == []


def test_size_mismatch_is_explained():
    with pytest.raises(ValueError, match="pad the flat tensor to a multiple of the world size"):
        Comm().all_gather(torch.empty(5), torch.empty(4), label="x")
