"""What the labs use: one configuration cell, exercises with hidden solutions, and checkers that
say in plain words what is right and what is wrong.

    from fsdp_mini import labs
    cfg = labs.lab_config()                      # sizes for this machine (CI, laptop, GPU box)

    @labs.exercise("02_ring_all_reduce")         # CI runs the reference solution instead
    def ring_all_reduce(tensor, rank, world_size): ...

    labs.check_ring_all_reduce(ring_all_reduce)  # ✔/✘ lines, on several ranks

The kit is arranged by lab: everything about lab NN is in ``labNN/`` (its checkers in
``checks.py``, what it measures on the ranks in ``runs.py``, its scaffolding in ``scaffold.py``);
lab 11, the assessment, is in ``lab11/``. What every lab shares is in ``common/``: the
configuration cell, exercises, reports, running and comparing ranks, the interactive multi-rank
mode (ranks that stay alive across cells, ``%%px``) and the executed HTML copies of the labs
(``fsdp-mini render-labs``). May import: the engine (the algorithm, ``models``, the launcher,
telemetry, plots, widgets), never the jobs; a lab imports ``common/``, never another lab.
"""

from . import lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10, lab11
from ..launcher import interactive
from .common.config import LabConfig, in_ci, lab_config
from .common.configurations import describe, options_of
from .common.exercise import (exercise, load_solution, not_written_yet, show_solution,
                              yours_or_reference)
from ..launcher.interactive import *  # noqa: F401,F403
from .common.report import CheckFailed, CheckResult
from .lab00 import *  # noqa: F401,F403
from .lab01 import *  # noqa: F401,F403
from .lab02 import *  # noqa: F401,F403
from .lab03 import *  # noqa: F401,F403
from .lab04 import *  # noqa: F401,F403
from .lab05 import *  # noqa: F401,F403
from .lab06 import *  # noqa: F401,F403
from .lab07 import *  # noqa: F401,F403
from .lab08 import *  # noqa: F401,F403
from .lab09 import *  # noqa: F401,F403
from .lab10 import *  # noqa: F401,F403
from .lab11 import *  # noqa: F401,F403

_LABS = (lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10, lab11,
         interactive)
__all__ = (["LabConfig", "in_ci", "lab_config", "describe", "options_of", "exercise", "load_solution", "not_written_yet",
            "show_solution", "yours_or_reference", "CheckFailed", "CheckResult"]
           + [name for m in _LABS for name in m.__all__])
