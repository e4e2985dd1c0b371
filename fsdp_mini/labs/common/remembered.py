"""The reference solution's records, remembered on disk between kernels and runs.

A check runs the reference beside the learner's answer on every configuration; the reference's
records depend only on the code (the kit, the labs' solutions, torch), so they are kept in
``~/.cache/fsdp_mini/references/`` (``$XDG_CACHE_HOME``), under a key made of all that code and
the configuration: the first check of a machine pays for the reference, later ones (a re-run
cell, a new kernel, the next attendee on the box) only for the answer. Any change to the kit,
a solution or torch makes another key. ``FSDP_MINI_REFERENCE_CACHE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

_PACKAGE = Path(__file__).resolve().parents[2]            # fsdp_mini/
_SOLUTIONS = _PACKAGE.parent / "labs" / "solutions"


def folder() -> Path | None:
    if os.environ.get("FSDP_MINI_REFERENCE_CACHE", "1") == "0":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fsdp_mini" / "references"


@cache
def _code_digest() -> str:
    """sha256 of every source file of the kit and of the solutions, torch's and Python's
    versions: what a reference's records depend on."""
    h = hashlib.sha256(f"{torch.__version__} {sys.version}".encode())
    for path in sorted(_PACKAGE.rglob("*.py")) + sorted(_SOLUTIONS.glob("*.py")):
        h.update(str(path.relative_to(_PACKAGE.parent)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def key(check: str, cfg) -> str:
    return hashlib.sha256(f"{_code_digest()} {check} {sorted(cfg.items())!r}".encode()
                          ).hexdigest()[:32]


def load(check: str, cfg):
    where = folder()
    if where is None:
        return None
    try:
        return pickle.loads((where / f"{key(check, cfg)}.pkl").read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None


def save(check: str, cfg, record) -> None:
    """Atomically (a temporary file, then a rename); a folder that cannot be written is fine."""
    where = folder()
    if where is None or record.error is not None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(record, f)
        os.replace(tmp, where / f"{key(check, cfg)}.pkl")
    except OSError:
        pass
