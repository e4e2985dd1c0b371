"""Lab 05, FSDP from scratch: ``checks.py`` (the checkers), ``scaffold.py`` (the learner's unit
driving the kit's FSDP). May import :mod:`fsdp_mini.labs.common` and the engine."""
from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
