"""Meta-device init: a model built under ``torch.device("meta")`` is materialised one unit at a
time inside ``parallelize``; peak memory stays near one unit plus the shards, and the model does
not depend on the world size."""

import meta_init_workers as mw
import pytest
import torch
from torch import nn

import fsdp_mini


@pytest.fixture(scope="module")
def ws2():
    return fsdp_mini.launch(mw.meta_vs_cpu, 2, timeout=60)


def _equal(a: dict, b: dict, what: str) -> None:
    assert list(a) == list(b), f"{what}: keys differ"
    for k, v in a.items():
        assert torch.equal(v, b[k]), f"{what}: {k} differs"


def test_peak_during_parallelize_stays_under_a_budget_smaller_than_the_model(ws2):
    full = mw.full_bytes()
    budget = 0.75 * full  # Note: at N = 2 the shards alone are half the model
    unit = (full - (mw.WIDTH + 1) * 4) / mw.LAYERS  # the head (WIDTH + 1 floats) is the root
    print(f"\nmeta init, N=2: peak in parallelize {ws2[0]['peak']:,} B = "
          f"{ws2[0]['peak'] / full:.3f} x the whole model ({full:,} B; one unit {unit:,.0f} B)")
    for rank, out in enumerate(ws2):
        assert out["peak"] < budget, (rank, out["peak"], full)
        assert out["peak"] <= full / 2 + 2.5 * unit, (rank, out["peak"], full)  # shards + 2 units


def test_the_model_does_not_depend_on_the_world_size_and_is_the_plain_build(ws2):
    ws3 = fsdp_mini.launch(mw.state_at, 3, timeout=60)
    _equal(ws2[0]["state"], ws2[1]["state"], "ranks")
    _equal(ws2[0]["state"], ws3[0], "world size 2 vs 3")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(mw.SEED)
        plain = mw.Tower()
    _equal(ws2[0]["state"], plain.state_dict(), "meta init vs torch.manual_seed(s); Tower()")
    assert ws2[0]["state"]["layers.0.gain"].min() >= 0.5  # the buffer was initialised


def test_the_meta_initialised_model_trains_like_the_cpu_built_one(ws2):
    for out in ws2:
        assert torch.isfinite(torch.tensor(out["loss"]))
        assert out["loss"] == out["cpu_loss"]
        _equal(out["state"], out["cpu_state"], "before the step")
        _equal(out["trained"], out["cpu_trained"], "after the step")


def test_strategies_that_keep_the_model_whole_materialise_it_whole(ws2):
    for strategy in ("ddp", "zero2", "hsdp"):
        if strategy in ws2[0]:
            _equal(ws2[0][strategy], ws2[0]["state"], strategy)


def test_param_init_fn_is_called_with_each_unit_then_the_root():
    with torch.device("meta"):
        model = mw.Tower()
    calls = []

    def init(module):
        own = [p for p in module.parameters() if not p.is_meta]
        calls.append((module, len(own)))
        with torch.no_grad():
            for p in own:
                p.fill_(0.25)
            for b in module.buffers():
                if not b.is_meta:
                    b.fill_(1.0)

    model, _ = fsdp_mini.parallelize(model, "fsdp", units=list(model.layers), param_init_fn=init)
    assert [m for m, _ in calls] == list(model.layers) + [model]
    assert [n for _, n in calls] == [4] * mw.LAYERS + [2]  # the root sees only its own head
    state = fsdp_mini.full_state_dict(model)
    assert all(bool((v == (1.0 if k.endswith("gain") else 0.25)).all()) for k, v in state.items())


def test_default_init_without_reset_parameters_is_a_clear_error():
    class Bare(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3))

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 3), Bare())
    with pytest.raises(ValueError, match=r"'1' \(Bare\).*reset_parameters.*param_init_fn"):
        fsdp_mini.parallelize(model, "fsdp")


@pytest.mark.parametrize("bad, error, match", [
    ("normal", TypeError, "param_init_fn must be a function"),
    (lambda m: setattr(m, "weight", nn.Parameter(torch.zeros(3, 3))), ValueError,
     "replaced Linear.weight instead"),
])
def test_a_bad_param_init_fn_is_a_clear_error(bad, error, match):
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 3))
    with pytest.raises(error, match=match):
        fsdp_mini.parallelize(model, "fsdp", units=[model[0]], param_init_fn=bad)


def test_device_meta_is_refused():
    with torch.device("meta"):
        model = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="real device"):
        fsdp_mini.parallelize(model, "ddp", device="meta")
