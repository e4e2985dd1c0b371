"""Exercises: the learner writes a function; the kit checks it; solutions stay out of sight.

An exercise cell in a lab looks like this::

    @labs.exercise("03_average_gradients")
    def average_gradients(param, comm):
        ...                                   # your code

    labs.check_average_gradients(average_gradients)

``@labs.exercise(name)`` leaves your function as it is, except when the notebook runs in the kit's
CI (``CI=true``) or with ``FSDP_MINI_SOLUTIONS=1``: then the reference solution from
``labs/solutions/<name>.py`` takes its place, so CI runs every lab with working code. To see a
solution: ``labs.show_solution(name)``, or ``%load solutions/<name>.py`` in a cell.
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import in_ci

_REPO_SOLUTIONS = Path(__file__).resolve().parents[3] / "labs" / "solutions"


def solutions_dir() -> Path:
    """``labs/solutions`` next to the notebook, or in the kit's repository."""
    here = Path.cwd() / "solutions"
    return here if here.is_dir() else _REPO_SOLUTIONS


def solution_path(name: str) -> Path:
    path = solutions_dir() / f"{name}.py"
    if not path.is_file():
        known = sorted(p.stem for p in solutions_dir().glob("*.py"))
        raise ValueError(f"no solution named {name!r} in {solutions_dir()}; known: {known}")
    return path


def load_solution(name: str, attribute: str):
    """The object called ``attribute`` defined by ``labs/solutions/<name>.py``."""
    namespace = {"__name__": f"solution_{name}"}
    path = solution_path(name)
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    if attribute not in namespace:
        raise ValueError(f"{path} defines no {attribute!r}")
    return namespace[attribute]


def show_solution(name: str) -> None:
    """Print the reference solution of exercise ``name``."""
    path = solution_path(name)
    print(f"# {path}\n{path.read_text()}")


def use_solutions() -> bool:
    return in_ci() or os.environ.get("FSDP_MINI_SOLUTIONS") == "1"


def exercise(name: str):
    """Mark the learner's function (or class) as exercise ``name`` (see the module docstring)."""
    def mark(obj):
        if use_solutions():
            obj = load_solution(name, obj.__name__)
            # Note: said out loud, so "your ... passed" below is never read as praise of code
            # that did not run. To run small with your own code: labs.lab_config(world_size=2,
            # model="tiny") in the configuration cell, without CI=true.
            print(f"(CI=true or FSDP_MINI_SOLUTIONS=1: the reference solution of {name!r} runs "
                  f"in place of yours)")
        try:
            obj.exercise = name
        except (AttributeError, TypeError):
            pass
        return obj
    return mark


def yours_or_reference(check, name: str, *objects):
    """What the rest of a lab runs: your ``objects`` if ``check`` passed, else the references.

        predict = labs.yours_or_reference(check, "01_predict_peak", predict_peak)
        zero1, zero2 = ...                 # several objects of one exercise: a tuple back

    Note: the result goes to a *new* name on purpose. Your own function keeps its name, so running
    the check cell again after a fix checks your code, not the reference that stood in for it.
    """
    if not objects:
        raise TypeError("yours_or_reference(check, name, obj, ...): pass the object(s) to use")
    if check.passed:
        chosen = objects
    else:
        print(f"Yours does not pass its check yet: the rest of the lab runs the reference "
              f"solution of {name!r}. Fix yours, then run its check cell, this cell and the "
              f"cells below again.")
        chosen = tuple(load_solution(name, _name_of(obj)) for obj in objects)
    return chosen[0] if len(chosen) == 1 else chosen


def _name_of(obj) -> str:
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"yours_or_reference: {obj!r} has no __name__; pass the function or "
                        "class you wrote for the exercise")
    return name


def not_written_yet(obj) -> bool:
    """True for a stub whose body is only ``...`` or ``pass`` (an exercise not started)."""
    code = getattr(obj, "__code__", None)
    # Note: the bytecode of "return a constant" is the same whatever the constant: a stub is
    # the one whose only constants are None and its docstring.
    return (code is not None and code.co_code in _EMPTY_BODIES
            and set(code.co_consts) <= {None, obj.__doc__})


def _stub(): ...
def _stub_pass(): pass  # noqa: E704
def _stub_doc():
    """A docstring only."""
def _stub_doc_dots():
    """A docstring, then ``...``."""
    ...


_EMPTY_BODIES = {f.__code__.co_code for f in (_stub, _stub_pass, _stub_doc, _stub_doc_dots)}
