"""A save never destroys what it did not write, runs one at a time per folder, and moves no
random state: a folder of the user's, a file, a link, '.', '..' and a foreign lock are refused on
every rank before anything is written and left byte for byte as they were; a second job is
refused at once with the first named; a rank that cannot write makes every rank raise; nothing
in the kit draws from or moves torch's, Python's or NumPy's generators.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import checkpoint_workers as cw
import pytest
import torch
from workers import make_odd

import fsdp_mini
from fsdp_mini import CheckpointError, launch


def snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: kind, bytes and modification time."""
    return {str(p.relative_to(folder)): (p.is_dir(), p.read_bytes() if p.is_file() else None,
                                         p.lstat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def users_folder(where: Path) -> Path:
    mine = where / "mine"
    (mine / "data" / "deep").mkdir(parents=True)
    (mine / "notes.txt").write_text("three weeks of notes")
    (mine / "data" / "train.bin").write_bytes(os.urandom(1000))
    (mine / "data" / "deep" / "x").write_text("x")
    return mine


def saved_here(path: Path, seed: int = 0):
    model, optimizer = cw.build("fsdp", "adamw", seed=seed)
    cw.train_steps(model, optimizer, [0], 0, 1)
    fsdp_mini.save_checkpoint(model, optimizer, path)
    return model, optimizer


def assert_refused_on_every_rank(results, *phrases) -> None:
    for rank, (kind, message, seconds) in enumerate(results):
        assert kind == "CheckpointError", f"rank {rank}: {kind}: {message}"
        for phrase in phrases:
            assert phrase in message, f"rank {rank}: {phrase!r} not in {message!r}"
        assert seconds < 5, f"rank {rank} was refused only after {seconds:.1f} s"


# -- 1. a save destroys nothing it did not write -------------------------------------------------

def test_a_folder_of_the_users_is_refused_on_every_rank_and_left_as_it_was(tmp_path):
    mine = users_folder(tmp_path)
    before = snapshot(tmp_path)
    results = launch(cw.try_save, 2, str(mine), timeout=60)
    assert_refused_on_every_rank(results, f"cannot save to {mine}", "data/, notes.txt",
                                 "which no checkpoint save wrote", "move them away")
    assert snapshot(tmp_path) == before  # nothing inside changed, nothing made beside it


def test_a_file_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "ckpt").write_text("not a folder")
    before = snapshot(tmp_path)
    results = launch(cw.try_save, 2, str(tmp_path / "ckpt"), timeout=60)
    assert_refused_on_every_rank(results, "it is a file, not a checkpoint folder")
    assert snapshot(tmp_path) == before
    with pytest.raises(CheckpointError, match="is a file, not a folder"):  # a file as the parent
        saved_here(tmp_path / "ckpt" / "inside")
    assert snapshot(tmp_path) == before


def test_a_checkpoint_the_user_added_files_to_is_not_replaced(tmp_path):
    saved_here(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "README").write_text("run 7, lr 3e-4")
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match=r"it holds README, which no checkpoint save wrote"):
        saved_here(tmp_path / "ckpt", seed=1)
    assert snapshot(tmp_path) == before


def test_a_kit_checkpoint_or_an_empty_folder_is_replaced(tmp_path):
    (tmp_path / "empty").mkdir()
    a, _ = saved_here(tmp_path / "empty")
    saved_here(tmp_path / "ckpt")
    b, _ = saved_here(tmp_path / "ckpt", seed=1)  # over a checkpoint of the kit: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "empty"]
    for folder, model in (("empty", a), ("ckpt", b)):
        back = make_odd(seed=5)
        fsdp_mini.load_checkpoint(back, None, tmp_path / folder)
        for (k, v), w in zip(back.state_dict().items(), fsdp_mini.full_state_dict(model).values()):
            assert torch.equal(v, w), f"{folder}: {k}"


@pytest.mark.parametrize("where", ["/proc/ckpt", "/proc/self/ckpt", "/sys/ckpt"])
def test_a_folder_no_one_can_write_in_is_named_as_given(where):
    with pytest.raises(CheckpointError) as caught:
        saved_here(Path(where))
    message = str(caught.value)
    assert message.startswith(f"cannot save to {where}: cannot write in its folder "
                              f"{Path(where).parent}"), message
    assert ".lock" not in message and "save to a folder you can write to" in message


def test_a_symbolic_link_is_refused(tmp_path):
    saved_here(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="it is a symbolic link"):
        saved_here(tmp_path / "link")
    assert snapshot(tmp_path) == before


def test_dot_dotdot_and_a_trailing_slash(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = snapshot(tmp_path)
    for path in (".", "..", "./", "../", "../..", str(work), "/", Path(".")):
        with pytest.raises(CheckpointError, match=r"(the|above the) working folder.*name a folder "
                                                  r"of its own"):
            saved_here(path)
        assert snapshot(tmp_path) == before, f"{path!r} left something behind"
    with pytest.raises(CheckpointError, match="non-empty"):
        saved_here("")
    saved_here("ckpt/")  # a trailing slash names the folder itself: saved there
    saved_here("ckpt/./")
    assert sorted(os.listdir(work)) == ["ckpt"]  # no hidden folder left in the working folder
    assert fsdp_mini.load_checkpoint(make_odd(), None, "ckpt/")["world_size"] == 1


def test_a_second_job_saving_to_the_same_folder_is_refused_at_once(tmp_path):
    target, release = tmp_path / "ckpt", tmp_path.parent / f"{tmp_path.name}-release"
    first = subprocess.Popen(  # another job, in its own process: its save waits for `release`
        [sys.executable, "-c", "import sys, checkpoint_workers as cw, fsdp_mini; print(repr("
         "fsdp_mini.launch(cw.slow_save, 2, sys.argv[1], sys.argv[2], timeout=90)))",
         str(target), str(release)], cwd=Path(__file__).parent, stdout=subprocess.PIPE, text=True)
    try:
        until = time.monotonic() + 60
        while not (tmp_path / "ckpt.lock").exists() and time.monotonic() < until:
            time.sleep(0.02)  # the first job's rank 0 holds the lock: its save runs
        second = launch(cw.try_save, 2, str(target), timeout=60)
        release.touch()
        out, _ = first.communicate(timeout=90)
    finally:
        first.kill()
    results = eval(out.strip().splitlines()[-1])  # [(pid, (error kind, message, s)), ...]
    owner = results[0][0]  # the pid of the first job's rank 0
    assert_refused_on_every_rank(second, f"another checkpoint save (pid {owner} on ",
                                 "is saving there now", "save to another folder")
    assert [r[1][0] for r in results] == [None, None], results
    assert fsdp_mini.load_checkpoint(make_odd(), None, target)["world_size"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no lock, no tmp left


def test_a_rank_that_cannot_write_makes_every_rank_raise_and_changes_nothing(tmp_path):
    saved_here(tmp_path / "ckpt")
    before = snapshot(tmp_path)
    results = launch(cw.one_rank_cannot_write, 2, str(tmp_path / "ckpt"), 1, timeout=60)
    assert results[1][0] == "OSError" and "No space left on device" in results[1][1]
    assert results[0][0] == "CheckpointError"
    assert "rank 1 could not write its file (see its error); nothing was committed" in \
        results[0][1], results[0][1]
    assert max(r[2] for r in results) < 5
    assert snapshot(tmp_path) == before  # the temporary folder removed, the lock released


DIE_DURING_SAVE = """
import os, sys
sys.path.insert(0, {tests!r})
import checkpoint_workers as cw
import fsdp_mini
where, point, fmt = sys.argv[1:4]
model, optimizer = cw.build("fsdp", "adamw")
cw.train_steps(model, optimizer, [0], 0, 1)
replace = os.replace
def dying(src, dst):  # the save's own renames; the process dies at the one named
    dst = str(dst)
    if (point == "writing" and dst.endswith("rank0.pt")) or \\
            (point == "sealing" and dst.endswith("metadata.json")):
        os._exit(3)
    replace(src, dst)
    if point == "between renames" and ".old-" in dst:
        os._exit(3)
os.replace = dying
fsdp_mini.save_checkpoint(model, optimizer, where, format=fmt)
"""


def die_during_save(path: Path, point: str, fmt: str = "kit") -> None:
    """A save to ``path`` in a process that dies at ``point`` of it (exit status 3)."""
    script = DIE_DURING_SAVE.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script, str(path), point, fmt],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr


@pytest.mark.parametrize("point, fmt", [("writing", "kit"), ("sealing", "dcp"),
                                        ("between renames", "kit")])
@pytest.mark.parametrize("user_adds_a_file", [False, True])
def test_only_what_a_save_made_is_removed_whatever_looks_like_it(tmp_path, point, fmt,
                                                                 user_adds_a_file):
    ckpt = tmp_path / "ckpt"
    saved_here(ckpt)
    shutil.copytree(ckpt, tmp_path / "ckpt.old-1")           # the user's backup (1 is hex)
    die_during_save(ckpt, point, fmt)
    left = [p for p in tmp_path.iterdir() if p.is_dir() and re.fullmatch(
        r"ckpt\.(tmp|old)-[0-9a-f]{16}", p.name)]
    assert len(left) == (2 if point == "between renames" else 1), left
    # look-alikes: copies of the real leftovers under names a save could have drawn, or not
    copies = {f"{p.name[:9]}{n}": p for p in left for n in ("1", "cafe", "0" * 15 + "f", "a" * 16)
              if not (tmp_path / f"{p.name[:9]}{n}").exists()}
    for name, source in copies.items():
        shutil.copytree(source, tmp_path / name)
    if user_adds_a_file:
        (left[0] / "notes.txt").write_text("mine")
    (tmp_path / "ckpt.tmp-feed").write_text("a file, not a folder")
    (tmp_path / "ckpt.old-0000000000000000").write_text("a file with a leftover's name")
    kept = [p for p in tmp_path.iterdir() if p not in left] + left[:1] * user_adds_a_file
    before = {p.name: snapshot(p) if p.is_dir() else p.read_bytes() for p in kept
              if p.name != "ckpt.lock"}
    saved_here(ckpt, seed=1)
    gone = left[1:] if user_adds_a_file else left
    assert not any(p.exists() for p in gone), "a leftover of a save that died was kept"
    for name, then in before.items():
        now = tmp_path / name
        if name != "ckpt":
            assert (snapshot(now) if now.is_dir() else now.read_bytes()) == then, name
    assert sorted(os.listdir(ckpt)) == ["metadata.json", "rank0.pt"]   # no mark in a checkpoint
    assert not (tmp_path / "ckpt.lock").exists()


def test_a_failed_save_removes_its_own_folder_only(tmp_path, monkeypatch):
    saved_here(tmp_path / "ckpt")
    before = snapshot(tmp_path)
    from fsdp_mini.checkpoint import atomic
    real = atomic.CheckpointWriter.write_here

    def put_a_file_then_fail(self, name, obj):  # a file of the user's lands in the folder
        real(self, name, obj)
        (self.tmp / "notes.txt").write_text("mine")
        raise OSError("disk full")
    monkeypatch.setattr(atomic.CheckpointWriter, "write_here", put_a_file_then_fail)
    with pytest.raises(OSError, match="disk full"):
        saved_here(tmp_path / "ckpt", seed=1)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt.tmp-")]
    assert len(aside) == 1 and (aside[0] / "notes.txt").read_text() == "mine"  # kept: not all ours
    shutil.rmtree(aside[0])
    assert snapshot(tmp_path) == before
    monkeypatch.setattr(atomic.CheckpointWriter, "write_here",
                        lambda self, name, obj: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        saved_here(tmp_path / "ckpt", seed=1)
    assert snapshot(tmp_path) == before      # its own folder, unchanged by anyone: removed


@pytest.mark.parametrize("content", ["my lock, my rules", "4242", "", "\n", "{}", '{"pid": 7}',
                                     '{"mark": "another tool", "pid": 7}', "[1, 2]"])
def test_a_lock_file_of_the_users_is_refused_and_kept(tmp_path, content):
    (tmp_path / "ckpt.lock").write_text(content)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match=r"ckpt\.lock exists and is not a lock file of "
                                              r"fsdp_mini"):
        saved_here(tmp_path / "ckpt")
    assert snapshot(tmp_path) == before


def test_the_lock_of_a_save_that_died_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "ckpt.lock").write_text(json.dumps({"mark": "fsdp_mini lock", "pid": dead.pid}))
    saved_here(tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_damaged_metadata_fields_are_named(tmp_path):
    saved_here(tmp_path / "ckpt")
    meta_file = tmp_path / "ckpt" / "metadata.json"
    good = json.loads(meta_file.read_text())
    for change, named in [({"files": None}, "'files'"), ({"kind": "zip"}, "'kind' is 'zip'"),
                          ({"world_size": 0}, "'world_size' is 0"),
                          ({"files": {"rank0.pt": {"bytes": 3}}}, "the entry of 'rank0.pt' in 'files'")]:
        meta_file.write_text(json.dumps({**good, **change}))
        with pytest.raises(CheckpointError, match=f"metadata.json is damaged: {re.escape(named)}"):
            fsdp_mini.load_checkpoint(make_odd(), None, tmp_path / "ckpt")
    bare = {k: v for k, v in good.items() if k != "files"}
    meta_file.write_text(json.dumps(bare))
    with pytest.raises(CheckpointError, match="'files'.* is missing"):
        fsdp_mini.load_checkpoint(make_odd(), None, tmp_path / "ckpt")


def test_loading_an_optimizer_from_a_checkpoint_saved_without_one_says_so(tmp_path):
    model, _ = cw.build("fsdp", "adamw", seed=0)
    fsdp_mini.save_checkpoint(model, None, tmp_path / "ckpt")
    again, optimizer = cw.build("fsdp", "adamw", seed=1)
    with pytest.raises(CheckpointError, match="holds no optimizer state .*pass optimizer=None"):
        fsdp_mini.load_checkpoint(again, optimizer, tmp_path / "ckpt")
    fsdp_mini.load_checkpoint(again, None, tmp_path / "ckpt")  # the model alone loads


# -- 2. no random state moves --------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "ddp"])
def test_a_save_and_a_load_move_no_random_state_on_any_rank(tmp_path, strategy):
    results = launch(cw.rng_around_saves, 2, str(tmp_path), strategy, timeout=60)
    for rank, res in enumerate(results):
        assert res["moved"] == {"save sharded": [], "save full": [], "load": []}, \
            f"rank {rank}: {res['moved']}"
    assert results[0]["rand"] == results[1]["rand"]  # seeded alike, drawing alike after a save
    assert results[0]["order"] == results[1]["order"]  # so a seeded data order stays a partition
    in_process = cw.rng_around_saves(0, 1, str(tmp_path / "single"), "single")
    assert in_process["moved"] == {"save sharded": [], "save full": [], "load": []}


def test_every_call_of_the_kit_leaves_the_random_state_alone(tmp_path):
    moved = launch(cw.rng_around_the_kit, 2, str(tmp_path), timeout=120)
    assert moved == [[], []], f"calls that moved a random generator, by rank: {moved}"


def test_parallelize_of_a_meta_model_leaves_each_ranks_own_random_state(tmp_path):
    (moved0, state0), (moved1, state1) = launch(cw.rng_around_meta_parallelize, 2, timeout=60)
    assert moved0 == [] and moved1 == [], (moved0, moved1)
    for k, v in state0.items():  # and the init is still the same on every rank
        assert torch.equal(v, state1[k]), k
