"""Lab 04, ZeRO-1 and ZeRO-2 grown from the learner's DDP: ``checks.py`` (the checkers),
``scaffold.py`` (``ZeroScaffold``). May import :mod:`fsdp_mini.labs.common` and the engine."""
from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
