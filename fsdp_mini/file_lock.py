"""One job at a time: an exclusive lock on a file that names its owner.

A launch's ``log_dir`` and a checkpoint being saved are each used by one job at a time; a second
job is refused at once with a message naming the first::

    fd = take_lock("ckpt.lock", "checkpoint save")     # LockHeld: pid 4242 on node1 since 21:40:01
    ...                                                # the job's work
    release_lock("ckpt.lock", fd)                      # the file is removed

Note: the lock is an ``flock``, which the kernel drops when its owner dies, so a lock file left by
a killed job is simply taken over; an flock taken through another ``open()`` conflicts within
one process too, so two threads (or two cells of one kernel) are kept apart as well. The file
holds one JSON line naming the owner; a file of that name holding anything else is not ours and
is never overwritten.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

_MARK = "fsdp_mini lock"


class LockHeld(RuntimeError):
    """The lock is held by another job (``owner``: what its file says, ``{}`` if not yet
    written), or (``foreign``) the file of that name is not a lock of the kit."""

    def __init__(self, path: str, owner: dict, foreign: bool = False):
        self.path, self.owner, self.foreign = path, owner, foreign
        self.same_process = (owner.get("pid") == os.getpid()
                             and owner.get("host", socket.gethostname()) == socket.gethostname())
        super().__init__(f"{path} is not a lock file of fsdp_mini" if foreign
                         else f"{path} is locked by {self.describe()}")

    def describe(self) -> str:
        """'another checkpoint save (pid 4242 on node1, since 2026-12-01 21:40:01)'."""
        o = self.owner
        if not o:
            return "another job (starting up)"
        where = "".join(f", {k} {o[k]}" if k == "since" else f" on {o[k]}"
                        for k in ("host", "since") if k in o)
        return f"another {o.get('purpose', 'job')} (pid {o.get('pid')}{where})"


def take_lock(path, purpose: str) -> int:
    """Lock ``path`` (created if absent) for this process; return the descriptor to release."""
    path = os.fspath(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise LockHeld(path, owner or {}) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # Note: unlinked by a job that just ended; lock the new file instead
    owner = _read_owner(fd)
    if owner is None:  # Note: a file of the user's that happens to have this name: hands off
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise LockHeld(path, {}, foreign=True)
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps({"mark": _MARK, "pid": os.getpid(), "host": socket.gethostname(),
                              "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "purpose": purpose}) + "\n").encode())
    return fd


def release_lock(path, fd: int) -> None:
    # Note: unlink before close, so the next job creates a fresh lock file; one that opened
    # this file just before the unlink sees it is gone (_same_file) and retries.
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    os.close(fd)


def _read_owner(fd: int) -> dict | None:
    """The owner written in the file: {} for an empty (new) file, None for a foreign file."""
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not text:
        return {}
    if text.isdigit():  # Note: the launcher's older lock files held the pid alone
        return {"pid": int(text), "purpose": "launch"}
    try:
        owner = json.loads(text)
    except ValueError:
        return None
    return owner if isinstance(owner, dict) and owner.get("mark") == _MARK else None


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
