"""Lab 00, setup: the mean of the ranks (checks.py). May import: labs.common and the engine."""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
