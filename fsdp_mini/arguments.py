"""A public function's arguments, checked by name before it does anything.

Every public function and command of the kit checks what it is given here, so that a wrong type
or range is one clear error naming the argument, never an internal crash later, and never a
value taken for what it is not::

    >>> flag("plan(checkpointing)", "False")
    Traceback (most recent call last):
    TypeError: plan(checkpointing) must be True or False, got 'False' (a str)
    >>> count("plan(params)", 7.5, unit="parameters", scale_hint=1e9)
    Traceback (most recent call last):
    ValueError: plan(params) must be a whole number of parameters, got 7.5: did you mean 7.5e9?

Note: a bool is an int to Python (``True + True == 2``), and a string is truthy whatever it
says ("False" is true), so both are refused wherever a number or a flag is meant: a user who
wrote ``checkpointing="False"`` means False, and guessing would be worse than asking.
"""

from __future__ import annotations

import math
from numbers import Integral, Real


def _kind(value) -> str:
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def flag(name: str, value) -> bool:
    """``value`` if it is ``True`` or ``False``; a TypeError naming ``name`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({_kind(value)})")
    return value


def number(name: str, value, *, unit: str = "", above: float | None = None,
           at_least: float | None = None, at_most: float | None = None,
           below: float | None = None, example: str = "") -> float:
    """``value`` as a finite float within the bounds given; TypeError for what is not a real
    number (a str, None, a bool), ValueError for one out of range (nan and inf included)."""
    what = f"a number{' of ' + unit if unit else ''}"
    bounds = [f"> {above:g}" if above is not None else "",
              f">= {at_least:g}" if at_least is not None else "",
              f"<= {at_most:g}" if at_most is not None else "",
              f"< {below:g}" if below is not None else ""]
    wanted = " ".join([what, " and ".join(b for b in bounds if b)]).strip()
    wanted += f" (e.g. {example})" if example else ""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be {wanted}, got {value!r} ({_kind(value)})")
    x = float(value)
    if not math.isfinite(x) or (above is not None and not x > above) \
            or (at_least is not None and not x >= at_least) \
            or (at_most is not None and not x <= at_most) or (below is not None and not x < below):
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return x


def count(name: str, value, *, at_least: int = 1, at_most: int | None = None, unit: str = "",
          scale_hint: float | None = None) -> int:
    """``value`` as a whole number within the bounds; a float is taken only when it is whole
    (``7e9``). A fraction is refused, asking what was meant when ``scale_hint`` says how such
    counts are usually written (``7.5`` with 1e9: "did you mean 7.5e9?")."""
    what = f"a whole number{' of ' + unit if unit else ''}"
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be {what} >= {at_least}, got {value!r} ({_kind(value)})")
    if not isinstance(value, Integral):
        x = float(value)
        if not math.isfinite(x) or not x.is_integer():
            meant = (f": did you mean {x:g}e{int(math.log10(scale_hint))}?"
                     if scale_hint and math.isfinite(x) and 0 < x < 1000 else "")
            raise ValueError(f"{name} must be {what}, got {value!r}{meant}")
    n = int(value)
    if n < at_least or (at_most is not None and n > at_most):
        # Note: the upper bound is named only when it was passed (a limit far above any real
        # value is noise beside a 0)
        limits = f">= {at_least}" + (f" and <= {at_most}" if n >= at_least else "")
        raise ValueError(f"{name} must be {what} {limits}, got {value!r}")
    return n


def text(name: str, value, *, empty_ok: bool = False) -> str:
    """``value`` if it is a str (non-empty unless ``empty_ok``) holding no NUL character."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {value!r} ({_kind(value)})")
    if not value and not empty_ok:
        raise ValueError(f"{name} must not be empty")
    if "\x00" in value:
        raise ValueError(f"{name} holds a NUL character (\\x00), which no file name, "
                         f"environment variable or command line can carry: {value!r}")
    return value


def choice(name: str, value, options) -> object:
    """``value`` if it is one of ``options`` (compared as given, so ``"1"`` is not ``1``)."""
    options = list(options)
    if not any(value == o and type(value) is type(o) for o in options):
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value
