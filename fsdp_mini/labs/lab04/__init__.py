"""Lab 04, ZeRO-1 and ZeRO-2 grown from the learner's DDP.

``checks.py``: the checkers and the measurements; ``scaffold.py``: ``ZeroScaffold``, what ZeRO-1
and ZeRO-2 share, ready made. May import:
:mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
