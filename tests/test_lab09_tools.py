"""The kit's debug tools that lab 09 uses (fsdp_mini/debug/: cluster_tools.py, flight_recorder.py,
stacks.py, watch.py), each on 2 gloo ranks with short timeouts: DETAIL names a mismatch and costs
time, the flight recorder's dumps say which rank left the step, the stack of every rank of a hung
job is taken while it hangs, and a watched function that hangs names each rank and where it
waited. No process is left behind."""

import os
import pickle
import time

import pytest
import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini import debug as labs   # Note: the tools the lab calls labs.* are the kit's own
from fsdp_mini.debug import cluster_tools, flight_recorder, stacks, watch


def returns_rank_and_env(rank, world_size, name):
    return rank, os.environ.get(name)


def one_extra_all_reduce(rank, world_size):
    """Rank 0 all-reduces once more than the others: the next all-reduce of the others pairs
    with its extra one (same op, same size: nothing noticed), and the barrier then hangs."""
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    if rank == 0:
        dist.all_reduce(tensor)    # the extra one
    dist.all_reduce(tensor)
    dist.barrier()
    return "done"


def rank_1_gives_up_outside_collectives(rank, world_size):
    """Rank 1 stops (an exception in its own code) while rank 0 waits in the next all-reduce."""
    dist.all_reduce(torch.ones(2))
    if rank == 1:
        time.sleep(0.5)
        raise RuntimeError("the data loader gave up")
    dist.all_reduce(torch.ones(2))
    return "done"


def waits_in_a_collective(rank, world_size):
    """Rank 1 sleeps (in Python) while rank 0 waits in an all-reduce for it."""
    if rank == 1:
        time.sleep(30)
    dist.all_reduce(torch.ones(2))
    return "done"


# ---------------------------------------------------------------- run_job and DETAIL
def test_run_job_passes_the_env_and_keeps_the_logs():
    job = labs.run_job(returns_rank_and_env, 2, "FSDP_MINI_LAB09", env={"FSDP_MINI_LAB09": "on"},
                       keep_logs=True)
    assert job.error is None and job.results == [(0, "on"), (1, "on")]
    assert sorted(job.logs) == [0, 1] and job.seconds > 0


def test_run_job_refuses_an_env_that_is_not_strings():
    with pytest.raises(TypeError, match="env must map names to strings"):
        labs.run_job(returns_rank_and_env, 2, "X", env={"X": 1})


def test_detail_names_both_shapes_of_a_mismatched_all_reduce():
    job = labs.run_job(labs.mismatched_all_reduce, 2, env=labs.DETAIL_ENV, timeout=5)
    assert job.results is None
    assert "Detected mismatch between collectives" in job.error.message
    assert "TensorShape=[4]" in job.error.message and "TensorShape=[3]" in job.error.message


def test_detail_wraps_the_group_and_costs_time():
    cost = labs.detail_overhead(2, steps=10)
    assert cost["off_backend"] == "ProcessGroupGloo"
    assert cost["detail_backend"] == "_ProcessGroupWrapper"
    assert cost["detail_s"] > cost["off_s"] > 0


def test_detail_overhead_refuses_too_few_steps():
    with pytest.raises(ValueError, match="at least 3"):
        labs.detail_overhead(2, steps=1)


def test_user_frame_skips_torch_and_the_package():
    torch_file = os.path.join(os.path.dirname(torch.__file__), "distributed", "x.py")
    package_file = os.path.join(cluster_tools._PACKAGE, "comm", "collectives.py")
    frames = [(torch_file, 1, "all_reduce"), (package_file, 2, "wait"), ("/home/me/train.py", 3, "train")]
    assert cluster_tools.user_frame(frames) == "train at /home/me/train.py:3"
    assert cluster_tools.user_frame(frames[:2]) == ""


# ---------------------------------------------------------------- the flight recorder
needs_recorder = pytest.mark.skipif(not flight_recorder.flight_recorder_on_gloo(),
                                    reason="this torch has no flight recorder dump for gloo")


@needs_recorder
def test_flight_recorder_dumps_say_which_rank_issued_an_extra_collective(tmp_path):
    job = labs.run_job(labs.recorded(one_extra_all_reduce, str(tmp_path)), 2,
                       env=labs.RECORDER_ENV, timeout=3, deadline=40)
    assert job.error is not None                              # it hung, and timed out
    dumps = labs.read_dumps(str(tmp_path))
    assert sorted(dumps) == [0, 1]
    assert all("" not in d["pg_config"] for d in dumps.values())   # the group is named
    split = labs.first_divergence(dumps)
    assert "the extra one" in split["by_rank"][0]["source"]
    assert "the extra one" not in split["by_rank"][1]["source"]
    assert split["by_rank"][0]["op"] == split["by_rank"][1]["op"]    # the same op, other lines
    assert split["one_ahead"] == [0]
    analysis = labs.analyse_flight_recorder(str(tmp_path))
    assert analysis.returncode == 0, analysis.text
    assert "has errors" in analysis.text                      # it found the later mismatch


@needs_recorder
def test_the_rank_that_stopped_outside_collectives_is_behind(tmp_path):
    job = labs.run_job(labs.recorded(rank_1_gives_up_outside_collectives, str(tmp_path)), 2,
                       env=labs.RECORDER_ENV, timeout=5, deadline=40)
    assert job.error.rank == 1 and "data loader" in job.error.message
    counts = labs.who_is_behind(labs.read_dumps(str(tmp_path)))
    assert counts["behind"] == [1]
    assert counts["last"][0]["seq"] == counts["last"][1]["seq"] + 1
    assert counts["last"][0]["op"].endswith("all_reduce")


def test_the_unnamed_gloo_group_gets_the_name_its_entries_give():
    dump = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
            "entries": [{"process_group": ("0", "default_pg")}]}
    named = flight_recorder._name_the_groups(dump)
    assert named["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}


def test_read_dumps_takes_only_rank_files(tmp_path):
    for name in ("rank_0", "rank_1", "rank_x", "notes"):
        (tmp_path / name).write_bytes(pickle.dumps({"name": name}))
    assert sorted(labs.read_dumps(str(tmp_path))) == [0, 1]


def test_the_recorder_refuses_bad_input(tmp_path):
    with pytest.raises(TypeError, match="the function the ranks run"):
        labs.recorded("train", str(tmp_path))
    with pytest.raises(ValueError, match="must exist"):
        labs.recorded(one_extra_all_reduce, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="at least 2 ranks"):
        labs.who_is_behind({0: {"entries": []}})
    with pytest.raises(ValueError, match="TORCH_FR_BUFFER_SIZE"):
        flight_recorder.last_collective({"entries": []})


# ---------------------------------------------------------------- stacks while it hangs
def test_stacks_are_taken_while_the_job_hangs_and_nothing_is_left():
    hung = labs.stacks_of_hung_job(waits_in_a_collective, 2, timeout=4, deadline=40,
                                   use_py_spy=False)
    assert sorted(hung.stacks) == [0, 1] and sorted(hung.pids) == [0, 1]
    waits = {r: labs.where_it_waits(labs.rank_thread(text)) for r, text in hung.stacks.items()}
    assert waits[0]["in"] == "all_reduce" and os.path.join("torch", "distributed") in waits[0]["at"]
    assert waits[1]["in"] == "waits_in_a_collective" and "time.sleep" in waits[1]["source"]
    assert hung.job.error is not None and hung.py_spy == {}
    time.sleep(0.5)  # Note: the launch has returned: its ranks are gone, none left behind
    assert not any(os.path.exists(f"/proc/{pid}") for pid in hung.pids.values())


def test_rank_thread_reads_the_thread_that_runs_the_rank():
    dump = ('Thread 0x00007f01 (most recent call first):\n'
            '  File "/x/threading.py", line 3 in run\n\n'
            'Current thread 0x00007f02 (most recent call first):\n'
            '  File "/x/torch/distributed/c10d.py", line 9 in all_reduce\n'
            '  File "/home/me/train.py", line 5 in train\n'
            '  File "/x/fsdp_mini/launcher/rank_entry.py", line 104 in main\n')
    frames = stacks.rank_thread(dump)
    assert frames[0] == ("/x/torch/distributed/c10d.py", 9, "all_reduce")
    assert stacks.where_it_waits(frames)["line"] == "train at /home/me/train.py:5"
    assert stacks.rank_thread("no dump here") == []


def test_py_spy_asked_for_but_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(stacks.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install py-spy"):
        labs.stacks_of_hung_job(waits_in_a_collective, 2, use_py_spy=True)


@pytest.mark.skipif(stacks.shutil.which("py-spy") is None, reason="py-spy is not installed")
def test_py_spy_dump_reads_a_sleeping_process_without_colours():
    import subprocess
    import sys
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\ndef napping():\n    time.sleep(30)\nnapping()"])
    try:
        time.sleep(1.0)
        text = stacks.py_spy_dump(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "napping" in text and "\x1b[" not in text


# ---------------------------------------------------------------- a watched function that hangs
def all_reduce_on_rank_0(rank, world_size):
    if rank == 0:
        dist.all_reduce(torch.ones(2))     # rank 1 never joins
    return rank


def watched(rank, world_size, fn):
    torch.set_num_threads(1)
    try:
        return watch.run_watched(fn, rank, world_size, patience=2.0)
    except watch.Hung as hung:
        return ("hung", hung.ranks, str(hung))
    except watch.PeerGone:
        return ("peer gone",)


def test_a_hang_names_the_rank_that_waits_where_and_the_one_that_returned():
    out = fsdp_mini.launch(watched, 2, all_reduce_on_rank_0, timeout=10, deadline=60)
    kind, late, said = out[1]
    assert kind == "hung" and late == [0]
    assert said.startswith("rank 0 waited in all_reduce, at `dist.all_reduce(torch.ones(2))")
    assert "(all_reduce_on_rank_0, line" in said and said.endswith("rank 1 had returned")
