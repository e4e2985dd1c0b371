"""Lab 10's checker passes the reference port to FSDP2 and names each typical porting mistake in
words; labs.torchrun runs a script and leaves no process behind, also when it hangs.

(Under CI=true, set by conftest, a failed check raises CheckFailed.)
"""

import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs import lab10

port = labs.load_solution("10_port_to_fsdp2", "port_to_fsdp2")


def complaint(fn) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        labs.check_port_to_fsdp2(fn)
    return str(info.value)


def test_the_reference_port_passes_and_gathers_as_fsdp_mini():
    result = labs.check_port_to_fsdp2(port)
    assert result.passed
    for case in ("fp32", "bf16"):
        run = result.facts[case]
        assert run["gathers"] == run["want_gathers"] == 5 and run["units"] == 3
        assert run["stale"] == 0 and run["loss_diff"] <= 1e-4
    assert result.facts["bf16"]["compute_dtype"] == "torch.bfloat16"


def root_not_wrapped(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def blocks_not_wrapped(model, param_dtype=None, lr=1e-3):
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def optimizer_first(model, param_dtype=None, lr=1e-3):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, optimizer


def no_policy(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def module_list(model, param_dtype=None, lr=1e-3):
    fully_shard(model.blocks)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def policy_on_root_only(model, param_dtype=None, lr=1e-3):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def no_reduce_dtype(model, param_dtype=None, lr=1e-3):
    policy = MixedPrecisionPolicy(param_dtype=param_dtype)   # reduce_dtype left out: bf16
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


MISTAKES = {
    root_not_wrapped: ["the root is not wrapped", "gradients are never averaged"],
    blocks_not_wrapped: ["0 of the 2 blocks are units", "1 all-gather per step instead of 5"],
    optimizer_first: ["the optimizer holds 26 parameters the model no longer uses",
                      "built before fully_shard"],
    no_policy: ["✔ fp32", "bf16: the blocks compute in torch.float32, but torch.bfloat16 was asked"],
    module_list: ["fully_shard on model.blocks, the ModuleList", "wrap each block"],
    no_reduce_dtype: ["✔ fp32", "bf16: the gradients are reduce-scattered in bf16 (27,840 B per "
                      "step against 55,680 B in fp32)", "no reduce_dtype=torch.float32",
                      "reduce_dtype=torch.float32)"],
    policy_on_root_only: ["bf16: training raised RuntimeError",
                          "do not all compute in the same dtype",
                          "give every fully_shard call the same mp_policy"],
}


def test_each_porting_mistake_is_named():
    """One launch runs every wrong port (a launch per answer would be slow); the checker's
    judging of each rank-0 result is the same code check_port_to_fsdp2 runs."""
    runs = fsdp_mini.launch(lab10.port_runs, 2, list(MISTAKES), backend="gloo", timeout=60)
    for (fn, said), run in zip(MISTAKES.items(), runs[0]):
        with pytest.raises(labs.CheckFailed) as info:
            lab10.judge_port(labs.CheckResult(fn.__name__), run)
        text = str(info.value)
        for words in said:
            assert words in text, text
        assert "Traceback" not in text


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
