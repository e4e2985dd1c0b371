"""Lab 09, debugging distributed training: hangs, seeds and data, clipping.

``checks.py``: the checkers; ``runs.py``: the small net, its data, one process's answer and
what runs on the ranks. May import: :mod:`fsdp_mini.labs.common` and the engine, never
another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
