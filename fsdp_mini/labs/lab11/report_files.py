"""The assessment's report files: whose report it is (the attendee's exact name, any script),
what its files are called (two attendees never share one), written atomically, and never over
another attendee's report."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import unicodedata
from pathlib import Path


def attendee_name(attendee: str | None = None) -> str:
    """``attendee`` if given (not blank), else ``$USER`` (or ``$USERNAME``), else "attendee"."""
    if attendee is not None:
        if not isinstance(attendee, str):
            raise TypeError(f"grade_assessment(attendee) must be the attendee's name, a str, got "
                            f"{attendee!r} (a {type(attendee).__name__})")
        if attendee.strip() and not attendee.isprintable():
            raise ValueError(f"grade_assessment(attendee) must be a name that can be read, got "
                             f"{attendee!r}")
    if attendee and attendee.strip():
        return unicodedata.normalize("NFC", attendee.strip())
    for name in (os.environ.get("USER"), os.environ.get("USERNAME")):
        if name and name.strip():
            return name.strip()
    return "attendee"


def report_stem(attendee: str) -> str:
    """The files' name: the name in letters of any script, digits and ``.-_``, then 8 hex digits
    of the exact name, so that two attendees never share a report.

    >>> report_stem("Ada Lovelace"), report_stem("山田太郎")
    ('assessment_report_Ada_Lovelace-76740216', 'assessment_report_山田太郎-6b0e1c8c')
    """
    safe = re.sub(r"[^\w.-]+", "_", attendee).strip("._")[:48] or "attendee"
    return f"assessment_report_{safe}-{hashlib.sha256(attendee.encode()).hexdigest()[:8]}"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half:
    a temporary file in the same folder, flushed to disk, then renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # Note: mkstemp's 0600 would hide the report from an instructor
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def _refuse_another_attendees(path: Path, attendee: str) -> None:
    """A report already at ``path`` must be this attendee's own (graded again), else refused."""
    if not path.exists():
        return
    try:
        owner = json.loads(path.read_text(encoding="utf-8")).get("attendee")
    except (OSError, ValueError, AttributeError):
        owner = None
    if owner != attendee:
        raise FileExistsError(f"{path} exists and is not {attendee!r}'s report"
                              f"{f' (it is the report of {owner!r})' if owner else ''}; it is kept "
                              f"as it is. Grade into another folder (folder=...)")
