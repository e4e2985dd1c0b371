"""Lab 08's checker runs reshard beside the reference as every new rank, old and new world sizes
1 to 5, shards in any order, three dtypes, Adam's and SGD's states, and names the first shard
that differs and what it holds instead; the lab's flat shards are the kit's fsdp layout.
All in one process: the notebook itself (nbval) runs the launches, where the reference reshard must agree with the kit's loader.

The wrong answers (small functions written the way a learner gets it wrong) are in
tests/wrong_answers/lab08.py, run by tests/test_wrong_answers.py. (Under CI=true, set by conftest,
a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest

import torch

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs.common.records import Config
from fsdp_mini.labs.lab08 import checks as lab08

reshard = labs.load_solution("08_reshard", "reshard")


def complaint(fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        labs.check_reshard(fn)
    return str(info.value)


def test_the_reference_solution_passes():
    result = labs.check_reshard(reshard)
    assert result.passed and "140 configurations" in str(result)


def test_the_old_shards_are_the_kits_layout_in_the_order_files_come():
    old = lab08.old_shards(Config(numel=7, old_world_size=4, new_world_size=5, order="rank 0 last",
                                  dtype="bfloat16", state="sgd"))
    assert list(old) == [1, 2, 3, 0] and set(old[0]) == {"param", "momentum_buffer"}
    assert old[3]["param"].dtype == torch.bfloat16 and old[3]["param"][1].isnan()  # padding
    assert reshard(old, 7, 5, 4)["param"].tolist() == [0, 0]      # rank 4: padding only


def test_a_stub_is_not_written_yet():
    def stub(old_shards, numel, new_world_size, new_rank):
        """doc"""
        ...  # noqa: PIE790  (a stub, as in the notebook)

    assert "reshard is not written yet" in complaint(stub)


def test_an_error_is_named_with_its_place():
    text = complaint(lambda o, n, m, r: o[99])
    assert "your code raised KeyError: 99" in text and "at numel 1, old world size 1" in text


def test_a_view_of_an_old_shard_is_named():
    def same_world_size_shortcut(o, n, m, r):
        return o[r] if len(o) == m else reshard(o, n, m, r)
    text = complaint(same_world_size_shortcut)
    assert "new rank 0's shards that are views of an old shard" in text and ".clone()" in text


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
