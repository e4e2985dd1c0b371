"""Each check's verdict, kept beside the notebook for the instructor (``fsdp-mini progress``).

A public checker (``@verdict_of_check``) appends one JSON line to ``.fsdp-mini-progress.jsonl`` in
the kernel's folder (the notebook's: ``~/work`` in the workshop's container) each time it runs::

    {"time": "2026-12-03T10:41:07+00:00", "user": "learner (03_ddp.ipynb)", "lab": "03",
     "check": "check_ddp", "what": "your DDP ...", "passed": false, "said": "at world size 2 ...",
     "answer": "9f2c..."}

``user`` is who ran it, as far as the kernel can tell: ``FSDP_MINI_ATTENDEE`` where the attendee
set it (``%env FSDP_MINI_ATTENDEE=ada`` in the notebook), else the login (``JUPYTERHUB_USER``,
``USER``: ``learner`` for everyone in the workshop's container), followed by the notebook the
check ran in where JupyterLab names it (``JPY_SESSION_NAME``): two attendees of a team who each
work in their own copy of a lab are two users; at one notebook, they are one.

Nothing else of the learner's is kept (not their code: a digest of it). Nothing is written in the
kit's CI or when the reference solutions run (``CI=true``, ``FSDP_MINI_SOLUTIONS=1``: that is no
one's progress), nor with ``FSDP_MINI_PROGRESS=0``; ``FSDP_MINI_PROGRESS_DIR`` names another
folder. A folder that cannot be written leaves the check as it is: progress is never in the way.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from .exercise import use_solutions

PROGRESS_FILE = ".fsdp-mini-progress.jsonl"


def progress_file() -> Path | None:
    """Where this kernel's verdicts go, or None when none are kept."""
    if use_solutions() or os.environ.get("FSDP_MINI_PROGRESS", "1") == "0":
        return None
    return Path(os.environ.get("FSDP_MINI_PROGRESS_DIR") or Path.cwd()) / PROGRESS_FILE


def _user() -> str:
    """Who ran the check: the attendee's name, else the login, with the notebook's name."""
    who = (os.environ.get("FSDP_MINI_ATTENDEE", "").strip() or os.environ.get("JUPYTERHUB_USER")
           or os.environ.get("USER") or "")
    notebook = os.path.basename(os.environ.get("JPY_SESSION_NAME", "").rstrip("/"))
    if notebook:
        who = f"{who} ({notebook})" if who else notebook
    return who[:120]


def record_verdict(result, checker: str, module: str) -> None:
    """Append ``result``'s verdict (one line, one write: appends of two kernels never mix)."""
    path = progress_file()
    if path is None:
        return
    wrong = [msg for ok, msg, _ in result.lines if not ok]
    lab = next((part[3:] for part in module.split(".") if part.startswith("lab")
                and part[3:].isdigit()), "")
    line = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "user": _user(),
            "lab": lab, "check": checker, "what": result.what, "passed": result.passed,
            "said": (wrong[0] if wrong else "all checks passed")[:300],
            "answer": getattr(result, "answer", "")}
    data = (json.dumps(line, ensure_ascii=False) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass  # Note: a read-only folder must not break the learner's check
