"""Wrong answers a learner might write, one registry per lab, and what each checker says of them.

Each lab's module (``lab00.py`` … ``lab11.py``) holds ``WRONG``: a list of :class:`Wrong`, each a
plausible mistake in one exercise, the wrong answer itself, and the words the verdict must
contain to *name* that mistake. A checker may judge a wrong answer three ways:

- ``passed``: the check passed it (a defect: the learner is taught the wrong algorithm);
- ``generic``: the check failed it, but its words do not name the mistake (a miss, reported);
- ``named``: the check failed it and said what was wrong.

The answers of one exercise are judged together, in one launch per world size, by the lab's own
check (``JUDGES[exercise]`` of ``fsdp_mini/labs/labNN/checks.py``: the code path of the public
checker, for many answers at once). An entry whose answer needs its own call (other arguments
than the notebook's) gives ``run`` instead. The catalogue is a *test set* of the checkers: no
checker knows it. ``tests/test_wrong_answers.py`` asserts ``named`` for every entry;
``benchmarks/checker_sweep.py`` prints the counts per lab (caught / tried).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache
from typing import Callable

from fsdp_mini.labs import CheckFailed

LABS = ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11")


@dataclass(frozen=True, eq=False)
class Wrong:
    exercise: str                  # the solution's name, e.g. "04_zero1"
    mistake: str                   # what the learner got wrong, in a few words
    answer: object = None          # the learner's function, class or pair, as the check takes it
    names: tuple[str, ...] = ()    # lower-case phrases; the verdict must contain every one
    run: Callable[[], object] | None = None   # instead of answer: a call of the public checker
    known_miss: str = ""           # why the checker still passes it or does not name it (xfail)

    def __str__(self) -> str:
        return f"{self.exercise}: {self.mistake}"


def judge(exercise: str) -> Callable[[list], list]:
    """The lab's judge of many answers to ``exercise``: the ``JUDGES`` table of its
    ``checks.py``, or of the lab's module that has it (lab 11: one module per task)."""
    package = importlib.import_module(f"fsdp_mini.labs.lab{exercise[:2]}")
    names = ["checks"] + [m.name for m in pkgutil.iter_modules(package.__path__)]
    for name in dict.fromkeys(names):
        try:
            module = importlib.import_module(f"{package.__name__}.{name}")
        except ModuleNotFoundError:
            continue
        if exercise in getattr(module, "JUDGES", {}):
            return module.JUDGES[exercise]
    raise KeyError(f"no JUDGES entry for {exercise} in {package.__name__}")


@cache
def _judged(exercise: str) -> dict:
    """Every registry answer to ``exercise``, judged in one batch: {id(Wrong): result}."""
    batch = [w for lab in LABS for w in registry(lab)
             if w.exercise == exercise and w.run is None]
    return dict(zip(map(id, batch), judge(exercise)([w.answer for w in batch])))


def verdict(wrong: Wrong) -> tuple[str, str]:
    """("passed" | "generic" | "named", the checker's text) for one wrong answer."""
    try:
        result = wrong.run() if wrong.run is not None else _judged(wrong.exercise)[id(wrong)]
    except CheckFailed as failed:          # under CI=true a failed check raises
        text = str(failed)
    else:
        text = str(result)
        if getattr(result, "passed", True):
            return "passed", text
    said = text.lower()
    return ("named" if all(p.lower() in said for p in wrong.names) else "generic"), text


@cache
def registry(lab: str) -> tuple[Wrong, ...]:
    """Lab ``lab``'s wrong answers (none for a lab not swept yet)."""
    try:
        module = importlib.import_module(f"wrong_answers.lab{lab}")
    except ModuleNotFoundError as missing:
        if missing.name != f"wrong_answers.lab{lab}":
            raise
        return ()
    return tuple(module.WRONG)
