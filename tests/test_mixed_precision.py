"""Mixed precision: fsdp gathers and computes in bf16 over fp32 shards, gradients travel in
``reduce_dtype``, and fp16 loss scaling skips a step on every rank when one rank overflows.

One launch at world size 2 trains the tiny GPT for 4 steps on the same data: fsdp in fp32 and
with ``param_dtype=torch.bfloat16``, torch's ``fully_shard`` with
``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``, and ddp, zero1
and zero2 with ``reduce_dtype=torch.bfloat16``; then two loss-scaling steps under fsdp fp16,
zero2 and ddp. The single-process reference that writes the casts out runs here.

Measured (torch 2.13.0, gloo, 2 ranks): fsdp_mini bf16 against torch fully_shard bf16, and
against the emulation, differ by 0.0 (bit for bit); bf16 against fp32 by 1.3e-2 (norm-relative,
worst tensor). TOL leaves room for a few flipped bf16 roundings and stays 100x below that.
"""

import mp_workers
import pytest
import torch
from helpers import assert_states_equal, padded, relative_errors, ring, trainable_numel
from torch import nn

import fsdp_mini
from fsdp_mini.models import GPTConfig, make_model

TOL = 1e-4
WS = 2


@pytest.fixture(scope="module")
def runs():
    return fsdp_mini.launch(mp_workers.precision_run, WS, timeout=120)


def test_bf16_matches_torch_fully_shard_with_the_same_policy(runs):
    mine, theirs = runs[0]["fsdp bf16"], runs[0]["torch bf16"]
    err = assert_states_equal(mine["state"], theirs["state"], TOL, "fsdp bf16 vs fully_shard")
    print(f"\nfsdp_mini bf16 vs torch fully_shard bf16: largest relative difference {err:.1e}")
    for rank in range(WS):
        assert runs[rank]["fsdp bf16"]["losses"] == pytest.approx(
            runs[rank]["torch bf16"]["losses"], rel=TOL)


def test_bf16_matches_a_single_process_that_writes_the_casts_out(runs):
    err = assert_states_equal(runs[0]["fsdp bf16"]["state"], mp_workers.emulated_bf16(WS), TOL,
                              "fsdp bf16 vs emulated casts")
    print(f"\nfsdp_mini bf16 vs single-process emulation: largest relative difference {err:.1e}")


def test_the_tolerance_is_far_below_what_bf16_changes(runs):
    errors = relative_errors(runs[0]["fsdp bf16"]["state"], runs[0]["fsdp"]["state"])
    worst = max(e[0] for e in errors.values())
    print(f"\nbf16 vs fp32: largest relative difference {worst:.1e}")
    assert worst > 100 * TOL


def test_reduce_dtype_bf16_trains_like_fp32_under_ddp_and_zero(runs):
    for strategy in ("ddp", "zero1", "zero2"):
        assert_states_equal(runs[0][f"{strategy} bf16 grads"]["state"], runs[0]["fsdp"]["state"],
                            0.1, f"{strategy} with bf16 gradients vs fp32")


def _gpt_sizes():
    model = make_model(GPTConfig.tiny())
    blocks = [padded(trainable_numel(b), WS) for b in model.blocks]
    psi = trainable_numel(model)
    return blocks, padded(psi - sum(trainable_numel(b) for b in model.blocks), WS), psi


def test_bytes_per_step_follow_the_dtypes(runs):
    """2-byte all-gathers (forward: every unit; backward: the blocks) and 4-byte reduce-scatters."""
    blocks, root, psi = _gpt_sizes()
    gathered, reduced = sum(blocks) + root + sum(blocks), sum(blocks) + root
    expected = {"fsdp": ring(WS) * 4 * (gathered + reduced),
                "fsdp bf16": ring(WS) * (2 * gathered + 4 * reduced),
                "ddp bf16 grads": 2 * ring(WS) * 2 * psi,
                "zero1 bf16 grads": ring(WS) * (2 + 4) * padded(psi, WS),
                "zero2 bf16 grads": ring(WS) * (2 + 4) * padded(psi, WS)}
    for rank in range(WS):
        for name, value in expected.items():
            res = runs[rank][name]
            assert res["expected"]["sent_bytes_per_step"] == value, (name, res["expected"])
            for step, sent in enumerate(res["sent_per_step"][:-1]):  # the last: + state dict
                assert sent == pytest.approx(value, rel=1e-12), (rank, name, step)
    print(f"\nbytes per step per rank: fsdp fp32 {expected['fsdp']:.0f}, "
          f"bf16 {expected['fsdp bf16']:.0f}")


def test_gathered_params_peak_halves(runs):
    for rank in range(WS):
        fp32, bf16 = runs[rank]["fsdp"]["gathered_peak"], runs[rank]["fsdp bf16"]["gathered_peak"]
        assert fp32 > 0 and bf16 * 2 == fp32, (rank, fp32, bf16)
    print(f"\npeak gathered_params: fp32 {fp32} B, bf16 {bf16} B")


@pytest.mark.parametrize("strategy", ["fsdp fp16", "zero2", "ddp"])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(runs, strategy):
    for rank in range(WS):
        res = runs[rank]["scaler"][strategy]
        assert res["poisoned"] == (rank == 1)
        assert res["skipped"] == [True, False], (rank, res["skipped"])
        assert res["changed"][0] == [], f"rank {rank}: a skipped step moved {res['changed'][0]}"
        assert len(res["changed"][1]) > 10  # the next step, without overflow, trains
        assert res["scales"] == [2.0**10, 2.0**9, 2.0**9]
        assert res["flag_records"] == [("all_reduce", "scaler", "found_inf", 4)] * 2


# -- in one process: the whole weights, and the errors ----------------------------------------

def test_summon_full_params_gives_the_fp32_master_weights():
    model = make_model(GPTConfig.tiny())
    initial = model.blocks[0].mlp.fc.weight.detach().clone()
    model, _ = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                     param_dtype=torch.bfloat16)
    shards = [g.shard.clone() for g in model.fsdp_mini.groups()]
    with fsdp_mini.summon_full_params(model, writeback=True):
        weight = model.blocks[0].mlp.fc.weight
        assert weight.dtype == torch.float32 and torch.equal(weight, initial)
    for group, before in zip(model.fsdp_mini.groups(), shards):
        assert torch.equal(group.shard, before)  # nothing rounded through bf16


def _parallelize(strategy, **options):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    return fsdp_mini.parallelize(model, strategy, units=[model[0]], **options)


@pytest.mark.parametrize("strategy, options, error, words", [
    ("fsdp", {"param_dtype": torch.int8}, ValueError, "param_dtype=torch.int8 is not a floating"),
    ("fsdp", {"param_dtype": torch.float8_e4m3fn}, ValueError, "8-bit float"),
    ("fsdp", {"reduce_dtype": "bf16"}, TypeError, "must be a torch dtype such as torch.bfloat16"),
    ("fsdp", {"reduce_dtype": torch.float32}, ValueError, "reduce_dtype=torch.float32 has no"),
    ("fsdp", {"param_dtype": torch.float32}, ValueError, "already torch.float32"),
    ("ddp", {"reduce_dtype": torch.float32}, ValueError, "has no effect"),
    ("ddp", {"param_dtype": torch.bfloat16}, TypeError, "torch.autocast"),
    ("zero2", {"param_dtype": torch.bfloat16}, TypeError, "use 'fsdp' with param_dtype"),
    ("single", {"reduce_dtype": torch.bfloat16}, TypeError, "unknown option"),
])
def test_nonsense_is_refused_with_a_clear_error(strategy, options, error, words):
    with pytest.raises(error, match=words):
        _parallelize(strategy, **options)


def test_scaler_misuse_is_refused():
    model = nn.Linear(4, 1)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="torch.amp.GradScaler"):
        fsdp_mini.ShardedGradScaler().step(plain)
    with pytest.raises(RuntimeError, match=r"update\(\) before step\(\)"):
        fsdp_mini.ShardedGradScaler().update()
    with pytest.raises(ValueError, match="growth_interval"):
        fsdp_mini.ShardedGradScaler(growth_interval=0)
