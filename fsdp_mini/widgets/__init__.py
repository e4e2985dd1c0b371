"""Live dashboards for a training job: memory per rank, bytes per collective, compute vs comm.

    dash = Dashboard()
    fsdp_mini.launch(train_gpt, 4, "fsdp", monitor=dash)     # shows itself, updates live

    cmp = Comparison()                                        # one view, several strategies
    for strategy in ("ddp", "zero1", "zero2", "fsdp"):
        fsdp_mini.launch(train_gpt, 4, strategy, monitor=cmp)

Both are plain ipywidgets 8 (HTML bars, one re-rendered PNG): no ipympl, no custom front-end, so
they update inside the running cell in JupyterLab and VS Code alike. ``launch`` calls
``start(world_size)``, then ``update(events)`` with each batch of new events, then
``finish(ok)``. Events are all kept in totals; the screen is redrawn at most every
``min_interval`` seconds. ``finish`` also displays a static matplotlib figure of the same panels
(as a PNG; the Figure stays in ``.figure``), for nbconvert, GitHub and slides, which have no live
widgets. May import: the algorithm, ``models``, the launcher, telemetry and plots; never the lab
kit or the jobs.
"""

from .comparison import Comparison
from .dashboard import Dashboard

__all__ = ["Comparison", "Dashboard"]
