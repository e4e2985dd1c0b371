"""Lab 00, setup: the ranks start, and the mean of the ranks with one all-reduce.

``checks.py``: the checker of ``mean_of_ranks``. May import: :mod:`fsdp_mini.labs.common` and the
engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
