"""Lab 05's checkers pass the reference solutions and name each typical FSDP mistake in words.

Wrong answers are small subclasses of the reference unit (or variants of the reference
reduction), each wrong in one way a learner might be. (Under CI=true a failed check raises.)
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


def test_freeing_with_del_frees_nothing_autograd_holds_the_buffer():
    class Del(Unit):
        def unshard(self):
            if not self.is_gathered:
                self.full = torch.empty(self.padded_numel)
                self.comm.all_gather(self.full, self.shard, label=self.tag())

        def reshard(self):
            del self.full

    said = complaint(labs.check_unit, Del)
    assert "unit 'middle': its gathered parameters (128 B) were still alive after reshard" in said
    assert "autograd holds it for backward" in said and "untyped_storage().resize_(0)" in said


def test_gathering_into_a_new_tensor_breaks_autograds_saved_views():
    class NewTensor(Unit):
        def unshard(self):
            if not self.is_gathered:
                self.full = torch.empty(self.padded_numel)
                self.comm.all_gather(self.full, self.shard, label=self.tag())

    said = complaint(labs.check_unit, NewTensor)
    assert "autograd saved views of the buffer gathered in forward" in said
    assert "You gathered again into a new tensor, which those views do not see" in said


def test_not_gathering_again_before_backward():
    class NoRegather(Unit):
        def pre_backward(self):
            if self.is_root:
                self.unshard()

    assert "gather the unit again in pre_backward" in complaint(labs.check_unit, NoRegather)


def test_resharding_the_root_after_forward_reports_the_extra_bytes():
    class RootFreed(Unit):
        def post_forward(self):
            self.reshard()

    said = complaint(labs.check_unit, RootFreed)
    assert "the root was freed after forward and all-gathered again before backward: 32 B more" in said


def test_gathering_the_root_again_though_it_is_gathered():
    class AlwaysGather(Unit):
        def unshard(self):
            self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
            self.comm.all_gather(self.full, self.shard, label=self.tag())

    assert "all-gathered the root again before backward, though it was still gathered" in \
        complaint(labs.check_unit, AlwaysGather)


def test_forgetting_the_padding():
    class NoPadding(Unit):
        def unshard(self):
            if not self.is_gathered:
                self.full.untyped_storage().resize_(self.numel * self.full.element_size())
                self.comm.all_gather(self.full, self.shard, label=self.tag())

    said = complaint(labs.check_unit, NoPadding)
    assert ("all_gather into a tensor of 16 elements, but its storage has room for 15 elements, "
            "the unit's parameters without the padding" in said)
    assert "padded to 16 elements, a multiple of N" in said and "not of elements" not in said
    assert "element_size()" not in said  # a hint, not the code


def test_sizing_the_storage_in_elements_is_told_resize_takes_bytes():
    class Elements(Unit):
        def unshard(self):
            if not self.is_gathered:
                self.full.untyped_storage().resize_(self.full.numel())
                self.comm.all_gather(self.full, self.shard, label=self.tag())

    said = complaint(labs.check_unit, Elements)
    assert ("all_gather into a tensor of 15 elements, but its storage has 15 B, room for 3 "
            "elements of 4 B: resize_ takes a number of bytes, not of elements" in said)
    assert "Hint: how many bytes is one element?" in said
    assert "padding" not in said and "element_size()" not in said


def test_a_storage_too_small_before_forward_is_named_too():
    class NoGather(Unit):  # resizes (in elements) but never gathers: the forward's check says it
        def unshard(self):
            if not self.is_gathered:
                self.full.untyped_storage().resize_(self.full.numel())

    said = complaint(labs.check_unit, NoGather)
    assert ("unit 'root': after unshard, self.full holds 15 elements but its storage has 15 B" in said
            and "resize_ takes a number of bytes, not of elements" in said)


def test_the_interactive_ranks_use_the_labs_backend_and_device():
    nb = nbformat.read(Path(labs.__file__).parents[2] / "labs" / "05_fsdp.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "labs.start_ranks(N, backend=cfg.backend)" in text and "start_ranks(N)" not in text
    assert "make_model(gpt).to(device)" in text and "device = fsdp_mini.rank_device()" in text


def test_reduce_scatter_without_averaging():
    def no_average(flat_grad, comm, label):
        mine = torch.empty(flat_grad.numel() // comm.world_size)
        comm.reduce_scatter(mine, flat_grad, label=label)
        return mine

    said = complaint(labs.check_reduce_scatter_grad, no_average, Unit)
    assert "gradients 2x too large" in said and "divide the sum over ranks by the world size" in said


def test_all_reducing_the_gradient_instead():
    def all_reduce(flat_grad, comm, label):
        comm.all_reduce(flat_grad, label=label)
        size = flat_grad.numel() // comm.world_size
        return flat_grad[comm.rank * size:(comm.rank + 1) * size] / comm.world_size

    assert "the gradient was all-reduced (2Ψ)" in complaint(labs.check_reduce_scatter_grad,
                                                            all_reduce, Unit)
