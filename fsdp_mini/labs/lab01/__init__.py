"""Lab 01, where the memory goes on one device: measure a step, draw it, bound the peak.

``runs.py``: the step measured and its timeline; ``checks.py``: the checker of the peak predictor.
May import:
:mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
