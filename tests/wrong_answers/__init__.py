"""Wrong answers a learner might write, one registry per lab, and what each checker says of them.

Each lab's module (``lab00.py`` … ``lab10.py``) holds ``WRONG``: a list of :class:`Wrong`, each a
plausible mistake in one exercise, the call that runs the lab's checker on it, and the words the
verdict must contain to *name* that mistake. A checker may judge a wrong answer three ways:

- ``passed``: the check passed it (a defect: the learner is taught the wrong algorithm);
- ``generic``: the check failed it, but its words do not name the mistake (a miss, reported);
- ``named``: the check failed it and said what was wrong.

``tests/test_wrong_answers.py`` asserts ``named`` for every entry; ``benchmarks/checker_sweep.py``
prints the counts per lab (caught / tried) for the closing notes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from fsdp_mini.labs import CheckFailed

LABS = ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10")


@dataclass(frozen=True)
class Wrong:
    exercise: str                  # the solution's name, e.g. "04_zero1"
    mistake: str                   # what the learner got wrong, in a few words
    run: Callable[[], object]      # runs the lab's checker on the wrong answer, returns its result
    names: tuple[str, ...]         # lower-case phrases; the verdict must contain every one

    def __str__(self) -> str:
        return f"{self.exercise}: {self.mistake}"


def verdict(wrong: Wrong) -> tuple[str, str]:
    """("passed" | "generic" | "named", the checker's text) for one wrong answer."""
    try:
        result = wrong.run()
    except CheckFailed as failed:          # under CI=true a failed check raises
        text = str(failed)
    else:
        text = str(result)
        if getattr(result, "passed", True):
            return "passed", text
    said = text.lower()
    return ("named" if all(p.lower() in said for p in wrong.names) else "generic"), text


def registry(lab: str) -> list[Wrong]:
    """Lab ``lab``'s wrong answers (an empty list for a lab not swept yet)."""
    try:
        module = importlib.import_module(f"wrong_answers.lab{lab}")
    except ModuleNotFoundError as missing:
        if missing.name != f"wrong_answers.lab{lab}":
            raise
        return []
    return list(module.WRONG)
