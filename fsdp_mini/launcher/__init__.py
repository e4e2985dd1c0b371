"""Run a function on N ranks from a notebook or a script, and get its return values back.

`launch(fn, world_size, *args)` starts `world_size` fresh Python processes (not `fork`, which breaks
once CUDA was touched, and not `multiprocessing`, whose spawn leaves a resource tracker behind), ships
`fn` and `args` to them *by value* with cloudpickle (so functions written in a notebook cell work),
initialises `torch.distributed` in each, runs `fn(rank, world_size, *args)` and collects the return
values from files written with `torch.save` (tensors survive; shared-memory queues do not outlive the
rank). Each rank's output goes to `rank{r}.log`; rank 0's log is echoed to the caller's stdout.
On Linux the ranks are forked by a warm helper instead (warm.py: it has torch imported already and
never touches CUDA; FSDP_MINI_WARM_START=0 turns it off), each set up as the fresh process would be.

When a rank fails, the caller stops the others and raises `LaunchError` naming the rank that failed
*first*: peers that merely lost their partner ("Connection closed by peer") are consequences, not
causes. Ranks stopped for taking too long raise `LaunchTimeoutError`, which says which rule fired.

Files: core (launch, run_with_torchrun), inputs (argument checks, pickling), files (the launch
folder and its lock), procs (start, watch, stop), warm and zygote (warm start), failures and text
(the error), rank_entry (the rank side: ``python -m fsdp_mini.launcher.rank_entry``). The same training
function runs under torchrun through `run_with_torchrun`; torchrun_cell starts torchrun itself
from a notebook cell, bounded, and stops its whole process tree. interactive and keeper: ranks that stay
alive across notebook cells (``%%px``, ipyparallel engines), ended by a keeper process once the
kernel is gone. May import: the algorithm (``file_lock``)
and ``models``; never telemetry, plots, widgets, the lab kit or the jobs.
"""

from .core import init_group, launch, rank_device, run_with_torchrun
from .failures import LaunchError, LaunchTimeoutError

__all__ = ["launch", "rank_device", "run_with_torchrun", "init_group", "LaunchError",
           "LaunchTimeoutError"]
