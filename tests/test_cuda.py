"""The same engine on a GPU with NCCL (world size 1 on the machines we borrow). Skipped on CPU;
run by benchmarks/gpu_check.sh."""

import pytest
import torch
import workers
from helpers import assert_states_equal

from fsdp_mini import launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_every_strategy_matches_single_process_on_gpu():
    results = launch(workers.parity_run, 1, "gpt", workers.VARIANTS, list(workers.OPTIMIZERS),
                     backend="nccl", timeout=120)[0]
    for (variant, opt), res in results.items():
        reference = workers.train_reference("gpt", opt)
        assert_states_equal(res["state"], reference, 1e-5, f"{variant}/{opt} on cuda")
        assert all(s == 0 for s in res["sent_per_step"])  # one rank sends nothing


def test_tensor_bytes_agree_with_the_cuda_allocator():
    res = launch(workers.cuda_memory, 1, backend="nccl")[0]
    # the allocator rounds every block up (512 B granularity) and keeps NCCL's own buffers
    assert res["tensor_peak"] <= res["peak_allocated_bytes"] <= 1.25 * res["tensor_peak"], res
    assert res["reserved_bytes"] >= res["peak_allocated_bytes"]


def test_offload_keeps_the_model_state_off_the_gpu():
    res = launch(workers.offload_memory, 1, backend="nccl", timeout=120)[0]
    on_gpu, offloaded = res[False], res[True]
    print(f"\nGPU bytes kept between steps: {on_gpu['kept']} -> {offloaded['kept']}; GPU peak "
          f"{on_gpu['peak']} -> {offloaded['peak']}; step {on_gpu['seconds'] * 1e3:.1f} -> "
          f"{offloaded['seconds'] * 1e3:.1f} ms")
    assert offloaded["devices"] == {"cpu"}  # shards, gradients and Adam's state
    assert offloaded["kept"] < 0.5 * on_gpu["kept"]
    assert offloaded["peak"] < on_gpu["peak"]
    for key, value in offloaded["state"].items():
        assert torch.allclose(value, on_gpu["state"][key], rtol=1e-5, atol=1e-6), key


def test_bf16_units_match_torch_fully_shard_on_gpu():
    res = launch(workers.bf16_on_gpu, 1, backend="nccl", timeout=120)[0]
    err = assert_states_equal(res["mine"], res["theirs"], 1e-3, "fsdp bf16 vs fully_shard bf16")
    print(f"\nbf16 on GPU: fsdp_mini vs torch fully_shard, largest relative difference {err:.1e}")
