"""How launch stops ranks and explains what went wrong (fsdp_mini/launch_*.py).

timeout vs deadline vs a rank that is still working; Ctrl-C pressed twice; errors that only look
like consequences; a rank that returns while its peers are in a collective; two launches sharing
one log_dir; logs with enormous lines. Every test checks that no process is left behind.
"""
import _thread
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed
from test_launch import LOCK_NAME, no_leftover_processes, workers  # noqa: F401  (autouse fixture)

from fsdp_mini.launcher import LaunchError, LaunchTimeoutError, launch

TORCH_DIST = os.path.dirname(torch.distributed.__file__)


def _line_of(fn, marker):
    """Line number in fn's file of the line of fn's source that contains marker."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


# ---------------------------------------------------------------- timeout, deadline, working ranks
@pytest.mark.slow
def test_rank_working_after_its_peers_returned_is_left_alone(tmp_path):
    """Rank 1 computes for 2.5 x timeout after rank 0 returned: it uses CPU, so it is not stuck."""
    start = time.monotonic()
    results = launch(workers.busy_after_peers, 2, 2.5, timeout=1, log_dir=tmp_path)
    assert results[0] == 0 and results[1] > 0
    assert time.monotonic() - start >= 2.5


@pytest.mark.slow
def test_deadline_stops_ranks_that_never_end(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch(workers.busy_forever, 2, timeout=1, deadline=4, log_dir=tmp_path)
    assert 4 <= time.monotonic() - start < 4 + 5
    text = str(info.value)
    assert text.startswith("the job passed its deadline of 4 s; ranks still running: 0, 1"), text
    # Each rank's Python stack, dumped when stopped. Note: on a heavily loaded machine a rank may
    # still be importing torch at the deadline; only ranks that reached the loop are in it.
    started = [r for r in range(2) if "in the loop now" in (tmp_path / f"rank{r}.log").read_text()]
    assert text.count("in busy_forever") >= len(started), text
    if 1 in started:
        assert "Python stack of rank 1 when stopped" in text


def test_second_ctrl_c_while_stopping_still_kills_ranks_that_ignore_sigterm(tmp_path):
    """Ranks ignore SIGTERM; Ctrl-C twice: the second skips the grace, ranks are killed and reaped."""
    ready = tmp_path / "ready"
    ready.mkdir()
    second_at = []

    def interrupt_twice():
        until = time.monotonic() + 60
        while len(list(ready.glob("*.ready"))) < 2 and time.monotonic() < until:
            time.sleep(0.05)  # only once both ranks ignore SIGTERM, or the test proves nothing
        _thread.interrupt_main()
        time.sleep(0.2)  # now launch waits for the ranks to take SIGTERM, which they ignore
        second_at.append(time.monotonic())
        _thread.interrupt_main()

    thread = threading.Thread(target=interrupt_twice, daemon=True)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        launch(workers.ignore_sigterm_and_sleep, 2, str(ready), log_dir=tmp_path / "logs")
    thread.join(10)
    assert second_at and time.monotonic() - second_at[0] < 3.0
    assert not (tmp_path / "logs" / LOCK_NAME).exists()
    # no_leftover_processes: the ranks that ignored SIGTERM are gone too


# ---------------------------------------------------------------- errors that only look alike
def test_own_error_saying_timed_out_is_the_cause(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch(workers.raise_timed_out_on, 2, 1, timeout=30, log_dir=tmp_path)
    err = info.value
    assert not isinstance(err, LaunchTimeoutError)
    assert (err.rank, err.exc_type, err.message) == (1, "RuntimeError", "request timed out")
    text = str(err)
    assert text.startswith("rank 1 failed first: RuntimeError: request timed out"), text
    assert "rank 0: RuntimeError (lost its peer: a consequence)" in text


def _error(message, frames, type_="RuntimeError"):
    return {"rank": 0, "kind": "error", "type": type_, "message": message, "frames": frames,
            "traceback": "", "time": 0.0}


def test_consequences_are_told_by_origin_not_by_words():
    from fsdp_mini.launcher.failures import is_secondary
    user = ("/home/me/lab.py", 7, "train")
    in_torch = (os.path.join(TORCH_DIST, "distributed_c10d.py"), 3252, "all_reduce")
    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms"
    assert is_secondary(_error("Timed out waiting 3000ms for recv operation", [user, in_torch]))
    assert is_secondary(_error(gloo, [user]))  # an async work.wait() called from user code
    assert is_secondary(_error("anything", [user], "torch.distributed.DistBackendError"))
    assert not is_secondary(_error("request timed out", [user]))
    assert not is_secondary(_error("connection reset by peer", [user]))  # the user's own socket
    assert not is_secondary(_error("bad shape", [user, in_torch]))  # torch, but not a lost peer


def test_rank_returning_while_a_peer_is_in_a_collective(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch(workers.one_extra_all_reduce_on, 2, 1, timeout=30, log_dir=tmp_path)
    err = info.value
    assert not isinstance(err, LaunchTimeoutError) and err.rank == 1
    line = _line_of(workers.one_extra_all_reduce_on, "# the extra one")
    text = str(err)
    assert text.startswith(
        f"rank 0 returned while rank 1 was still in a collective (all_reduce at {workers.__file__}:"
        f"{line} in one_extra_all_reduce_on); every rank must issue the same collectives in the "
        "same order: one rank ran fewer steps, or called a collective (e.g. full_state_dict) that "
        "the others did not"), text
    assert err.message == text.splitlines()[0]


def test_collective_site_names_the_collective_the_api_and_the_users_line():
    from fsdp_mini.launcher.failures import collective_site
    package = os.path.dirname(os.path.abspath(sys.modules["fsdp_mini"].__file__))
    frames = [("/home/me/lab.py", 12, "train"),
              (os.path.join(package, "api.py"), 50, "full_state_dict"),
              (os.path.join(package, "comm", "collectives.py"), 99, "all_gather"),
              (os.path.join(TORCH_DIST, "c10d_logger.py"), 83, "wrapper"),
              (os.path.join(TORCH_DIST, "distributed_c10d.py"), 4000, "all_gather_into_tensor")]
    assert (collective_site(frames)
            == "all_gather_into_tensor via full_state_dict at /home/me/lab.py:12 in train")
    assert collective_site(frames[:1] + frames[3:]) == "all_gather_into_tensor at /home/me/lab.py:12 in train"
    # a `with summon_full_params(model):` enters through contextlib: still the user's line
    import contextlib
    entered = [frames[0], (contextlib.__file__, 137, "__enter__"),
               (os.path.join(package, "api.py"), 133, "summon_full_params"), *frames[2:]]
    assert (collective_site(entered)
            == "all_gather_into_tensor via summon_full_params at /home/me/lab.py:12 in train")


def test_rank_blocked_in_a_collective_after_its_peers_returned_is_explained(tmp_path):
    """As under NCCL: the rank does not fail, it waits; its stack dump shows the collective."""
    from fsdp_mini.launcher.failures import failure_error
    (tmp_path / "rank1.log").write_text(
        "Current thread 0x00007f00 (most recent call first):\n"
        f'  File "{os.path.join(TORCH_DIST, "distributed_c10d.py")}", line 3252 in barrier\n'
        '  File "/home/me/lab.py", line 9 in train\n')
    outcomes = [{"rank": 0, "kind": "ok", "time": 1.0, "traceback": "", "frames": []},
                {"rank": 1, "kind": "running", "time": float("inf"), "type": "StillRunning",
                 "message": "rank 1 was still running", "traceback": "",
                 "frames": [("/home/me/lab.py", 9, "train"),
                            (os.path.join(TORCH_DIST, "distributed_c10d.py"), 3252, "barrier")]}]
    err = failure_error(outcomes, str(tmp_path), 3.0, why="blocked", blocked=[1])
    assert isinstance(err, LaunchTimeoutError) and err.rank == 1
    assert str(err).startswith("rank 0 returned while rank 1 was still in a collective (barrier at "
                               "/home/me/lab.py:9 in train); every rank must issue the same")
    assert "rank 1 was stopped after using no CPU for 3 s there" in str(err)


# ---------------------------------------------------------------- one log_dir, one launch at a time
@pytest.mark.slow
def test_two_launches_sharing_a_log_dir_at_once(tmp_path):
    first = {}
    thread = threading.Thread(target=lambda: first.update(
        results=launch(workers.sleep_then_return, 2, 1.0, timeout=30, log_dir=tmp_path)))
    thread.start()
    try:
        until = time.monotonic() + 30
        while not (tmp_path / "rank1.log").exists() and time.monotonic() < until:
            time.sleep(0.05)  # its ranks have started: it holds the log_dir
        start = time.monotonic()
        with pytest.raises(ValueError, match=re.escape(
                f"log_dir {tmp_path} is in use by another launch (pid {os.getpid()}) (this very "
                "process: another thread or notebook cell)") + ".*use another log_dir"):
            launch(workers.read_env, 2, "HOME", log_dir=tmp_path)
        assert time.monotonic() - start < 1.0
    finally:
        thread.join(60)
    assert first["results"] == [0, 1]  # the first launch's files were left alone
    assert not (tmp_path / LOCK_NAME).exists()
    assert launch(workers.sleep_then_return, 1, 0.0, log_dir=tmp_path) == [0]  # reuse in turn works


def test_lock_left_by_a_dead_launch_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(json.dumps(  # as if its launch had been SIGKILLed
        {"mark": "fsdp_mini lock", "pid": dead.pid, "purpose": "launch"}) + "\n")
    assert launch(workers.sleep_then_return, 1, 0.0, log_dir=tmp_path) == [0]
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.parametrize("text", ["4242\n", ""])
def test_a_users_file_named_like_the_lock_is_refused_and_kept(tmp_path, text):
    (tmp_path / LOCK_NAME).write_text(text)
    with pytest.raises(ValueError, match=re.escape(
            f"log_dir {tmp_path} holds a file {LOCK_NAME} that is not a lock of fsdp_mini; move "
            "it elsewhere, or use another log_dir")):
        launch(workers.sleep_then_return, 1, 0.0, log_dir=tmp_path)
    assert (tmp_path / LOCK_NAME).read_text() == text and os.listdir(tmp_path) == [LOCK_NAME]


# ---------------------------------------------------------------- enormous output
def test_huge_log_line_and_message_are_capped(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch(workers.huge_line_then_raise, 1, 5_000_000, 1_000_000, timeout=30, log_dir=tmp_path)
    err = info.value
    text = str(err)
    assert len(text) < 20_000, len(text)
    log = tmp_path / "rank0.log"
    assert re.search(rf"xxx … \(5\.0 MB more in {re.escape(str(log))}\)", text)  # clipped, and where
    assert re.search(r"yyy … \(998\.0 KB more\)$", text.splitlines()[0])  # the message, clipped
    assert err.exc_type == "ValueError" and len(err.message) == 1_000_000  # the attribute is whole
