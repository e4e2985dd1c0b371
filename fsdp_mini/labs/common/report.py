"""What a checker tells the learner: each thing it checked, right or wrong, in plain words.

    result = CheckResult("your ring all-reduce")
    result.ok("every rank holds the sum of all ranks' tensors")
    result.wrong("each rank sent 24 B, but a ring sends 2(N-1)/N x 32 B = 48 B",
                 hint="did every rank forward what it received, N-1 times in each phase?")
    result          # shows ✔/✘ lines in the notebook; result.passed is False here

In the kit's CI (``CI=true``) a failed check raises, so a lab whose reference solution stops
passing its checker fails the build.

A verdict says what gave it: a checker marked ``@verdict_of_check`` records its own name
(``result.checker``) and a digest of the answer it checked (``result.answer``), so that a grade
can be bound to the task and the answer that produced it (the assessment refuses a verdict of
another task's checker).
"""

from __future__ import annotations

import functools
import hashlib
import html
import inspect
import marshal
from dataclasses import dataclass, field

from .config import in_ci


class CheckFailed(AssertionError):
    """A checker found something wrong (raised in CI, or by ``result.raise_if_wrong()``)."""


@dataclass
class CheckResult:
    what: str
    lines: list[tuple[bool, str, str]] = field(default_factory=list)  # (ok, message, hint)
    facts: dict = field(default_factory=dict)  # figures measured while checking, for the lab
    checker: str = ""  # the checker that gave this verdict ("check_choose_config")
    answer: str = ""   # a digest of the answer it checked (answer_digest)

    def ok(self, message: str) -> "CheckResult":
        self.lines.append((True, message, ""))
        return self

    def wrong(self, message: str, hint: str = "") -> "CheckResult":
        self.lines.append((False, message, hint))
        return self

    def check(self, condition: bool, right: str, wrong: str, hint: str = "") -> bool:
        """Record ``right`` if ``condition`` holds, else ``wrong`` (with a hint); return it."""
        (self.ok(right) if condition else self.wrong(wrong, hint))
        return bool(condition)

    @property
    def passed(self) -> bool:
        return bool(self.lines) and all(ok for ok, _, _ in self.lines)

    def raise_if_wrong(self) -> "CheckResult":
        if not self.passed:
            raise CheckFailed(str(self))
        return self

    def finish(self) -> "CheckResult":
        """Print nothing more; in CI, a failure fails the notebook."""
        if in_ci():
            self.raise_if_wrong()
        return self

    def __str__(self) -> str:
        head = (f"✔ {self.what}: all checks passed" if self.passed
                else f"✘ {self.what}: not yet right")
        body = [f"  {'✔' if ok else '✘'} {msg}" + (f"\n      hint: {hint}" if hint else "")
                for ok, msg, hint in self.lines]
        return "\n".join([head] + body)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#2a7d2a" if self.passed else "#b3261e"
        rows = "".join(
            f'<div style="margin-left:1em">{"✔" if ok else "✘"} {html.escape(msg)}'
            + (f'<br><span style="margin-left:1.5em;color:#555">hint: {html.escape(hint)}'
               f'</span>' if hint else "") + "</div>"
            for ok, msg, hint in self.lines)
        verdict = "all checks passed" if self.passed else "not yet right"
        return (f'<div style="font-family:system-ui,sans-serif"><b style="color:{color}">'
                f'{"✔" if self.passed else "✘"} {html.escape(self.what)}: {verdict}</b>{rows}</div>')


def verdict_of_check(check):
    """Mark a checker ``check(answer, ...)``: its CheckResult then names the checker and holds
    the digest of ``answer`` as it was when checked, and the verdict is kept for the instructor
    (:mod:`fsdp_mini.labs.common.progress`)."""
    @functools.wraps(check)
    def run(answer, *args, **kwargs):
        from .progress import record_verdict
        digest = answer_digest(answer)
        result = check(answer, *args, **kwargs)
        result.checker, result.answer = check.__name__, digest
        record_verdict(result, check.__name__, check.__module__)
        return result
    return run


def answer_digest(obj) -> str:
    """16 hex digits that change when the code of ``obj`` (a function or class) changes."""
    try:
        text = inspect.getsource(obj).encode()
    except (OSError, TypeError):
        text = _compiled(obj)
    return hashlib.sha256(text).hexdigest()[:16]


def _compiled(obj) -> bytes:
    """What ``obj`` runs, where its source cannot be read: its code, or its methods' code."""
    code = getattr(obj, "__code__", None)
    if code is not None:
        return marshal.dumps(code)
    if isinstance(obj, type):
        return b"".join(name.encode() + _compiled(v) for name, v in sorted(vars(obj).items())
                        if callable(v) and hasattr(v, "__code__"))
    return repr(obj).encode()
