"""Lab 08's checker passes the reference reshard and names each typical resharding mistake in
words; the lab's flat shards are the kit's fsdp layout. All in one process: the notebook itself
(nbval) runs the launches, where the reference reshard must agree with the kit's loader.

Wrong answers are small functions written the way a learner might get it wrong. (Under CI=true,
set by conftest, a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest
import torch

import fsdp_mini
from fsdp_mini import labs

reshard = labs.load_solution("08_reshard", "reshard")


def complaint(fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        labs.check_reshard(fn)
    return str(info.value)


def _cut(old, numel, new_world_size, new_rank, *, order=sorted, keep=None, size=None, lo=None,
         keys=None):
    """A reshard with knobs: each typical mistake is one knob turned."""
    size = size if size is not None else -(-numel // new_world_size)
    lo = lo if lo is not None else new_rank * size
    out = {}
    for key in keys or next(iter(old.values())):
        whole = torch.cat([old[r][key] for r in order(old)])
        whole = whole[:numel] if keep is None else whole
        piece = whole[lo:lo + size]
        out[key] = torch.cat([piece, torch.zeros(size - piece.numel())])
    return out


def test_the_reference_solution_passes():
    result = labs.check_reshard(reshard)
    assert result.passed and len(result.lines) == 3


def test_a_stub_is_not_written_yet():
    def stub(old_shards, numel, new_world_size, new_rank):
        """doc"""
        ...  # noqa: PIE790  (a stub, as in the notebook)

    assert "reshard is not written yet" in complaint(stub)


def test_forgetting_the_optimizer_state():
    said = complaint(lambda o, n, m, r: {"param": reshard(o, n, m, r)["param"]})
    assert "optimizer state forgotten" in said and "exp_avg" in said and "moments" in said


MOMENTS = ("the parameters are resharded but Adam's moments (exp_avg, exp_avg_sq) are not: "
           "reshard the optimizer state with the same offsets")


def test_moments_left_behind_while_the_parameters_are_right():
    """The parameter resharded, the moments not: zeros, the old rank's shard as it was, or
    missing. Each gets the plain diagnosis, not an indexing hint."""
    def zeros(o, n, m, r):
        p = reshard(o, n, m, r)["param"]
        return {"param": p, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    def unchanged(o, n, m, r):
        mine = o.get(r, o[0])
        return {"param": reshard(o, n, m, r)["param"], "exp_avg": mine["exp_avg"],
                "exp_avg_sq": mine["exp_avg_sq"]}
    said = complaint(zeros)
    assert MOMENTS in said and "all zeros" in said and "element" not in said
    said = complaint(unchanged)
    assert MOMENTS in said and "old rank 0's shard, unchanged" in said
    assert MOMENTS in complaint(lambda o, n, m, r: {"param": reshard(o, n, m, r)["param"]})


def test_equal_shards_when_numel_does_not_split_evenly():
    said = complaint(lambda o, n, m, r: _cut(o, n, m, r, size=n // m, lo=r * (n // m)))
    assert "do not split evenly" in said and "ceil(10/3) = 4" in said and "numel // N" in said


def test_concatenating_in_the_order_the_files_came():
    said = complaint(lambda o, n, m, r: _cut(o, n, m, r, order=list))
    assert "in the order they came" in said and "not by rank" in said and "sorted" in said


def test_keeping_the_old_padding():
    said = complaint(lambda o, n, m, r: _cut(o, n, m, r, keep=True))
    assert "old ranks' padding" in said and "drop everything past numel" in said


def test_counting_the_old_padding_as_elements(monkeypatch):
    """Where the padded total gives the same shard size (10 elements, 4 -> 3 ranks: 12 / 3 = 4),
    the padding shows up inside the shards; where it does not, the size is wrong."""
    def padded_total(o, n, m, r):
        total = sum(s["param"].numel() for s in o.values())
        return _cut(o, total, m, r, keep=True)
    said = complaint(padded_total)
    assert "old padding" in said and "numel" in said
    monkeypatch.setattr(labs.lab08, "CASES", [(9, 4, 2)])  # ceil(12 / 2) = 6, not ceil(9 / 2)
    said = complaint(padded_total)
    assert "counted the old padding (12 = 9 + 3) as elements" in said


def test_off_by_one_ranges():
    said = complaint(lambda o, n, m, r: _cut(o, n, m, r, lo=r * -(-n // m) + 1))
    assert "off by one" in said and "starts at element 1, rank 0's starts at 0" in said


def test_mixing_bytes_and_elements():
    said = complaint(lambda o, n, m, r: _cut(o, n, m, r, lo=r * -(-n // m) * 4))
    assert "bytes and elements mixed" in said
    said = complaint(lambda o, n, m, r: _cut(o, n, m, r, size=-(-n // m) * 4))
    assert "4 x the 4 elements" in said and "bytes and elements mixed" in said


def test_padding_not_zeros_and_an_error_are_named():
    def ones(o, n, m, r):
        out = reshard(o, n, m, r)
        real = max(0, min(n - r * -(-n // m), -(-n // m)))
        return {k: torch.cat([v[:real], torch.ones(len(v) - real)]) for k, v in out.items()}
    assert "padding is not zeros" in complaint(ones)
    assert "reshard raised KeyError" in complaint(lambda o, n, m, r: o[99])


def test_flat_shards_are_the_kits_fsdp_layout_in_one_process():
    """At world size 1 a unit's shard is its parameters end to end (no padding needed), and the
    moments are laid out the same way."""
    net = labs.lab_model("tiny")
    net, optimizer = fsdp_mini.parallelize(net, "fsdp", units=list(net.blocks),
                                           optimizer=labs.lab_optimizer)
    labs.train_steps(net, optimizer, [0], 0, 1, 2)
    shards = labs.flat_shards(net, optimizer)
    block = shards[0]
    params = list(labs.lab_model("tiny").blocks[0].parameters())
    assert block["numel"] == sum(p.numel() for p in params) == block["param"].numel()
    assert block["exp_avg"].abs().sum() > 0 and block["exp_avg_sq"].min() >= 0


def test_the_notebook_cleans_up_and_falls_back_to_the_reference():
    nb = nbformat.read(Path(labs.__file__).parents[2] / "labs" / "08_checkpoints.ipynb",
                       as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "tempfile.mkdtemp" in text and "shutil.rmtree(work)" in text
    assert 'labs.yours_or_reference(reshard_check, "08_reshard", reshard)' in text
