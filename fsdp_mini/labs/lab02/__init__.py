"""Lab 02, collectives by hand: the ring all-reduce's checker (checks.py); its table and sweep
are the kit's (plots.collectives, telemetry.bandwidth). May import: labs.common, the engine."""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
