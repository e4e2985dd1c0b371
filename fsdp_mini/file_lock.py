"""One job at a time: an exclusive lock on a file that names its owner.

A launch's ``log_dir`` and a checkpoint being saved are each used by one job at a time; a second
job is refused at once with a message naming the first::

    fd = take_lock("ckpt.lock", "checkpoint save")     # LockHeld: pid 4242 on node1 since 21:40:01
    ...                                                # the job's work
    release_lock("ckpt.lock", fd)                      # the file is removed

Note: the lock is an ``flock``, which the kernel drops when its owner dies, so a lock file left by
a killed job is simply taken over; an flock taken through another ``open()`` conflicts within
one process too, so two threads (or two cells of one kernel) are kept apart as well. A lock file
is born with its owner's line already in it (written under a name of its own, then linked into
place), so a file of that name that does not hold the kit's mark, empty or not, is never the
kit's: it is refused, never overwritten or removed.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
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
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = _create_marked(path, purpose)
            if fd is None:
                continue  # Note: another job created it a moment ago: lock that one
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise LockHeld(path, owner or {}) from None  # Note: held, so some job's
        if _same_file(fd, path):
            break
        os.close(fd)  # Note: unlinked by a job that just ended; lock the new file instead
    if _read_owner(fd) is None:  # Note: a file of the user's that happens to have this name
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise LockHeld(path, {}, foreign=True)
    os.ftruncate(fd, 0)
    os.pwrite(fd, _owner_line(purpose), 0)
    return fd


def release_lock(path, fd: int) -> None:
    # Note: unlink before close, so the next job creates a fresh lock file; one that opened
    # this file just before the unlink sees it is gone (_same_file) and retries. Only our own
    # file is unlinked: one put in its place meanwhile is left alone.
    try:
        if _same_file(fd, os.fspath(path)):
            os.remove(path)
    except FileNotFoundError:
        pass
    os.close(fd)


def _owner_line(purpose: str) -> bytes:
    return (json.dumps({"mark": _MARK, "pid": os.getpid(), "host": socket.gethostname(),
                        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "purpose": purpose}) + "\n").encode()


def _create_marked(path: str, purpose: str) -> int | None:
    """A new lock file at ``path`` that holds the owner's line from its first instant; its
    descriptor, or None when a file of that name appeared meanwhile."""
    draft = f"{path}.{secrets.token_hex(6)}.new"
    fd = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, _owner_line(purpose))
        os.link(draft, path)
    except FileExistsError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.remove(draft)
    return fd


def _read_owner(fd: int) -> dict | None:
    """The owner written in the file, or None for a file that is not a lock of the kit."""
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
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
