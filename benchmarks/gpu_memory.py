"""On a GPU: the dashboard's memory panel against the allocator and nvidia-smi, measured.

    python benchmarks/gpu_memory.py            # one NCCL rank per GPU (at least one GPU)

Trains the default GPT under ddp and fsdp with a telemetry Recorder and prints, per strategy and
rank at its peak: the tensors the categories counted, what the caching allocator had allocated
and reserved, and what the device reports as used (NVML: what nvidia-smi shows), with each gap;
then checks the order tensors <= allocated <= reserved <= used that the panel explains.
"""

from __future__ import annotations

import sys
import tempfile

import torch

import fsdp_mini
from fsdp_mini import widgets
from fsdp_mini.jobs.gpt import train_strategies
from fsdp_mini.telemetry import load_events
from fsdp_mini.telemetry.units import fmt_bytes


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_memory: no CUDA GPU here; this check runs on a GPU box")
        return 0
    n = torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as folder:
        fsdp_mini.launch(train_strategies, n, ("ddp", "fsdp"), 4, "default", 8 * n,
                         backend="nccl", env={"FSDP_MINI_EVENTS_DIR": folder})
        events = load_events(folder)
    ok = True
    for run in widgets.Dashboard.from_events(events).runs:
        for r in run.rank_ids():
            peak = run.rank(r).peak
            cuda = peak.get("cuda", {})
            tensors, alloc = peak["total_bytes"], cuda.get("allocated_bytes", 0)
            reserved, used = cuda.get("reserved_bytes", 0), cuda.get("device_used_bytes", 0)
            print(f"{run.name:5s} rank {r}: tensors {fmt_bytes(tensors)} <= allocated "
                  f"{fmt_bytes(alloc)} <= reserved {fmt_bytes(reserved)} <= used {fmt_bytes(used)}"
                  f" ({cuda.get('device_source')}); gaps +{fmt_bytes(alloc - tensors)}, "
                  f"+{fmt_bytes(reserved - alloc)}, +{fmt_bytes(used - reserved)}")
            ok &= tensors <= alloc <= reserved <= used
    print("gpu_memory:", "the order holds on every rank" if ok else "FAILED: the order is broken")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
