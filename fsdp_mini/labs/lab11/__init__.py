"""Lab 11, the assessment: an unseen job taken to a configuration that fits, trains and is graded.

``assessment.py``: the job, the grading and the report; ``fit.py``, ``link.py``, ``train.py``,
``bytes.py``: the four tasks' checkers; ``runs.py``: the job's runs on the ranks;
``report_files.py``: the report's files. May import: :mod:`fsdp_mini.labs.common` and the
engine, never another lab.
"""

from .assessment import *  # noqa: F401,F403
from .assessment import __all__  # noqa: F401
