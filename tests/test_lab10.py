"""Lab 10's check of ``port_to_fsdp2``: beside the reference port on 1-4 ranks, two GPTs, fp32
and bf16, compared on what FSDP2 made of each (units, policies, placements, the optimizer and its
settings) and on the training; its wrong ports are tests/wrong_answers/lab10.py. labs.torchrun
(the launcher's torchrun_cell) runs a script and leaves no process behind, also when it hangs.

(Under CI=true, set by conftest, a failed check raises CheckFailed.)
"""

import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from fsdp_mini import labs
from fsdp_mini.labs.lab10 import checks

port = labs.load_solution("10_port_to_fsdp2", "port_to_fsdp2")


def complaint(fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        labs.check_port_to_fsdp2(fn)
    return str(info.value)


def test_the_reference_port_passes_on_every_configuration():
    result = labs.check_port_to_fsdp2(port)
    assert result.passed and result.facts["configurations"] == 11, str(result)  # 10, and one with lr=0.02
    records = result.facts["records"]
    mine = next(m for c, (m, _) in records.items() if c["world_size"] == 4 and c["dtype"] == "bf16")
    assert mine.get("units", step=0) == "the root, blocks.0, blocks.1"
    assert mine.get("policies", step=0)["blocks.0"]["param_dtype"] == "torch.bfloat16"
    assert set(mine.get("placements", step=0).values()) == {"(Shard(dim=0),)"}
    assert mine.get("weights", rank=3, step=checks.STEPS) is not None   # rank 3's shards


def other_eps(model, param_dtype=None, lr=1e-3):
    policy = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
              if param_dtype is not None else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-7)   # trains almost alike


def test_other_adamw_settings_fail_even_where_the_weights_stay_close():
    said = complaint(other_eps)
    assert "the optimizer's settings #0['eps']: yours 1e-07, the reference 1e-08" in said


def test_a_stub_is_not_written_yet():
    def stub(model, param_dtype=None, lr=1e-3):
        """doc"""
        ...  # noqa: PIE790  (a stub, as in the notebook)

    assert "not written yet" in complaint(stub)


def test_torchrun_returns_the_output_and_stops_a_hanging_job_with_its_ranks(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        open(os.path.join(sys.argv[1], f"pid{os.environ['RANK']}"), "w").write(str(os.getpid()))
        sys.stdout.write(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n")  # one write:
        sys.stdout.flush()  # the two ranks share the output, and print's pieces would interleave
        if sys.argv[2] == "hang":
            time.sleep(600)
    """))
    text = labs.torchrun(script, nproc=2, args=[tmp_path, "ok"], timeout=120)
    assert "rank 0 of 2" in text and "rank 1 of 2" in text
    with pytest.raises(RuntimeError, match="took more than 15 s and was stopped"):
        labs.torchrun(script, nproc=2, args=[tmp_path, "hang"], timeout=15)
    for rank in (0, 1):  # the ranks of the hanging job are gone too (torchrun starts each in a
        pid = int((tmp_path / f"pid{rank}").read_text())  # session of its own)
        assert not alive(pid), f"rank {rank} (pid {pid}) outlived torchrun"


def alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for its parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_torchrun_failure_shows_the_output(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit('this rank gave up')\n")
    with pytest.raises(RuntimeError, match="exited with") as info:
        labs.torchrun(script, nproc=1, timeout=120)
    assert "this rank gave up" in str(info.value)



def test_the_notebook_says_nothing_runs_the_port_and_cleans_its_folder():
    """No later cell runs the learner's port, so the lab says so instead of loading the reference."""
    nb = nbformat.read(Path(labs.__file__).parents[2] / "labs" / "10_production.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "load_solution" not in text and "nothing to fall back on" in text
    assert "%%writefile {workdir}/train.py" in text and "shutil.rmtree(workdir)" in text
