"""fsdp_mini: Fully Sharded Data Parallel built from scratch, small enough to read in one sitting.

Layers, each importing only the ones above it in this list:
    comm      collectives + a ledger of the bytes each rank sends
    memory    live tensor bytes per rank, by category (track_memory)
    flat      many parameters in one padded flat buffer
    ddp, zero, fsdp   the strategies; api.parallelize picks one
    launch    run a function on N processes (gloo on CPU, NCCL on GPUs)
"""

from .api import STRATEGIES, expected_costs, full_state_dict, parallelize
from .comm import Comm, Ledger
from .memory import CATEGORIES, allocating, track_memory


def __getattr__(name):  # replaced once the launcher lands
    # Note: the launcher is imported on first use so that `import fsdp_mini` stays light in ranks.
    if name in ("launch", "run_with_torchrun", "LaunchError", "LaunchTimeoutError"):
        from . import launch as _launch_module
        return getattr(_launch_module, name)
    raise AttributeError(f"module 'fsdp_mini' has no attribute {name!r}")


__all__ = ["STRATEGIES", "CATEGORIES", "Comm", "Ledger", "allocating", "expected_costs",
           "full_state_dict", "launch", "parallelize", "run_with_torchrun", "track_memory"]
