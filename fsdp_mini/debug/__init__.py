"""Tools for looking into a distributed job from outside its code, on a laptop's gloo ranks as on
a cluster. ``watch``: what a training function did on each rank (rows fed, weights per step, the
step's collectives, what it printed) and where each rank waited when it hung; ``seen``: that as
a checker's observations, and two runs read side by side; ``small_data``: the debug net, its
batches and one process's answer (small data first). torch's own switches, started with a job's
environment (``cluster_tools``: ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` and what it costs,
``NCCL_DEBUG``); every rank's Python stack taken while a job hangs (``stacks``); the flight
recorder's dumps and torch's analyser (``flight_recorder``); the bytes any code's collectives
send, seen at torch's dispatcher (``dispatch_bytes``); one job under fsdp_mini and torch's DDP
and FSDP2 side by side (``four_jobs``); what FSDP2 made of a model and its optimizer
(``fsdp2_view``). May import: the algorithm, ``models`` and the launcher; never telemetry,
plots, widgets, the lab kit or the jobs.
"""

from .cluster_tools import (DETAIL_ENV, NCCL_DEBUG_ENV, JobRun, backend_name, detail_overhead,
                            mismatched_all_reduce, nccl_all_reduce, run_job)
from .dispatch_bytes import CollectiveBytes
from .flight_recorder import (RECORDER_ENV, analyse_flight_recorder, first_divergence,
                              flight_recorder_on_gloo, read_dumps, recorded, who_is_behind)
from .four_jobs import KINDS, build, hsdp_bytes, side_by_side
from .stacks import HungJob, rank_thread, stacks_of_hung_job, where_it_waits
from .seen import differs_only_where, observations, ratio, scale, watch_into
from .watch import Hung, PeerGone, Seen, run_watched, watch_training

__all__ = ["DETAIL_ENV", "NCCL_DEBUG_ENV", "JobRun", "backend_name", "detail_overhead",
           "mismatched_all_reduce", "nccl_all_reduce", "run_job", "CollectiveBytes",
           "RECORDER_ENV", "analyse_flight_recorder", "first_divergence",
           "flight_recorder_on_gloo", "read_dumps", "recorded", "who_is_behind", "KINDS", "build",
           "hsdp_bytes", "side_by_side", "HungJob", "rank_thread", "stacks_of_hung_job",
           "where_it_waits", "Hung", "PeerGone", "Seen", "run_watched", "watch_training",
           "differs_only_where", "observations", "ratio", "scale", "watch_into"]
