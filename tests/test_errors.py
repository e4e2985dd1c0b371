"""Bad input gets a clear error that says what was wrong and how to fix it."""

from functools import partial

import pytest
import torch
from torch import nn

import fsdp_mini
from fsdp_mini.models import GPTConfig, make_model


def tiny():
    return make_model(GPTConfig.tiny())


def test_unknown_strategy():
    with pytest.raises(ValueError, match=r"unknown strategy 'zero3'.*single, ddp, zero1, zero2, fsdp"):
        fsdp_mini.parallelize(tiny(), "zero3")


def test_units_must_be_submodules():
    model = tiny()
    with pytest.raises(ValueError, match="not a submodule"):
        fsdp_mini.parallelize(model, "fsdp", units=[nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="units must be nn.Modules"):
        fsdp_mini.parallelize(tiny(), "fsdp", units=["blocks.0"])
    with pytest.raises(ValueError, match="root module is always a unit"):
        model = tiny()
        fsdp_mini.parallelize(model, "fsdp", units=[model])


def test_a_container_is_not_a_unit():
    model = tiny()
    with pytest.raises(ValueError, match=r"'blocks' is a ModuleList, which is never called.*list"):
        fsdp_mini.parallelize(model, "fsdp", units=[model.blocks])


def test_one_unit_one_dtype():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2).to(torch.float64))
    with pytest.raises(ValueError, match="mixes parameter dtypes"):
        fsdp_mini.parallelize(model, "fsdp")


def test_units_must_not_overlap():
    model = tiny()
    with pytest.raises(ValueError, match=r"units overlap: 'blocks.0.attn' is inside 'blocks.0'"):
        fsdp_mini.parallelize(model, "fsdp", units=[model.blocks[0], model.blocks[0].attn])
    model = tiny()
    with pytest.raises(ValueError, match="listed twice"):
        fsdp_mini.parallelize(model, "fsdp", units=[model.blocks[0], model.blocks[0]])


def test_module_without_parameters():
    with pytest.raises(ValueError, match="no trainable parameters"):
        fsdp_mini.parallelize(nn.ReLU(), "ddp")
    frozen = nn.Linear(3, 3).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        fsdp_mini.parallelize(frozen, "fsdp")


def test_weights_tied_across_units():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    model = Tied()
    with pytest.raises(ValueError, match=r"shared by several units.*a\.weight, b\.weight.*one unit"):
        fsdp_mini.parallelize(model, "fsdp", units=[model.a, model.b])
    # both in the root: fine, and training works
    model, opt = fsdp_mini.parallelize(Tied(), "fsdp")
    model(torch.ones(2, 4)).sum().backward()
    opt.step()


def test_bad_options_and_optimizer():
    with pytest.raises(TypeError, match=r"unknown option\(s\) for 'ddp': reshard_after_forward"):
        fsdp_mini.parallelize(tiny(), "ddp", reshard_after_forward=False)
    with pytest.raises(TypeError, match="factory"):
        model = tiny()
        fsdp_mini.parallelize(model, "ddp", optimizer=torch.optim.SGD(model.parameters(), lr=1))
    with pytest.raises(TypeError, match="factory .*, not an optimizer instance"):
        model = tiny()
        fsdp_mini.parallelize(model, "ddp", optimizer=torch.optim.SGD(model.parameters(), lr=1))
    with pytest.raises(TypeError, match="factory .*, not an int"):
        fsdp_mini.parallelize(tiny(), "fsdp", optimizer=5)
    with pytest.raises(ValueError, match="bucket_mb must be positive"):
        fsdp_mini.parallelize(tiny(), "zero2", bucket_mb=0)
    with pytest.raises(TypeError, match="expects an nn.Module"):
        fsdp_mini.parallelize("gpt", "ddp")


def test_parallelize_twice():
    model, _ = fsdp_mini.parallelize(tiny(), "ddp")
    with pytest.raises(ValueError, match="already parallelized"):
        fsdp_mini.parallelize(model, "fsdp")


def test_expected_costs_needs_a_parallelized_model():
    with pytest.raises(ValueError, match="not parallelized"):
        fsdp_mini.expected_costs(tiny())


def test_single_process_strategies_need_no_process_group():
    for strategy in fsdp_mini.STRATEGIES:
        model = tiny()
        model, opt = fsdp_mini.parallelize(model, strategy, units=list(model.blocks),
                                           optimizer=partial(torch.optim.SGD, lr=0.1))
        x = torch.randint(0, 64, (2, 16))
        model(x, x)[1].backward()
        opt.step()
        opt.zero_grad()
        assert list(fsdp_mini.full_state_dict(model)) == list(tiny().state_dict())


def test_rank_lists_in_messages_read_in_rank_order():
    from fsdp_mini.launcher.failures import _ranks
    assert _ranks([1, 0]) == "ranks 0, 1"
    assert _ranks([3, 1, 2], ("was", "were")) == "ranks 1, 2, 3 were"
    assert _ranks([2], ("was", "were")) == "rank 2 was"


def test_flags_are_booleans_and_steps_whole_numbers(tmp_path):
    model, optimizer = fsdp_mini.parallelize(tiny(), "fsdp")
    with pytest.raises(TypeError, match=r"save_checkpoint\(sharded\) must be True .* or False .*got 'no'"):
        fsdp_mini.save_checkpoint(model, optimizer, tmp_path / "c", sharded="no")
    with pytest.raises(ValueError, match=r"save_checkpoint\(step\) must be a whole number >= 0 .*got -3"):
        fsdp_mini.save_checkpoint(model, optimizer, tmp_path / "c", step=-3)
    assert not (tmp_path / "c").exists()
    with pytest.raises(TypeError, match="writeback must be True .* or False, got 'no'"):
        with fsdp_mini.summon_full_params(model, writeback="no"):
            pass
