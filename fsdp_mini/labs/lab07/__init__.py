"""Lab 07, fitting bigger models: mixed precision, checkpointing, no_sync, meta init, the planner.

``checks.py``: the checker of ``cheapest_fit``; ``runs.py``: the fsdp options measured side by
side. May import: :mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
