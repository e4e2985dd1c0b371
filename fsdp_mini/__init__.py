"""fsdp_mini: Fully Sharded Data Parallel built from scratch, small enough to read in one sitting.

Layers, each importing only the ones above it in this list:
    comm      collectives + a ledger of the bytes each rank sends
    memory    live tensor bytes per rank, by category (track_memory)
    flat      many parameters in one padded flat buffer
    ddp, zero, fsdp   the strategies; api.parallelize picks one
    launcher  launch(fn, N): run a function on N processes (gloo on CPU, NCCL on GPUs)
"""

from .api import STRATEGIES, expected_costs, full_state_dict, parallelize, summon_full_params
from .clip import clip_grad_norm_
from .comm import Comm, Ledger, Tag
from .registry import register_strategy
from .strategy import Strategy
from .memory import CATEGORIES, allocating, track_memory

from .launcher import LaunchError, LaunchTimeoutError, launch, rank_device, run_with_torchrun

__all__ = ["STRATEGIES", "CATEGORIES", "Comm", "LaunchError", "LaunchTimeoutError", "Ledger",
           "Strategy", "Tag", "allocating", "clip_grad_norm_", "expected_costs", "full_state_dict", "launch", "parallelize", "rank_device",
           "register_strategy", "run_with_torchrun", "summon_full_params", "track_memory"]
