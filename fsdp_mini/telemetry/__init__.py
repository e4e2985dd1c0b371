"""Telemetry: ranks stream what they do (memory, collectives, steps) to whoever watches.

Rank side, a :class:`Recorder` turns the engine's phase marks, the ledger's collectives and the
training loop's steps into events, and appends them to ``events_rank{r}.jsonl`` in one folder,
a batch at a time (at most ``1 / flush_seconds`` writes a second; nothing is dropped)::

    rec = Recorder.from_env(run="fsdp")          # the folder launch(..., monitor=...) watches
    model, opt = fsdp_mini.parallelize(model, "fsdp", units=..., recorder=rec)
    for step in range(steps):
        loss = ...; loss.backward(); opt.step(); opt.zero_grad()
        rec.step_end(loss)
    rec.close()

Caller side, whatever watches the folder, live or afterwards: ``launch(fn, n, monitor=...)``
with a :class:`LaunchFeed` (the dashboard is one), :class:`EventTail` to follow the files
yourself, or :func:`load_events` once the job is over (also for jobs started with torchrun:
set ``FSDP_MINI_EVENTS_DIR`` for them).

Events (one JSON object per line; times are Unix seconds; ``step`` is the ledger's step):

    meta        world_size, strategy, params, theory{sent_bytes_per_step, persistent_bytes},
                formulas{memory, sent}, units[{name, bytes}], device, backend,
                [link{bandwidth_gbs, latency_us}] (a simulated link, see fsdp_mini.comm.link)
    memory      label, [unit, phase], total_bytes, by_category{6 categories}, [cuda{...}]
    collective  op, unit, phase, group, label, payload_bytes, sent_bytes, start, end,
                waited (when this rank began to wait: start for a blocking one, later for an
                asynchronous one, which ran while the rank computed),
                [sim_start, sim_end] (with a simulated link: when the link carried it)
    step        loss, start, end
    end         (the rank stopped recording)

Every event also carries ``type``, ``rank``, ``step`` and ``run``.

``bandwidth.py`` measures rather than records: ``all_reduce_sweep`` times all-reduces of many
sizes on live ranks, ``bandwidth_summary`` reads the latency floor and n½ off its rows.

May import: the algorithm and ``models``; never the launcher, plots, widgets, the lab kit or
the jobs (the launcher hands a watcher the events; telemetry never starts ranks).
"""

from .bandwidth import all_reduce_sweep, bandwidth_summary
from .events import EventLog, EventTail, LaunchFeed, load_events
from .live_memory import LiveMemory
from .recorder import EVENTS_DIR_ENV, Recorder
from .runstate import Runs, RunState
from .units import fmt_bytes, fmt_rate, fmt_seconds

__all__ = ["EVENTS_DIR_ENV", "EventLog", "EventTail", "LaunchFeed", "LiveMemory", "Recorder",
           "RunState", "Runs", "all_reduce_sweep", "bandwidth_summary", "fmt_bytes", "fmt_rate",
           "fmt_seconds", "load_events"]
