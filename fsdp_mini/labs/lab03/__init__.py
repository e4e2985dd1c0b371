"""Lab 03, DDP from scratch: a gradient hook, then buckets.

``checks.py``: the checkers; ``scaffold.py``: what turns the learner's DDP pieces into strategies
of the kit. May import: :mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
