"""The same engine on a GPU with NCCL (world size 1 on the machines we borrow). Skipped on CPU;
run by benchmarks/gpu_check.sh."""

import pytest
import torch

import workers
from fsdp_mini import launch
from helpers import assert_states_equal

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
