"""Lab 05's checkers pass the reference solutions; the scaffold's strategy; the notebook.

The wrong answers a checker must name are in tests/wrong_answers/lab05.py (run by
tests/test_wrong_answers.py). (Under CI=true a failed check raises.)
"""

from pathlib import Path

import nbformat
import pytest
import torch

import fsdp_mini
from fsdp_mini import labs

Unit = labs.load_solution("05_my_unit", "MyUnit")
reduce_scatter_grad = labs.load_solution("05_reduce_scatter_grad", "reduce_scatter_grad")


def complaint(check, *args) -> str:
    with pytest.raises(labs.CheckFailed) as info:
        check(*args)
    return str(info.value)


def test_the_reference_solutions_pass_and_send_the_formulas_bytes():
    unit, grad = labs.check_unit(Unit), labs.check_reduce_scatter_grad(reduce_scatter_grad, Unit)
    assert unit.passed and grad.passed
    units = grad.facts["units"]                  # padded bytes: first 36, middle 32, root 16 floats
    assert units == {"first": 144, "middle": 128, "root": 64}
    gathers = (144 + 128) * 2 + 64               # blocks twice (forward, backward), the root once
    assert grad.facts["sent"] == {"all_gather": gathers / 2, "reduce_scatter": (144 + 128 + 64) / 2}
    assert unit.facts["sent"]["all_reduce"] == 2 * (144 + 128 + 64) / 2   # the lab-04 way: 2Ψ
    for check in (unit, grad):   # the lab's memory formula, on the learner's own object
        assert "✔ model state per rank after the step" in str(check) and "16Ψ/N" in str(check)


def test_my_strategy_trains_like_the_kits_fsdp_in_one_process():
    class Fsdp(labs.FSDPScaffold):
        unit_class = Unit

    results = []
    for strategy in (Fsdp, "fsdp"):
        net = labs.UnitNet()
        net, opt = fsdp_mini.parallelize(net, strategy, units=[net.first, net.middle],
                                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
        net(x).square().mean().backward()
        opt.step()
        results.append(fsdp_mini.full_state_dict(net))
        assert not any(u.is_gathered for u in net.fsdp_mini.units) if strategy is Fsdp else True
    for k, v in results[1].items():
        assert torch.equal(results[0][k], v), k


def test_a_stub_is_not_written_yet():
    class Stub(labs.FSDPUnit):
        def unshard(self):
            """doc"""
            ...  # noqa: PIE790  (a stub, as in the notebook)

    said = complaint(labs.check_unit, Stub)
    assert "not written yet: unshard, reshard, post_forward, pre_backward" in said

    def stub(flat_grad, comm, label):
        """doc"""
        ...  # noqa: PIE790  (a stub, as in the notebook)

    assert "not written yet" in complaint(labs.check_reduce_scatter_grad, stub, Unit)


def test_the_interactive_ranks_use_the_labs_backend_and_device():
    nb = nbformat.read(Path(labs.__file__).parents[2] / "labs" / "05_fsdp.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "labs.start_ranks(N, backend=cfg.backend)" in text and "start_ranks(N)" not in text
    assert "make_model(gpt).to(device)" in text and "device = fsdp_mini.rank_device()" in text
