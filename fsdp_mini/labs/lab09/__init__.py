"""Lab 09, debugging distributed training: ``checks.py``, the checks of its three exercises and
of parity. May import: :mod:`fsdp_mini.labs.common` and the engine (the kit's debug tools, which
section 5 uses: :mod:`fsdp_mini.debug`), never another lab."""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
