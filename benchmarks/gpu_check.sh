#!/usr/bin/env bash
# The GPU check, as one command on a CUDA machine (one GPU is enough: world size 1 with NCCL).
# Prints the figures a closing note needs (parity of every strategy and fsdp option on the GPU,
# offload and bf16 figures, the torch comparison, the dashboard's GPU memory figures); every part runs even if an earlier one fails, and the
# exit status says whether all passed.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, with the package installed
set -u
cd "$(dirname "$0")/.."
status=0
step() { echo; echo "=== $*"; "$@" || { status=1; echo "=== FAILED: $*"; }; }

step python -c "import torch, fsdp_mini; print('torch', torch.__version__, '| cuda', torch.version.cuda, '|', torch.cuda.get_device_name(0), '| GPUs:', torch.cuda.device_count())"
step python -m pytest -q -s -p no:cacheprovider tests/test_cuda.py tests/test_memory.py tests/test_errors.py tests/test_comm.py
step fsdp-mini compare --world-size 1 --backend nccl --global-batch 8
step python benchmarks/compare_torch.py --world-size 1 --backend nccl
step python benchmarks/gpu_memory.py  # the dashboard's allocator / nvidia-smi figures
step python benchmarks/planner_check.py  # the planner against measured peaks, offload and the reserve
exit $status
