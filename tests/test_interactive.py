"""Interactive multi-rank mode (fsdp_mini.labs.start_ranks): ranks alive across cells, %%px, and
no process left behind: after stop(), and when the kernel is killed while the ranks are still
starting, after they started, or after their engines were killed first; a %%px cell after a
rank died names it and says what to do."""

import os
import signal
import time

import pytest
import torch
from helpers import notebook_kernel

from fsdp_mini import labs
from fsdp_mini.launcher.keeper import alive, descendants

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except OSError:
        return ""


def _engines(pids) -> list[int]:
    return [p for p in pids if "ipyparallel.engine" in _cmdline(p)]


def _gone_within(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
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
        tree = [ranks.keeper_pid] + descendants(ranks.keeper_pid)
        assert set(ranks.pids) <= set(tree) and len(tree) >= 6  # controller, engines, nannies
    finally:
        ranks.stop()
    assert not _gone_within(tree, 5), "ranks or controller left after stop()"
    ranks.stop()  # twice is fine
    with pytest.raises(labs.RankDiedError, match=r"stopped; start new ones"):
        ranks.run(lambda rank, world_size: rank)


class Kernel:
    """A Jupyter kernel of this interpreter, driven cell by cell."""

    def __init__(self, tmp_path, monkeypatch):
        from jupyter_client import KernelManager
        self.km = KernelManager(kernel_name=notebook_kernel(tmp_path, monkeypatch))
        self.km.start_kernel(cwd=str(tmp_path))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.pid = self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 120) -> list[dict]:
        """Run a cell; its outputs (stream text and errors)."""
        msg_id = self.kc.execute(code)
        outputs = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                outputs.append({"text": content["text"]})
            elif kind == "error":
                outputs.append({"ename": content["ename"], "evalue": content["evalue"]})
            elif kind == "status" and content["execution_state"] == "idle":
                return outputs

    def start(self, code: str) -> None:
        """Send a cell and return at once."""
        self.kc.execute(code)

    def tree(self) -> list[int]:
        return descendants(self.pid)

    def close(self) -> None:
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)
        self.km.cleanup_resources()
        self.km.context.destroy(linger=0)  # Note: else collecting it waits on the dead kernel


START = f"import sys; sys.path.insert(0, {REPO!r})\nfrom fsdp_mini import labs\n" \
        f"ranks = labs.start_ranks(2)"


@pytest.mark.slow
def test_px_cells_then_a_dead_rank_is_named_and_a_killed_kernel_leaves_no_process(tmp_path,
                                                                              monkeypatch):
    kernel = Kernel(tmp_path, monkeypatch)
    try:
        assert "2 ranks ready" in "".join(o.get("text", "") for o in kernel.run(START))
        out = kernel.run("%%px\nx = torch.full((2,), float(rank))\ndist.all_reduce(x)")
        assert not [o for o in out if "ename" in o], out
        out = kernel.run("print([t.tolist() for t in ranks.pull('x')], ranks.pids)")
        text = "".join(o.get("text", "") for o in out)
        assert text.startswith("[[1.0, 1.0], [1.0, 1.0]]"), text
        tree = kernel.tree()
        pids = [int(p) for p in text.split("]] [", 1)[1].strip(" ]\n").split(",")]
        os.kill(pids[1], signal.SIGKILL)  # rank 1's engine dies
        _gone_within(pids[1:], 5)
        out = kernel.run("%%px\ny = x + 1")
        message = "".join(o.get("text", "") for o in out)  # Note: IPython prints a UsageError
        assert message.startswith("UsageError: ") and message.count("\n") == 1, out
        assert f"rank 1 (pid {pids[1]}) has died" in message and \
            "ranks.stop(); ranks = labs.start_ranks(2)" in message, message
        os.kill(pids[0], signal.SIGKILL)  # the other engine too, and then the kernel
        _gone_within(pids, 5)
        os.kill(kernel.pid, signal.SIGKILL)  # the notebook never reaches ranks.stop()
        left = _gone_within(tree, 5)
    finally:
        kernel.close()
    assert not left, f"left after the engines and then the kernel were killed: " \
                     f"{[(p, _cmdline(p)[:60]) for p in left]}"


@pytest.mark.slow
def test_a_kernel_killed_while_its_ranks_are_starting_leaves_no_process(tmp_path, monkeypatch):
    kernel = Kernel(tmp_path, monkeypatch)
    try:
        kernel.start(START)
        seen, deadline = set(), time.monotonic() + 60
        while len(_engines(seen)) < 2 and time.monotonic() < deadline:
            seen |= set(kernel.tree())  # the keeper, the controller, the engines appear
            time.sleep(0.05)
        assert len(_engines(seen)) == 2, "the engines never started"
        seen |= set(kernel.tree())
        os.kill(kernel.pid, signal.SIGKILL)  # start_ranks has not returned yet
        start = time.monotonic()
        left = _gone_within(seen, 5)
        took = time.monotonic() - start
    finally:
        kernel.close()
    assert not left, f"left after the kernel was killed mid-start: " \
                     f"{[(p, _cmdline(p)[:60]) for p in left]}"
    print(f"\n{len(seen)} processes gone {took:.1f} s after the kernel was killed mid-start")
