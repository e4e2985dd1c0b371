"""fsdp_mini: Fully Sharded Data Parallel built from scratch, small enough to read in one sitting.

Start with ``fsdp/algorithm.py``: FSDP top to bottom, in FSDP2's words. The package is a house
of floors; each imports only the floors below it:

    arguments      a public function's inputs checked by name (bools are bools, counts whole)
    comm/          collectives (Comm), the ledger of bytes they move, the simulated link, the
                   debug check that ranks issue the same collectives: the ground floor
    memory         memory categories; track_memory (live tensor bytes per rank)
    file_lock      one job at a time: the lock a checkpoint save and a launch folder share
    clip           clipping by the global norm, whatever each rank holds of the gradients
    buffers/       flat padded buffers cut into shards, "no gradient" marks, gradient buckets,
                   gradients kept between micro-batches (no_sync), CPU offload
    precision/     mixed precision (the dtypes units gather and gradients travel in); fp16 loss
                   scaling checked on every rank
    theory         the ZeRO formulas: what a strategy should cost, beside what it does
    strategy       what every strategy offers (the interface), and Single
    ddp, zero      DDP; ZeRO-1 and ZeRO-2
    fsdp/          FSDP (ZeRO-3): algorithm.py, then its units, groups, prefetch, whole view,
                   meta init, and HSDP; ddp, zero and fsdp never import one another
    wrap           the parallel module and optimizer classes parallelize returns
    registry, api  strategies by name; parallelize & co
    training       the one training loop
    checkpoint/    save and load at any world size and strategy, atomically
    planner/       plan(): memory and traffic per strategy, from the formulas, before any GPU

The plumbing lives in the other folders and imports from the algorithm, never the other way:

    launcher/    launch(fn, N): run a function on N processes (gloo on CPU, NCCL on GPUs)
    telemetry/   events from the ranks (Recorder) and their totals (RunState), for watchers
    plots/       the figures, static (for GitHub, slides, the HTML copies of the labs)
    debug/       looking into a job from outside: a training function watched on each rank,
                 where hung ranks wait, torch's debug switches, flight recorder, FSDP2 beside ours
    widgets/     the live dashboard, the comparison and the planner, in a notebook
    jobs/        ready-made training jobs and the ``fsdp-mini`` command
    labs/        the lab kit: one folder per lab, and common/ for what every lab shares
    models.py    the small GPT and its synthetic data
"""

from .api import (STRATEGIES, expected_costs, full_state_dict, no_sync, parallelize,
                  summon_full_params)
from .checkpoint.files import CheckpointError
from .checkpoint.save_load import load_checkpoint, save_checkpoint
from .clip import GradientsChangedError, clip_grad_norm_
from .comm.collectives import Comm, Ledger, Tag
from .comm.link import Link
from .launcher import LaunchError, LaunchTimeoutError, launch, rank_device, run_with_torchrun
from .memory import CATEGORIES, allocating, track_memory
from .planner.plan import plan
from .precision.scaler import ShardedGradScaler
from .registry import register_strategy
from .strategy import Strategy

__all__ = ["STRATEGIES", "CATEGORIES", "Comm", "GradientsChangedError", "LaunchError",
           "LaunchTimeoutError", "Ledger", "Link", "ShardedGradScaler", "Strategy", "Tag",
           "allocating", "clip_grad_norm_",
           "expected_costs", "full_state_dict", "launch", "no_sync", "parallelize", "plan", "rank_device",
           "register_strategy", "run_with_torchrun", "summon_full_params", "track_memory",
           "CheckpointError", "load_checkpoint", "save_checkpoint"]
