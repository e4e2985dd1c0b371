"""Lab 06, making FSDP fast: units, prefetch, reshard_after_forward, and the crossover bandwidth.

``checks.py``: the checker of the crossover prediction; ``runs.py``: the variants and the DDP/FSDP
sweep measured on the ranks. May import: :mod:`fsdp_mini.labs.common` and the engine, never another
lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
