"""Lab 09, debugging distributed training: hangs, seeds and data, clipping, and the tools of
real clusters.

``checks.py``: the checkers; ``runs.py``: the small net, its data, one process's answer and
what runs on the ranks. Section 5, torch's own tools tried on gloo ranks: ``cluster_tools.py``
(a job started with an environment variable set, its outcome kept; TORCH_DISTRIBUTED_DEBUG=DETAIL
and what it costs a step), ``flight_recorder.py`` (each rank's flight recorder dumped when it
fails, read, and analysed by torch's ``fr_trace``), ``stacks.py`` (every rank's Python stack
taken while a job hangs: faulthandler on SIGUSR1, py-spy where installed). May import:
:mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from . import cluster_tools, flight_recorder, stacks  # noqa: F401
from .checks import *  # noqa: F401,F403
from .checks import __all__ as _checks_all
from .cluster_tools import (DETAIL_ENV, NCCL_DEBUG_ENV, JobRun, backend_name, detail_overhead,
                            mismatched_all_reduce, nccl_all_reduce, run_job)
from .flight_recorder import (RECORDER_ENV, analyse_flight_recorder, first_divergence,
                              flight_recorder_on_gloo, read_dumps, recorded, who_is_behind)
from .stacks import HungJob, rank_thread, stacks_of_hung_job, where_it_waits

__all__ = _checks_all + [
    "DETAIL_ENV", "NCCL_DEBUG_ENV", "JobRun", "backend_name", "detail_overhead",
    "mismatched_all_reduce", "nccl_all_reduce", "run_job",
    "RECORDER_ENV", "analyse_flight_recorder", "first_divergence", "flight_recorder_on_gloo",
    "read_dumps", "recorded", "who_is_behind",
    "HungJob", "rank_thread", "stacks_of_hung_job", "where_it_waits",
]
