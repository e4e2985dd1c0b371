"""Interactive multi-rank mode (fsdp_mini.labs.start_ranks): ranks alive across cells, %%px, and
no process left behind, also when the kernel is killed before the notebook stops them."""

import json
import os
import signal
import time

import pytest
import torch

from fsdp_mini import labs
from fsdp_mini.labs.interactive import _children as children
from helpers import notebook_kernel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (the controller leads one with its schedulers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _gone_within(pids, seconds: float, controller: int) -> list[int]:
    deadline = time.monotonic() + seconds
    while ((left := [p for p in pids if _alive(p)] + _group(controller))
           and time.monotonic() < deadline):
        time.sleep(0.2)
    return left


@pytest.mark.slow
def test_ranks_keep_state_between_calls_and_stop_cleanly():
    ranks = labs.Ranks(2, activate=False)  # no %%px outside a notebook
    try:
        ranks.execute("x = torch.full((3,), float(rank + 1)); dist.all_reduce(x)")
        assert [t.tolist() for t in ranks.pull("x")] == [[3.0] * 3, [3.0] * 3]
        ranks.push(scale=10)
        assert ranks.run(lambda rank, world_size, k: (rank, world_size, k), 7) == [(0, 2, 7),
                                                                                   (1, 2, 7)]
        ranks.execute("y = x * scale")  # the state of one call is there for the next
        assert torch.equal(ranks.pull("y")[1], torch.full((3,), 30.0))
        nannies = [c for p in ranks.pids for c in children(p)]
        assert nannies  # each engine runs a nanny process
        pids, controller = ranks.pids + nannies + [ranks._controller_pid], ranks._controller_pid
        assert len(_group(controller)) > 1  # the controller runs schedulers in its group
    finally:
        ranks.stop()
    assert not _gone_within(pids, 5, controller), "ranks or controller left after stop()"
    ranks.stop()  # twice is fine


CELLS = [
    f"import sys; sys.path.insert(0, {REPO!r})\nfrom fsdp_mini import labs\nranks = labs.start_ranks(2)",
    "%%px\nx = torch.full((2,), float(rank))\ndist.all_reduce(x)",
    "import json\nfrom fsdp_mini.labs.interactive import _children\n"
    "print(json.dumps({'x': [t.tolist() for t in ranks.pull('x')], 'pids': ranks.pids + "
    "[c for p in ranks.pids for c in _children(p)] + [ranks._controller_pid]}))",
]


@pytest.mark.slow
def test_px_cells_in_a_notebook_and_a_killed_kernel_leaves_no_process(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    name = notebook_kernel(tmp_path, monkeypatch)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = nbclient.NotebookClient(nb, kernel_name=name, timeout=120,
                                     resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
        kernel_pid = client.km.provisioner.process.pid
        out = json.loads("".join(o.get("text", "") for o in nb.cells[2].outputs))
        assert out["x"] == [[1.0, 1.0], [1.0, 1.0]]
        pids = out["pids"]
        assert all(_alive(p) for p in pids) and len(_group(pids[-1])) > 1
        os.kill(kernel_pid, signal.SIGKILL)  # the notebook never reaches ranks.stop()
        left = _gone_within(pids, 15, pids[-1])
    assert not left, f"processes left after the kernel was killed: {left}"
