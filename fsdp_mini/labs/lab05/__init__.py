"""Lab 05, FSDP from scratch: a unit that gathers, computes and reduce-scatters.

``checks.py``: the checkers; ``scaffold.py``: the unit with its flat buffer and hooks ready for the
learner's pieces. May import: :mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
