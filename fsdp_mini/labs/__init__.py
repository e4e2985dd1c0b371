"""What the labs use: one configuration cell, exercises with hidden solutions, and checkers that
say in plain words what is right and what is wrong.

    from fsdp_mini import labs
    cfg = labs.lab_config()                      # sizes for this machine (CI, laptop, GPU box)

    @labs.exercise("02_ring_all_reduce")         # CI runs the reference solution instead
    def ring_all_reduce(tensor, rank, world_size): ...

    labs.check_ring_all_reduce(ring_all_reduce)  # ✔/✘ lines, on several ranks

Each lab's checkers live in ``lab00.py`` ... ``lab10.py`` (what labs 04–05 share in
``checking.py``, lab 05's unit scaffolding in ``fsdp_scaffold.py``, the runs labs 06–10 measure in
``lab06_runs.py``, ``lab07_runs.py``, ``checkpoint_runs.py``, ``four_jobs.py``, lab 10's checker in
``port_check.py``); the assessment of lab 11 (the job, its grading, the report) in
``assessment.py``, its checkers in ``assessment_fit.py``, ``assessment_link.py``,
``assessment_train.py``, ``assessment_bytes.py`` and its runs in ``assessment_runs.py``; the
interactive multi-rank mode (ranks that stay alive across cells, ``%%px``) in ``interactive.py``;
executed HTML copies of the labs in ``render.py`` (``fsdp-mini render-labs``).
"""

from .config import LabConfig, in_ci, lab_config
from .exercise import exercise, load_solution, not_written_yet, show_solution, yours_or_reference
from .report import CheckFailed, CheckResult
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
from .assessment import *  # noqa: F401,F403
from .interactive import *  # noqa: F401,F403
from . import (assessment, interactive, lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07,
               lab08, lab09, lab10)

_LABS = (lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10, assessment,
         interactive)
__all__ = (["LabConfig", "in_ci", "lab_config", "exercise", "load_solution", "not_written_yet",
            "show_solution", "yours_or_reference", "CheckFailed", "CheckResult"]
           + [name for m in _LABS for name in m.__all__])
