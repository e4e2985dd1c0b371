"""Lab 10, to production: ``checks.py``, the check of ``port_to_fsdp2``. May import:
:mod:`fsdp_mini.labs.common` and the engine (the debug tools, the launcher), never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
