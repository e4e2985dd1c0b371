"""Lab 02, collectives by hand: what each rank holds before and after, and a ring all-reduce.

``checks.py``: the checker of ``ring_all_reduce``; ``bandwidth.py``: the all-reduce sweep, time
against message size. May import: :mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
