"""Lab 08's checker passes the reference reshard and names each typical resharding mistake in
words; the lab's flat shards are the kit's fsdp layout. All in one process: the notebook itself
(nbval) runs the launches, where the reference reshard must agree with the kit's loader.

The wrong answers (small functions written the way a learner gets it wrong) are in
tests/wrong_answers/lab08.py, run by tests/test_wrong_answers.py. (Under CI=true, set by conftest,
a failed check raises CheckFailed.)
"""

from pathlib import Path

import nbformat
import pytest

import fsdp_mini
from fsdp_mini import labs

reshard = labs.load_solution("08_reshard", "reshard")


def complaint(fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        labs.check_reshard(fn)
    return str(info.value)


def test_the_reference_solution_passes():
    result = labs.check_reshard(reshard)
    assert result.passed and len(result.lines) == 3


def test_a_stub_is_not_written_yet():
    def stub(old_shards, numel, new_world_size, new_rank):
        """doc"""
        ...  # noqa: PIE790  (a stub, as in the notebook)

    assert "reshard is not written yet" in complaint(stub)


def test_an_error_is_named():
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
