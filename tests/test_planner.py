"""The planner (fsdp_mini.plan, `fsdp-mini plan`, the planner widget): its predictions against
fsdp_mini's own measurements, its CLI, and the 7B example's numbers."""

from __future__ import annotations

import json

import pytest
from planner_workers import measure_peaks

import fsdp_mini
from fsdp_mini.jobs.cli import main
from fsdp_mini.models import GPTConfig, make_model
from fsdp_mini.planner.plan import plan
from fsdp_mini.planner.table import format_plan
from fsdp_mini.planner.shapes import PRESETS, ModelShape
from fsdp_mini.registry import strategy_names

# The tiny GPT and two other shapes: deeper and narrow; wide, untied, 6 heads.
SHAPES = {"tiny": {"vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32},
          "deep": {"vocab_size": 128, "block_size": 32, "n_layer": 4, "n_head": 4, "n_embd": 64},
          "wide": {"vocab_size": 192, "block_size": 32, "n_layer": 2, "n_head": 6, "n_embd": 96,
                   "tie_weights": False}}
# micro-batch per world size: activations dominate at 4, model state and buffers at 1
MICRO_BATCH = {2: 4, 4: 1}
TOLERANCE = 0.10


def _cases(world_size: int) -> list[tuple[str, dict, str, dict]]:
    strategies = [("ddp", {}), ("zero1", {}), ("zero2", {}), ("fsdp", {})]
    if "hsdp" in strategy_names():  # being written alongside the planner
        strategies.append(("hsdp", {"shard_size": 2}))
    return [(shape, fields, s, o) for shape, fields in SHAPES.items() for s, o in strategies]


@pytest.fixture(scope="module", params=[2, 4], ids=["ws2", "ws4"])
def measured(request):
    ws = request.param
    per_rank = fsdp_mini.launch(measure_peaks, ws, _cases(ws), MICRO_BATCH[ws], timeout=60)
    return ws, per_rank


def _predicted(shape: str, strategy: str, ws: int):
    options = {"shard_size": 2} if strategy == "hsdp" else {}
    p = plan(model=ModelShape.from_gpt(GPTConfig(**SHAPES[shape])), gpus=ws, precision="fp32",
             micro_batch=MICRO_BATCH[ws], strategies=(strategy,), **options)
    return p.strategies[strategy]


def test_predicted_peaks_are_within_10_percent_of_measured(measured):
    ws, per_rank = measured
    rows = []
    for key, m in per_rank[0].items():
        shape, strategy = key.split("/")[0], key.split("/")[1].split(",")[0]
        s = _predicted(shape, strategy, ws)
        worst = max(abs(s.peak_bytes / r[key]["own_peak"] - 1) for r in per_rank)
        rows.append((key, ws, s.peak_bytes, m["own_peak"], worst))
    print("\n".join(f"{k:<14} ws{w} predicted {p:>10.0f} measured {m:>10d} error {e:6.2%}"
                    for k, w, p, m, e in rows))
    bad = [r for r in rows if r[4] > TOLERANCE]
    assert not bad, f"predicted peak off by more than {TOLERANCE:.0%}: {bad}"


def test_persistent_bytes_and_traffic_equal_the_zero_formulas(measured):
    ws, per_rank = measured
    for key, m in per_rank[0].items():
        shape, strategy = key.split("/")[0], key.split("/")[1].split(",")[0]
        s = _predicted(shape, strategy, ws)
        assert s.persistent_bytes == m["expected"]["persistent_bytes"], key
        assert s.sent_bytes_per_step == pytest.approx(m["expected"]["sent_bytes_per_step"]), key


@pytest.mark.parametrize("name", list(SHAPES))
def test_shape_counts_the_parameters_of_the_kit_gpt(name):
    cfg = GPTConfig(**SHAPES[name])
    assert ModelShape.from_gpt(cfg).params() == make_model(cfg).num_params()


def test_the_7b_example_is_sane():
    p = plan(params=7e9, gpus=8, gpu_mem_gb=80, precision="bf16-mixed")
    ddp, fsdp = p.strategies["ddp"], p.strategies["fsdp"]
    assert ddp.persistent_bytes == pytest.approx(16 * 7e9) and not ddp.fits  # 112 GB > 80 GB
    assert fsdp.persistent_bytes == pytest.approx(16 * 7e9 / 8, rel=1e-6) and fsdp.fits  # 14 GB
    z1, z2 = p.strategies["zero1"], p.strategies["zero2"]
    assert z1.persistent_bytes == pytest.approx((4 + 12 / 8) * 7e9, rel=1e-6)
    assert z2.persistent_bytes == pytest.approx((2 + 14 / 8) * 7e9, rel=1e-6)
    # ring traffic, gradients reduced in fp32 (parallelize's default): ddp 2(N-1)/N x 4Ψ, fsdp
    # (N-1)/N x (2 + 2 + 4)Ψ (the root is gathered once); reduced in bf16: 2Ψ and (2 + 2 + 2)Ψ
    assert ddp.sent_bytes_per_step == pytest.approx(2 * 7 / 8 * 4 * 7e9)
    assert fsdp.sent_bytes_per_step == pytest.approx(7 / 8 * 8 * 7e9, rel=0.02)
    half = plan(params=7e9, gpus=8, gpu_mem_gb=80, precision="bf16-mixed", reduce_dtype="bf16")
    assert half.strategies["ddp"].sent_bytes_per_step == pytest.approx(2 * 7 / 8 * 2 * 7e9)
    assert half.strategies["fsdp"].sent_bytes_per_step == pytest.approx(3 * 7 / 8 * 2 * 7e9,
                                                                        rel=0.02)
    assert 0 < ddp.comm_seconds_per_step < fsdp.comm_seconds_per_step


def test_presets_and_activations():
    assert 6.5e9 < PRESETS["7b"].params() < 7e9 and 65e9 < PRESETS["70b"].params() < 72e9
    p = plan(model="70b", gpus=64, gpu_mem_gb=80, micro_batch=1)
    assert not p.strategies["ddp"].fits and p.strategies["fsdp"].by_category["activations"] > 0
    ckpt = plan(model="70b", gpus=64, gpu_mem_gb=80, micro_batch=1, checkpointing=True)
    assert ckpt.strategies["fsdp"].peak_bytes < p.strategies["fsdp"].peak_bytes
    off = plan(model="7b", gpus=8, offload=True).strategies["fsdp"]
    assert off.by_category["optimizer_state"] == 0 and off.offloaded_bytes > 0
    # hsdp: less across-group traffic per GPU than fsdp over all ranks, more memory
    h, f = (plan(model="7b", gpus=32, shard_size=8).strategies[s] for s in ("hsdp", "fsdp"))
    assert h.persistent_bytes == pytest.approx(4 * f.persistent_bytes, rel=1e-6)


@pytest.mark.parametrize("kwargs, words", [
    ({"params": 7e9, "model": "7b"}, "not both"),
    ({"model": "9b"}, "unknown model preset"),
    ({"params": -1}, "params must be"),
    ({"params": 7e9, "precision": "fp16"}, "precision must be"),
    ({"params": 7e9, "gpus": 0}, "gpus must be"),
    ({"params": 7e9, "gpus": 12, "shard_size": 8}, "does not divide"),
    ({"params": 7e9, "bandwidth_gbs": 0}, "bandwidth_gbs"),
    ({"params": 7e9, "reduce_dtype": "int8"}, "reduce_dtype must be"),
    ({"params": 7e9, "reserve_gb": 80}, "reserve_gb must be"),
    ({"params": 7e9, "gpu": "B200"}, "unknown GPU 'B200'"),
    ({"params": 7e9, "efficiency": 1.5}, "efficiency must be"),
    ({"params": 7e9, "tflops": 0}, "tflops must be"),
    ({"params": 7e9, "micro_batches": 0}, "micro_batches must be"),
])
def test_bad_input_is_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        plan(**kwargs)


def test_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "--params", "7e9", "--gpus", "8", "--gpu-mem", "80", "--precision",
                 "bf16-mixed", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ddp" in out and "NO" in out and "hsdp" in out
    report = json.loads(path.read_text())
    assert set(report) >= {"params", "gpus", "gpu_mem_bytes", "precision", "strategies"}
    assert report["gpu_mem_bytes"] == 80e9 and report["gpus"] == 8
    fsdp = report["strategies"]["fsdp"]
    assert set(fsdp) >= {"persistent_bytes", "peak_bytes", "by_category", "fits",
                         "sent_bytes_per_step", "comm_seconds_per_step"}
    assert fsdp["fits"] is True and report["strategies"]["ddp"]["fits"] is False
    assert main(["plan", "--model", "tiny", "--gpus", "2", "--precision", "fp32"]) == 0
    assert "fsdp" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["plan"], "--params or --model"),
    (["plan", "--params", "7e9", "--model", "7b"], "not both"),
    (["plan", "--model", "9b"], "unknown model preset"),
    (["plan", "--params", "7e9", "--gpus", "0"], "--gpus"),
    (["plan", "--params", "7e9", "--gpu-mem", "-1"], "--gpu-mem"),
    (["plan", "--params", "7e9", "--gpus", "6", "--shard-size", "4"], "does not divide"),
    (["plan", "--params", "7e9", "--json", "/nonexistent/x.json"], "--json"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fsdp-mini plan: error:") \
        and words in err, err


def test_format_plan_names_every_strategy():
    text = format_plan(plan(params=1e9, gpus=4))
    assert all(s in text for s in ("ddp", "zero1", "zero2", "fsdp", "hsdp"))


def test_static_plot_returns_a_figure():
    from fsdp_mini.plots import plan_bars
    fig = plan_bars(plan(model="7b", gpus=8))
    assert len(fig.axes) == 1 and fig.axes[0].patches


def test_widget_redraws_when_a_control_changes():
    pytest.importorskip("ipywidgets")
    from fsdp_mini.widgets.planner import Planner
    w = Planner()
    before = w.bar_totals()
    assert set(before) == {"ddp", "zero1", "zero2", "fsdp", "hsdp"}
    w.controls["gpus"].value = w.controls["gpus"].value * 2
    after = w.bar_totals()
    assert after["fsdp"] < before["fsdp"] and after["ddp"] == before["ddp"]
    w.controls["precision"].value = "fp32"
    assert w.plan.precision == "fp32" and w.image.value  # a PNG was drawn
    # the link is one of round values, so the table is exactly plan(bandwidth_gbs=...)'s
    w.controls["bandwidth_gbs"].value = 10
    assert w.plan == plan(**w.arguments()) and w.arguments()["bandwidth_gbs"] == 10
    slow = w.plan.strategies["fsdp"].comm_seconds_per_step
    w.controls["bandwidth_gbs"].value = 100
    assert w.plan.strategies["fsdp"].comm_seconds_per_step < slow
