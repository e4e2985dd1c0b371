"""The planner beyond the ZeRO formulas: the reduce dtype (checked on the kit's own ledger), the
reserve behind "fits", the two network levels, the step time (compute + what the overlap does not
hide) and offload."""

from __future__ import annotations

import pytest
from planner_workers import sent_per_step

import fsdp_mini
from fsdp_mini.jobs.cli import main
from fsdp_mini.models import GPTConfig
from fsdp_mini.planner import hardware
from fsdp_mini.planner.plan import plan
from fsdp_mini.planner.shapes import ModelShape
from fsdp_mini.planner.table import format_plan

TINY = ModelShape.from_gpt(GPTConfig.tiny())


@pytest.fixture(scope="module")
def ledger_bytes():
    """Bytes rank 0 sent in one step of the tiny GPT under fsdp in bf16, reduced in fp32 (the
    default) and in bf16, and under ddp reduced in bf16: {(strategy, reduce): bytes}."""
    return fsdp_mini.launch(sent_per_step, 2, timeout=60)[0]


@pytest.mark.parametrize("strategy, reduce", [("fsdp", None), ("fsdp", "bf16"), ("ddp", "bf16"),
                                              ("ddp", None)])
def test_sent_bytes_follow_the_reduce_dtype_as_the_ledger_counts_them(ledger_bytes, strategy,
                                                                      reduce):
    p = plan(model=TINY, gpus=2, precision="bf16-mixed", reduce_dtype=reduce,
             strategies=(strategy,))
    assert p.strategies[strategy].sent_bytes_per_step == ledger_bytes[strategy, reduce]
    assert p.reduce_dtype == (reduce or "fp32")


def test_fits_keeps_the_reserve_free():
    p = plan(model="70b", gpus=16, gpu_mem_gb=80, micro_batch=1, checkpointing=True,
             precision="bf16-mixed")
    assert p.reserve_bytes == hardware.default_reserve_gb(80) * 1e9 == 5e9
    for s in p.strategies.values():
        assert s.fits == (s.peak_bytes + 5e9 <= 80e9)
    fsdp = p.strategies["fsdp"]
    tight = plan(model="70b", gpus=16, gpu_mem_gb=80, micro_batch=1, checkpointing=True,
                 reserve_gb=80e9 / 1e9 - fsdp.peak_bytes / 1e9 + 0.01).strategies["fsdp"]
    assert not tight.fits  # the same peak, 10 MB less room than it needs
    loose = plan(model="70b", gpus=16, gpu_mem_gb=80, micro_batch=1, checkpointing=True,
                 reserve_gb=0).strategies["fsdp"]
    assert loose.fits == (fsdp.peak_bytes <= 80e9)
    assert "5 GB kept free per GPU" in format_plan(p) and "+resv" in format_plan(p)


def test_fsdp_across_nodes_pays_the_network_and_hsdp_keeps_its_shards_in_the_node():
    one_node = plan(model="7b", gpus=8).strategies["fsdp"]
    two_nodes = plan(model="7b", gpus=16, shard_size=8)
    fsdp, hsdp = two_nodes.strategies["fsdp"], two_nodes.strategies["hsdp"]
    # the same bytes per GPU about (3 x 2Ψ(N-1)/N), but 16 GPUs span two nodes: 50 GB/s, not 450
    assert fsdp.comm_seconds_per_step > 5 * one_node.comm_seconds_per_step
    assert hsdp.comm_seconds_per_step < fsdp.comm_seconds_per_step / 3
    faster = plan(model="7b", gpus=16, shard_size=8, bandwidth_gbs=400).strategies["fsdp"]
    assert faster.comm_seconds_per_step < fsdp.comm_seconds_per_step / 4
    assert plan(model="7b", gpus=16, gpus_per_node=16).strategies["fsdp"].comm_seconds_per_step \
        < fsdp.comm_seconds_per_step / 4  # one node of 16: all on NVLink


def test_step_time_is_compute_plus_what_the_overlap_does_not_hide():
    p = plan(model="7b", gpus=8, micro_batch=2, gpu="H100", efficiency=0.5)
    tokens = 2 * 4096
    assert p.tokens_per_gpu_per_step == tokens
    compute = 6 * p.params * tokens / (989e12 * 0.5)
    for name, s in p.strategies.items():
        assert s.compute_seconds == pytest.approx(compute)
        assert s.step_seconds == pytest.approx(s.compute_seconds + s.exposed_comm_seconds)
        assert 0 <= s.exposed_comm_seconds <= s.comm_seconds_per_step + 1e-12, name
        assert s.gpu_hours_per_million_tokens == pytest.approx(s.step_seconds / tokens * 1e6 / 3600)
    assert p.strategies["zero1"].exposed_comm_seconds == pytest.approx(
        p.strategies["zero1"].comm_seconds_per_step)  # all at optimizer.step(): nothing hidden
    ck = plan(model="7b", gpus=8, micro_batch=2, efficiency=0.5, checkpointing=True)
    assert ck.strategies["fsdp"].compute_seconds == pytest.approx(compute * 8 / 6)
    a100 = plan(model="7b", gpus=8, micro_batch=2, efficiency=0.5, gpu="A100")
    assert a100.strategies["ddp"].compute_seconds == pytest.approx(compute * 989 / 312)
    slow = plan(model="7b", gpus=16, micro_batch=2, bandwidth_gbs=1)
    fast = plan(model="7b", gpus=16, micro_batch=2, bandwidth_gbs=1, prefetch=True)
    assert fast.strategies["fsdp"].exposed_comm_seconds < slow.strategies["fsdp"].exposed_comm_seconds


def test_checkpointing_no_longer_wins_on_time_where_memory_is_plenty():
    """On a model that fits without it, recomputation costs 8Ψ instead of 6Ψ per token."""
    p, ck = (plan(model="7b", gpus=8, micro_batch=1, checkpointing=c) for c in (False, True))
    assert ck.strategies["fsdp"].sent_bytes_per_step == p.strategies["fsdp"].sent_bytes_per_step
    assert ck.strategies["fsdp"].step_seconds > p.strategies["fsdp"].step_seconds


def test_offload_counts_host_memory_pcie_and_the_cpu_step():
    on, off = (plan(model="7b", gpus=16, offload=o).strategies["fsdp"] for o in (True, False))
    shard = on.offloaded_bytes  # params + grads + Adam state of this GPU's shard
    assert shard == pytest.approx(off.persistent_bytes)
    assert on.host_bytes_per_node == pytest.approx(8 * shard)  # 8 GPUs per node
    params = 6_738_415_616 / 16
    assert on.pcie_bytes_per_step == pytest.approx(params * (2 * 2 + 4), rel=1e-3)
    assert on.offload_seconds > on.pcie_bytes_per_step / 48e9
    assert on.step_seconds == pytest.approx(off.step_seconds + on.offload_seconds)
    assert "host memory" in format_plan(plan(model="7b", gpus=16, offload=True))


def test_no_sync_reduces_once_and_keeps_whole_gradients():
    k = 4
    every = plan(model=TINY, gpus=2, precision="fp32", micro_batches=k)
    once = plan(model=TINY, gpus=2, precision="fp32", micro_batches=k, no_sync=True)
    one = plan(model=TINY, gpus=2, precision="fp32")
    assert every.strategies["ddp"].sent_bytes_per_step == pytest.approx(
        k * one.strategies["ddp"].sent_bytes_per_step)
    assert once.strategies["ddp"].sent_bytes_per_step == one.strategies["ddp"].sent_bytes_per_step
    assert once.strategies["fsdp"].by_category["grads"] > every.strategies["fsdp"].by_category[
        "grads"]


def test_cli_takes_the_new_options(capsys):
    assert main(["plan", "--model", "7b", "--gpus", "16", "--gpu", "A100", "--efficiency", "0.35",
                 "--reduce-dtype", "bf16", "--reserve-gb", "3", "--gpus-per-node", "4",
                 "--micro-batches", "2", "--no-sync"]) == 0
    out = capsys.readouterr().out
    assert "gradients reduced in bf16; 3 GB kept free per GPU" in out
    assert "A100 SXM 80 GB at 312 TFLOPS x 35%" in out and "(4 GPUs)" in out
    assert "GPU-h/Mtok" in out and "step s" in out
    assert main(["plan", "--model", "7b", "--gpu", "B200"]) == 2
    assert "unknown GPU 'B200'" in capsys.readouterr().err


def test_a_training_budget_gives_time_gpu_hours_and_the_cost_at_your_price():
    p = plan(model="7b", gpus=64, micro_batch=1, train_tokens=2e12, price_per_gpu_hour=2.5)
    per_step = 64 * 4096
    assert p.train_steps == -(-2_000_000_000_000 // per_step) and p.train_tokens >= 2e12
    for s in p.strategies.values():
        assert s.train_hours == pytest.approx(p.train_steps * s.step_seconds / 3600)
        assert s.train_gpu_hours == pytest.approx(64 * s.train_hours)
        assert s.train_cost == pytest.approx(2.5 * s.train_gpu_hours)
    by_steps = plan(model="7b", gpus=64, micro_batch=1, train_steps=p.train_steps)
    assert by_steps.strategies["fsdp"].train_gpu_hours == pytest.approx(
        p.strategies["fsdp"].train_gpu_hours)
    assert by_steps.strategies["fsdp"].train_cost is None  # no price is built in
    assert plan(model="7b", gpus=64).strategies["fsdp"].train_hours is None
    text = format_plan(p)
    assert "at 2.5 per GPU-hour (your price)" in text and "GPU-hours" in text
    assert "no price given" in format_plan(by_steps)


@pytest.mark.parametrize("kwargs, words", [
    ({"train_tokens": 1e12, "train_steps": 10}, "not both"),
    ({"price_per_gpu_hour": 2.0}, "a price needs a budget"),
    ({"train_tokens": -1}, "train_tokens must be"),
    ({"train_steps": 1.5}, "train_steps must be"),
    ({"train_tokens": 1e9, "price_per_gpu_hour": -1}, "price_per_gpu_hour must be"),
])
def test_a_budget_that_cannot_be_priced_is_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        plan(model="7b", **kwargs)


def test_cli_and_widget_take_the_budget(capsys):
    assert main(["plan", "--model", "70b", "--gpus", "64", "--checkpointing", "--train-tokens",
                 "2e12", "--price-per-gpu-hour", "3"]) == 0
    out = capsys.readouterr().out
    assert "to train 2,000,000,122,880 tokens (7,629,395 steps of 262,144 tokens)" in out
    assert "at 3 per GPU-hour (your price)" in out
    from fsdp_mini.widgets.planner import Planner
    w = Planner()
    assert w.plan.price_per_gpu_hour is None and w.plan.train_steps is not None
    w.controls["price_per_gpu_hour"].value = "2.5"
    assert w.plan.strategies["fsdp"].train_cost == pytest.approx(
        2.5 * w.plan.strategies["fsdp"].train_gpu_hours)
    w.controls["price_per_gpu_hour"].value = "two"
    assert "price 'two' is not a number" in w.table.value
