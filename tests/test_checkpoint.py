"""Checkpoints: saved at 4 ranks, resumed at 2, 3 and 1 under another strategy, with identical
parameters and optimizer state and the same next step; written atomically (a rank killed while
saving leaves the previous checkpoint intact); damaged ones give errors naming the file; a full
checkpoint loads into a plain module and into torch's ``fully_shard`` model.

One launch saves at 4 ranks (fsdp and zero2, AdamW and SGD + momentum), one per world size
resumes every checkpoint under fsdp, zero1 and ddp; world size 1 ("single") runs in-process.
"""

import os
import shutil
from pathlib import Path

import checkpoint_workers as cw
import pytest
import torch
from helpers import relative_errors
from workers import make_odd

import fsdp_mini
from fsdp_mini import CheckpointError, LaunchError, launch

SOURCES = [("fsdp", "adamw"), ("fsdp", "sgd"), ("zero2", "adamw"), ("zero2", "sgd")]
NAMES = [f"{s}-{o}" for s, o in SOURCES]
TARGETS = ["fsdp", "zero1", "ddp"]
TOL = 1e-6


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return root, launch(cw.save_runs, 4, str(root), SOURCES, timeout=60)[0]


@pytest.fixture(scope="module")
def resumed(saved):
    """Every checkpoint resumed at 2 and 3 ranks and in-process; at 2 ranks the fsdp-adamw
    full checkpoint also goes into torch's fully_shard: returns what that gave."""
    saved, uninterrupted = saved
    torch_file = str(saved / "fsdp-adamw" / "full" / "full.pt")
    at2 = launch(cw.resume_runs, 2, str(saved), NAMES, TARGETS, torch_file, timeout=60)[0]
    at3 = launch(cw.resume_runs, 3, str(saved), NAMES, TARGETS, timeout=60)[0]
    at1 = cw.resume_runs(0, 1, str(saved), NAMES, ["single"])
    after = {(ws, *key): state for ws, res in ((2, at2), (3, at3), (1, at1))
             for key, state in res["next"].items()}
    return saved, at2["torch"], after, uninterrupted


def _full(path):
    return torch.load(path / "full.pt", weights_only=True)


def _assert_identical(got: dict, ref: dict, what: str) -> None:
    assert list(got["model"]) == list(ref["model"]), what
    for k, v in ref["model"].items():
        assert torch.equal(got["model"][k], v), f"{what}: {k} differs"
    state, ref_state = got["optimizer"]["state"], ref["optimizer"]["state"]
    assert state.keys() == ref_state.keys(), what
    for name, entries in ref_state.items():
        assert entries.keys() == state[name].keys(), f"{what}: {name} state keys"
        for k, v in entries.items():
            assert torch.equal(torch.as_tensor(state[name][k]), torch.as_tensor(v)), \
                f"{what}: optimizer state {k} of {name} differs"
    assert got["optimizer"]["param_groups"] == ref["optimizer"]["param_groups"], what


def test_resume_at_2_3_and_1_under_other_strategies(resumed):
    (resumed, _, after, uninterrupted), worst = resumed, 0.0
    for source in NAMES:
        ref, ref_next = _full(resumed / source / "full"), uninterrupted[source]
        assert "exp_avg_sq" in next(iter(ref["optimizer"]["state"].values())) \
            or source.endswith("sgd")
        for ws, strategy in [(2, t) for t in TARGETS] + [(3, t) for t in TARGETS] + [(1, "single")]:
            out = resumed / source / f"resumed-{strategy}-ws{ws}"
            what = f"{source} saved at 4, resumed under {strategy} at {ws}"
            _assert_identical(_full(out / "loaded"), ref, what)
            errors = relative_errors(after[ws, source, strategy], ref_next)
            err = max(e[0] for e in errors.values())
            assert err <= TOL, f"{what}: next step differs by {err:.1e}"
            worst = max(worst, err)
    print(f"\nworst difference after resume at 2, 3 and 1 (norm-relative): {worst:.1e}")


def test_full_checkpoint_loads_into_a_plain_module(saved):
    saved = saved[0]
    ref = _full(saved / "fsdp-adamw" / "full")
    plain = make_odd(seed=1)
    plain.load_state_dict(ref["model"])
    for k, v in plain.state_dict().items():
        assert torch.equal(v, ref["model"][k]), k
    again = make_odd(seed=1)  # and through load_checkpoint, into a plain module and optimizer
    optimizer = torch.optim.AdamW([p for p in again.parameters() if p.requires_grad], lr=1e-3)
    fsdp_mini.load_checkpoint(again, optimizer, saved / "fsdp-adamw" / "full")
    assert torch.equal(optimizer.state[again.w2]["exp_avg"],
                       ref["optimizer"]["state"]["w2"]["exp_avg"])


def test_full_checkpoint_loads_into_torch_fully_shard(resumed):
    ref, ref_next = _full(resumed[0] / "fsdp-adamw" / "full"), resumed[3]["fsdp-adamw"]
    res = resumed[1]  # fully_shard at 2 ranks on gloo, DCP's set_*_state_dict(full_state_dict)
    for k, v in ref["model"].items():
        assert torch.equal(res["loaded"]["model"][k], v), k
    for name, entries in ref["optimizer"]["state"].items():
        for k, v in entries.items():
            assert torch.equal(res["loaded"]["optimizer"]["state"][name][k], v), (name, k)
    err = max(e[0] for e in relative_errors(res["next"], ref_next).values())
    assert err <= TOL, f"fully_shard's step after loading differs by {err:.1e}"


def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint(tmp_path):
    with pytest.raises(LaunchError, match="rank 1 exited with code 3"):
        launch(cw.die_while_saving, 2, str(tmp_path), 1, timeout=30)
    assert list(tmp_path.glob("ckpt.tmp-*")), "the interrupted save left no temporary folder"
    _assert_previous_checkpoint_intact(tmp_path)


def test_rank0_dying_between_the_two_renames_leaves_the_old_checkpoint_aside(tmp_path,
                                                                          monkeypatch):
    """In-process (world size 1): the rename that would put the new folder in place fails."""
    model, optimizer = cw.build("fsdp", "adamw")
    cw.train_steps(model, optimizer, [0], 0, 1)
    for name in ("ckpt", "copy"):
        fsdp_mini.save_checkpoint(model, optimizer, tmp_path / name)
    cw.train_steps(model, optimizer, [1], 0, 1)
    rename = os.replace

    def dies(src, dst):
        if ".tmp-" in str(src) and Path(dst).name == "ckpt":
            raise KeyboardInterrupt("rank 0 dies here")
        rename(src, dst)
    monkeypatch.setattr(os, "replace", dies)
    with pytest.raises(KeyboardInterrupt):
        fsdp_mini.save_checkpoint(model, optimizer, tmp_path / "ckpt")
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match=r"ckpt\.old-.* holds the previous one"):
        fsdp_mini.load_checkpoint(make_odd(), None, tmp_path / "ckpt")
    next(tmp_path.glob("ckpt.old-*")).rename(tmp_path / "ckpt")
    _assert_previous_checkpoint_intact(tmp_path)


def _assert_previous_checkpoint_intact(where) -> None:
    a, b = make_odd(seed=1), make_odd(seed=2)
    assert fsdp_mini.load_checkpoint(a, None, where / "ckpt")["step"] == 1
    fsdp_mini.load_checkpoint(b, None, where / "copy")
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), f"{k}: the previous checkpoint changed"
    fsdp_mini.save_checkpoint(a, None, where / "ckpt")  # the next save removes the leftovers
    assert sorted(p.name for p in where.iterdir()) == ["ckpt", "copy"]


# -- damaged or mismatched checkpoints -----------------------------------------------------------

@pytest.fixture
def damaged(saved, tmp_path):
    where = tmp_path / "ckpt"
    shutil.copytree(saved[0] / "fsdp-adamw" / "sharded", where)
    return where


def _load_error(where, model=None, optimizer_of=None, error=CheckpointError) -> str:
    model = model if model is not None else make_odd()
    optimizer = optimizer_of(model) if optimizer_of else None
    with pytest.raises(error) as info:
        fsdp_mini.load_checkpoint(model, optimizer, where)
    return str(info.value)


def test_corrupt_or_missing_files_are_named(damaged):
    data = bytearray((damaged / "rank1.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / "rank1.pt").write_bytes(bytes(data))
    assert "rank1.pt is corrupt" in _load_error(damaged)
    (damaged / "rank1.pt").unlink()
    msg = _load_error(damaged)
    assert "rank1.pt is missing" in msg and "world size 4" in msg, msg
    (damaged / "metadata.json").write_text("{not json")
    assert "metadata.json is corrupt" in _load_error(damaged)
    (damaged / "metadata.json").unlink()
    assert "metadata.json is missing" in _load_error(damaged)
    assert "no checkpoint at" in _load_error(damaged.parent / "nowhere", error=FileNotFoundError)


def test_truncated_file_is_named(damaged):
    data = (damaged / "rank2.pt").read_bytes()
    (damaged / "rank2.pt").write_bytes(data[:100])
    msg = _load_error(damaged)
    assert "rank2.pt is truncated" in msg and f"{len(data)} when saved" in msg, msg


def test_another_model_or_wrong_shapes_or_optimizer_are_named(damaged):
    msg = _load_error(damaged, model=torch.nn.Linear(3, 2))
    assert "does not fit this Linear" in msg and "unexpected" in msg and "inner.w1" in msg, msg
    odd = make_odd()
    odd.w2 = torch.nn.Parameter(torch.zeros(15, 4))
    msg = _load_error(damaged, model=odd)
    assert "rank" in msg and ".pt: 'w2' has shape (15, 3), the model's is (15, 4)" in msg, msg
    msg = _load_error(damaged, optimizer_of=lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    assert "AdamW" in msg and "SGD" in msg, msg
