"""fsdp_mini: Fully Sharded Data Parallel built from scratch, small enough to read in one sitting.

The algorithm sits at the top of the package, in layers; each imports only the layers above it:

    comm, comm_check, ledger     collectives, the debug check that ranks agree, the bytes they send
    link                         a simulated network: collectives take their α-β time on it
    memory                       memory categories; track_memory (live tensor bytes per rank)
    flat, absent, buckets        flat padded buffers cut into pieces; "no gradient" marks; buckets
    accumulate                   gradients kept on the rank between micro-batches (no_sync)
    precision                    mixed precision: the dtypes units gather and gradients travel in
    meta_init                    a model built on the meta device, materialised unit by unit
    strategy                     what every strategy offers (the interface), and Single
    ddp, zero, fsdp (+ fsdp_units, fsdp_whole)   the strategies, never importing one another
    hsdp                         FSDP inside shard groups, replicated across them (an FSDP)
    registry, clip, wrap         strategies by name; global-norm clipping; the parallel classes
    scaler                       ShardedGradScaler: fp16 loss scaling, overflow checked on all ranks
    api, theory, training        parallelize & co; the ZeRO formulas; the one training loop
    planner, planner_shapes      plan(): memory and traffic per strategy, from the formulas
    checkpoint (+ _files, _whole)  save and load at any world size and strategy, atomically

The plumbing lives in folders and imports from the algorithm, never the other way round:

    launcher/    launch(fn, N): run a function on N processes (gloo on CPU, NCCL on GPUs)
    telemetry/   events from the ranks (Recorder) and their totals (RunState), for watchers
    widgets/     the live dashboard and comparison; plots/: the same figures, static
    jobs/        ready-made training jobs and the ``fsdp-mini`` command
    models.py    the small GPT and its synthetic data
"""

from .api import (STRATEGIES, expected_costs, full_state_dict, no_sync, parallelize,
                  summon_full_params)
from .checkpoint import load_checkpoint, save_checkpoint
from .checkpoint_files import CheckpointError
from .clip import GradientsChangedError, clip_grad_norm_
from .comm import Comm, Ledger, Tag
from .link import Link
from .memory import CATEGORIES, allocating, track_memory
from .planner import plan
from .registry import register_strategy
from .scaler import ShardedGradScaler
from .strategy import Strategy

from .launcher import LaunchError, LaunchTimeoutError, launch, rank_device, run_with_torchrun

__all__ = ["STRATEGIES", "CATEGORIES", "Comm", "GradientsChangedError", "LaunchError",
           "LaunchTimeoutError", "Ledger", "Link", "ShardedGradScaler", "Strategy", "Tag",
           "allocating", "clip_grad_norm_",
           "expected_costs", "full_state_dict", "launch", "no_sync", "parallelize", "plan", "rank_device",
           "register_strategy", "run_with_torchrun", "summon_full_params", "track_memory",
           "CheckpointError", "load_checkpoint", "save_checkpoint"]
