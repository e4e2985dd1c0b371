"""DCP interop: the kit's checkpoint saved in torch.distributed.checkpoint's format resumes under
torch's FSDP2 (``fully_shard``) at another world size, and a DCP folder a plain torch job wrote
resumes under any strategy of the kit; the next step equals the uninterrupted run's (to rounding,
with AdamW and with SGD + momentum, which a wrong gradient scale would not pass); saving gathers
nothing, stays atomic, and bad input gets an error that names what is wrong.
"""

import os
import warnings
from pathlib import Path

import dcp_workers as w
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

import fsdp_mini
from fsdp_mini import CheckpointError, launch
from fsdp_mini.checkpoint.dcp_boxes import boxes
from fsdp_mini.models import GPTConfig, make_model

OPTS = ("adamw", "sgd")
SAVES = {2: [(job, o) for o in OPTS for job in ("fsdp", "torch")] + [("ddp", "sgd")],
         4: [("hsdp", "adamw"), ("zero1", "sgd")]}
# (world size, job, folder): the kit's folders into torch and torch's into the kit, at M != N
RESUMES = ([(3, "torch", f"fsdp-{o}") for o in OPTS] + [(1, "torch", f"fsdp-{o}") for o in OPTS]
           + [(3, s, f"torch-{o}") for s in ("fsdp", "zero2") for o in OPTS]
           + [(3, "torch", "hsdp-adamw"), (3, "torch", "zero1-sgd"), (3, "torch", "ddp-sgd"),
              (3, "fsdp", "hsdp-adamw"), (4, "hsdp", "torch-adamw"), (4, "zero1", "fsdp-sgd")])
ROUNDING = 1e-6  # fp32: a few units in the last place of weights of size ~1


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in b)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every save (N = 2 and 4), then every resume (M = 3, 1 and 4); rank 0's results."""
    root = str(tmp_path_factory.mktemp("dcp"))
    out = {}
    for n, saves in SAVES.items():
        out.update(launch(w.run, n, root, saves, timeout=120)[0])
    for m in (3, 1, 4):
        resumes = [(job, folder) for size, job, folder in RESUMES if size == m]
        out.update(launch(w.run, m, root, [], resumes, timeout=120)[0])
    return root, out


# -- the format: torch's keys, each rank its share ---------------------------------------------------

def test_boxes_cover_a_flat_range_exactly_in_order():
    assert boxes(2, 9, (3, 4)) == [((0, 2), (1, 2), 2), ((1, 0), (1, 4), 4), ((2, 0), (1, 1), 8)]
    for shape in [(7,), (3, 4), (2, 3, 5), (4, 1, 3), ()]:
        n = max(1, torch.Size(shape).numel())
        whole = torch.arange(n).view(shape)
        for lo in range(n):
            for hi in range(lo, n + 1):
                got = [whole[tuple(slice(o, o + s) for o, s in zip(off, size))].reshape(-1)
                       for off, size, _ in boxes(lo, hi, shape)]
                flat = torch.cat(got) if got else torch.empty(0, dtype=whole.dtype)
                assert torch.equal(flat, torch.arange(lo, hi)), (shape, lo, hi)
                assert len(got) <= max(1, 2 * len(shape) - 1)


def test_the_kits_dcp_folder_holds_what_torchs_holds(runs):
    root, _ = runs
    kit = dcp.FileSystemReader(os.path.join(root, "fsdp-adamw")).read_metadata()
    torchs = dcp.FileSystemReader(os.path.join(root, "torch-adamw")).read_metadata()
    assert kit.state_dict_metadata.keys() == torchs.state_dict_metadata.keys()
    for key, md in torchs.state_dict_metadata.items():
        if hasattr(md, "size"):
            assert kit.state_dict_metadata[key].size == md.size, key
            assert kit.state_dict_metadata[key].properties.dtype == md.properties.dtype, key
    assert "model.head.weight" in kit.state_dict_metadata and "optim.param_groups.0.lr" in \
        kit.state_dict_metadata
    assert sorted(os.listdir(os.path.join(root, "fsdp-adamw"))) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "metadata.json"]


def test_each_rank_writes_its_share_and_nobody_gathers(runs):
    root, _ = runs
    for folder, n in (("fsdp-adamw", 2), ("hsdp-adamw", 4)):
        sizes = [os.path.getsize(os.path.join(root, folder, f"__{r}_0.distcp")) for r in range(n)]
        shards = 2 if folder.startswith("hsdp") else n  # hsdp: each piece written once
        assert max(sizes) < sum(sizes) * (1 / shards + 0.15), (folder, sizes)


# -- resuming exactly, both ways ------------------------------------------------------------------

@pytest.mark.parametrize("m,job,folder", RESUMES, ids=[f"{j}@{m}<-{f}" for m, j, f in RESUMES])
def test_the_next_step_equals_the_uninterrupted_run(runs, m, job, folder):
    root, out = runs
    after, _ = out[f"{job}<-{folder}"]
    uninterrupted = out[folder]
    saved = make_model(GPTConfig.tiny(), seed=5)
    fsdp_mini.load_checkpoint(saved, None, os.path.join(root, folder))
    step = largest_difference(uninterrupted, saved.state_dict())
    diff = largest_difference(after, uninterrupted)
    print(f"\n{job} at {m} <- {folder}: largest |difference| {diff:.2e} (the step itself moved "
          f"weights by up to {step:.1e})")
    assert diff < ROUNDING and diff < 1e-3 * step


def test_a_torch_jobs_folder_gives_the_step_of_its_optimizer_state(runs):
    _, out = runs
    adam, sgd = out["fsdp<-torch-adamw"][1], out["fsdp<-torch-sgd"][1]
    assert adam["step"] == w.SAVED_AT and adam["world_size"] is None
    assert "optimizer state" in adam["step_from"] and "no fsdp_mini metadata" in adam["step_from"]
    assert sgd["step"] is None and "no 'step'" in sgd["step_from"]
    kits = out["fsdp<-hsdp-adamw"][1]
    assert (kits["step"], kits["world_size"], kits["strategy"], kits["kind"]) == (
        w.SAVED_AT, 4, "hsdp", "dcp")


# -- bad input: errors that name what is wrong --------------------------------------------------------

def tiny(seed=0, **changes):
    net = make_model(GPTConfig.tiny(**changes), seed=seed)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-3)


def trained(seed=0):
    net, opt = tiny(seed)
    w.train(net, opt, [0], 0, 1)
    return net, opt


def torch_saves(net, opt, folder) -> None:
    model_sd, optim_sd = get_state_dict(net, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process"
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder), no_dist=True)


def test_a_model_of_other_shapes_is_named_with_both_shapes(tmp_path):
    fsdp_mini.save_checkpoint(*trained(), tmp_path / "ckpt", format="dcp")
    other, opt = tiny(n_embd=48)
    with pytest.raises(CheckpointError, match=r"'model\.wte\.weight' has shape \(64, 32\) in the "
                                              r"checkpoint, the model's 'wte\.weight' has shape "
                                              r"\(64, 48\)"):
        fsdp_mini.load_checkpoint(other, opt, tmp_path / "ckpt")


def test_a_model_of_other_names_is_named(tmp_path):
    torch_saves(*trained(), tmp_path / "ckpt")
    deeper, opt = tiny(n_layer=3)
    with pytest.raises(CheckpointError, match=r"missing \['blocks\.2\.ln_1\.weight'"):
        fsdp_mini.load_checkpoint(deeper, opt, tmp_path / "ckpt")


def test_another_optimizer_or_none_saved_is_refused(tmp_path):
    net, _ = trained()
    torch_saves(net, torch.optim.AdamW(net.parameters()), tmp_path / "adam")
    fsdp_mini.save_checkpoint(net, None, tmp_path / "model_only", format="dcp")
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError, match=r"saved by another optimizer"):
        fsdp_mini.load_checkpoint(net, sgd, tmp_path / "adam")
    with pytest.raises(CheckpointError, match=r"holds no optimizer state .*optimizer=None"):
        fsdp_mini.load_checkpoint(net, sgd, tmp_path / "model_only")
    assert fsdp_mini.load_checkpoint(net, None, tmp_path / "model_only")["kind"] == "dcp"


def flip_a_bit(file: Path, at: int | None = None) -> None:
    data = bytearray(file.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    file.write_bytes(bytes(data))


def test_a_changed_file_is_caught_and_no_message_advises_disabling_the_check(tmp_path):
    fsdp_mini.save_checkpoint(*trained(), tmp_path / "ckpt", format="dcp")
    flip_a_bit(tmp_path / "ckpt" / "__0_0.distcp")
    net, opt = tiny(1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp is missing or changed") as caught:
        fsdp_mini.load_checkpoint(net, opt, tmp_path / "ckpt")
    message = str(caught.value)
    assert "sha256" in message and "nothing was loaded" in message
    assert "remove" not in message and "as it is now" not in message
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    (tmp_path / "ckpt" / "metadata.json").write_text('{"format": "something else"}')
    with pytest.raises(CheckpointError, match="cannot be checked against it") as caught:
        fsdp_mini.load_checkpoint(net, opt, tmp_path / "ckpt")
    assert "move it away" not in str(caught.value) and "remove" not in str(caught.value)


def test_a_folder_without_the_kits_metadata_says_it_cannot_be_verified(tmp_path):
    torch_saves(*trained(), tmp_path / "torchs")
    with pytest.warns(UserWarning, match=r"torchs has no metadata\.json of fsdp_mini, so its "
                                         r"contents cannot be verified: torch\.distributed\."
                                         r"checkpoint keeps no checksums"):
        meta = fsdp_mini.load_checkpoint(*tiny(1), tmp_path / "torchs")
    assert meta["verified"] is False and "keeps no checksums" in meta["unverified"]
    fsdp_mini.save_checkpoint(*trained(), tmp_path / "kits", format="dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # the kit's own folder is verified: no warning
        assert "verified" not in fsdp_mini.load_checkpoint(*tiny(1), tmp_path / "kits")


@pytest.mark.parametrize("damage", ["truncated", "emptied", "garbage"])
def test_a_damaged_dcp_index_is_named_with_its_path(tmp_path, damage):
    torch_saves(*trained(), tmp_path / "torchs")
    index = tmp_path / "torchs" / ".metadata"
    data = index.read_bytes()
    index.write_bytes({"truncated": data[:len(data) // 2], "emptied": b"",
                       "garbage": b"not a pickle at all"}[damage])
    net, opt = tiny(1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with warnings.catch_warnings(), pytest.raises(CheckpointError) as caught:
        warnings.simplefilter("ignore")
        fsdp_mini.load_checkpoint(net, opt, tmp_path / "torchs")
    assert str(index) in str(caught.value) and "truncated or damaged" in str(caught.value)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_bad_format_arguments(tmp_path):
    net, opt = tiny()
    with pytest.raises(ValueError, match="format='torch'"):
        fsdp_mini.save_checkpoint(net, opt, tmp_path / "a", format="torch")
    with pytest.raises(ValueError, match="sharded by nature"):
        fsdp_mini.save_checkpoint(net, opt, tmp_path / "a", format="dcp", sharded=False)
    assert not (tmp_path / "a").exists()


# -- atomic, as the kit's own format ------------------------------------------------------------------

def test_formats_replace_one_another_but_a_torch_jobs_folder_is_left_alone(tmp_path):
    net, opt = trained()
    fsdp_mini.save_checkpoint(net, opt, tmp_path / "ckpt")
    fsdp_mini.save_checkpoint(net, opt, tmp_path / "ckpt", format="dcp")
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    fsdp_mini.save_checkpoint(net, opt, tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["metadata.json", "rank0.pt"]
    torch_saves(net, opt, tmp_path / "torchs")
    before = {f: (tmp_path / "torchs" / f).read_bytes() for f in os.listdir(tmp_path / "torchs")}
    with pytest.raises(CheckpointError, match=r"it holds \.metadata, __0_0\.distcp"):
        fsdp_mini.save_checkpoint(net, opt, tmp_path / "torchs", format="dcp")
    assert {f: (tmp_path / "torchs" / f).read_bytes() for f in before} == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "torchs"]


def test_a_rank_failing_mid_write_makes_every_rank_raise_and_keeps_the_old_one(tmp_path):
    fsdp_mini.save_checkpoint(*trained(), tmp_path / "ckpt", format="dcp")
    before = {f: (tmp_path / "ckpt" / f).read_bytes() for f in os.listdir(tmp_path / "ckpt")}
    outcomes = launch(w.save_dcp_failing, 2, str(tmp_path / "ckpt"), 1, timeout=120)
    assert all("disk full (simulated)" in o for o in outcomes), outcomes
    assert {f: (tmp_path / "ckpt" / f).read_bytes()
            for f in os.listdir(tmp_path / "ckpt")} == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary folder left, no lock


def test_saving_and_loading_move_no_random_state(tmp_path):
    net, opt = trained()
    state = torch.get_rng_state()
    fsdp_mini.save_checkpoint(net, opt, tmp_path / "ckpt", format="dcp")
    fsdp_mini.load_checkpoint(*tiny(1), tmp_path / "ckpt")
    assert torch.equal(torch.get_rng_state(), state)
