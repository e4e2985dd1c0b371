"""Lab 08, checkpoints: resharding, saving atomically, resuming at another world size.

``checks.py``: the checker of the resharding exercise; ``runs.py``: the rank functions that save,
die while saving and resume. May import: :mod:`fsdp_mini.labs.common` and the engine, never another
lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
