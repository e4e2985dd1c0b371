"""Lab 10, to production: the same job under fsdp_mini and under torch's DDP and FSDP2.

``checks.py``: the comparison; ``four_jobs.py``: the four jobs; ``port_check.py``: the checker of
``port_to_fsdp2``; ``dispatch_bytes.py``: bytes seen at torch's dispatcher; ``torchrun_cell.py``:
torchrun from a cell. May import: :mod:`fsdp_mini.labs.common` and the engine, never another lab.
"""

from .checks import *  # noqa: F401,F403
from .checks import __all__  # noqa: F401
