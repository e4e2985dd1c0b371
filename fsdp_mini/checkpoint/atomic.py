"""Writing a checkpoint folder: complete or absent, one save at a time, nothing else touched.

Saving, every rank (``CheckpointWriter``)::

    1. rank 0 checks the target and locks it (below), makes ckpt.tmp-<id>/; a broadcast tells
       every rank the id, or the error that every rank then raises: nothing was written
    2. each rank writes its file there as rankR.pt.part, then renames it to rankR.pt
    3. one all-reduce: every rank learns who failed to write (then all raise, nothing committed)
    4. rank 0 checks the files and the target again, writes metadata.json and commits: an older
       ckpt/ is renamed to ckpt.old-<id>/, ckpt.tmp-<id>/ to ckpt/, the old one is removed
    5. a broadcast of the outcome: nobody returns before the checkpoint exists

What a save may replace (step 1, and again just before the renames of step 4)::

    ckpt/ absent or empty                  written
    ckpt/ a checkpoint of the kit          replaced: it holds exactly the files its metadata lists
    anything else                          refused, nothing touched: a folder holding other files
                                           (notes.txt, data/), a file, a symbolic link, '.', '..'

The lock is ``ckpt.lock`` beside the folder (:mod:`fsdp_mini.file_lock`), held by rank 0 for the
whole save, so a second job saving to the same folder is refused at once, with the first named.
The temporary id comes from the operating system (``secrets``), never from torch's or Python's
random generators: a save changes no random state, and two jobs seeded alike get different ids.

A rank that dies before step 4 leaves ``ckpt/`` as it was, and ``ckpt.tmp-<id>/`` behind (the
next save removes it); renames within one folder are atomic, so a reader sees the old checkpoint
or the new one, never half of one.

What a save removes is only what a save made: a folder it created holds a mark of its own
(``.fsdp_mini-save``, naming that very folder), written before anything else, and a leftover is
removed only while it holds that mark and nothing but the kit's files. A folder of the user's is
never taken for a leftover by its name or its files: ``cp -r ckpt ckpt.old-1`` (a copy names
another folder in its mark, or has none) stays, as does a leftover the user put a file in. Only between the two renames of step 4 is ``ckpt/`` absent for
an instant (then ``ckpt.old-<id>/`` still holds the old one, and ``read_metadata`` says so).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from pathlib import Path

import torch

from ..comm.collectives import Comm
from ..file_lock import LockHeld, release_lock, take_lock
from .files import FORMAT, CheckpointError, fingerprint

# Note: the kit's own format and DCP's (its index and one data file per rank and writer thread)
_KIT_FILE = re.compile(r"((rank\d+|full)\.pt|metadata\.json)(\.part)?|(__\d+)?\.metadata(\.tmp)?|__\d+_\d+\.distcp")
MARK_FILE = ".fsdp_mini-save"  # in a folder a save made: {"mark": ..., "folder": its own name}
_MARK = "fsdp_mini checkpoint save"


class CheckpointWriter:
    """One save, on every rank: the temporary folder each rank writes into, and the commit."""

    def __init__(self, path, comm: Comm):
        self.comm, self._lock, self._settled = comm, None, False
        self.id = self._on_rank0(lambda: self._begin(path))
        self.path = target_folder(path)
        self.tmp = _aside(self.path, "tmp", self.id)

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        """Rank 0 unlocks; after a failure that every rank knows of (no rank writes any more) it
        also removes the temporary folder. A rank that died leaves it to the next save."""
        if self.comm.rank == 0:
            if kind is not None and self._settled:
                remove_if_made_by_a_save(self.tmp)
            self._unlock()

    def write(self, name: str, make) -> None:
        """Every rank: ``make()`` written as ``name`` into the temporary folder, complete or not
        at all; then every rank learns whether all ranks succeeded (all raise if not)."""
        error = None
        try:
            self.write_here(name, make())
        except Exception as e:  # noqa: BLE001  (re-raised below, once every rank knows)
            error = e
        failed = ranks_that_failed(self.comm, error is not None)
        self._settled = True  # every rank is done writing
        if error is not None:
            raise error
        if failed:
            raise CheckpointError(f"saving {self.path}: rank{'s' * (len(failed) > 1)} "
                                  f"{', '.join(map(str, failed))} could not write "
                                  f"{'their files' if len(failed) > 1 else 'its file'} (see "
                                  f"{'their errors' if len(failed) > 1 else 'its error'}); "
                                  f"nothing was committed, {self.path} is as it was")

    def write_here(self, name: str, obj) -> None:
        """This rank alone: ``obj`` into the temporary folder as ``name``, complete or not at all."""
        part = self.tmp / f"{name}.part"
        with open(part, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # Note: on disk before the rename makes it count
        os.replace(part, self.tmp / name)

    def on_rank0(self, work) -> None:
        """Rank 0 does ``work()`` inside the temporary folder (e.g. assembles ``full.pt``)."""
        self._on_rank0(work)

    def commit(self, files: list[str], meta: dict) -> None:
        """Rank 0 seals the folder and puts it in place; every rank waits for that."""
        self._on_rank0(lambda: self._seal(files, meta))

    # -- rank 0 ----------------------------------------------------------------------------------

    def _begin(self, path) -> str:
        target = target_folder(path)
        if target.parent.exists() and not target.parent.is_dir():
            raise CheckpointError(f"cannot save to {target}: {target.parent} is a file, not a "
                                  f"folder")
        lock = _lock_path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)  # missing parent folders are made
            self._lock = (lock, take_lock(lock, "checkpoint save"))
        except OSError as e:
            given = Path(path)
            raise CheckpointError(f"cannot save to {os.fspath(path)}: cannot write in its folder "
                                  f"{given.parent} ({e.strerror or e}); save to a folder you "
                                  f"can write to") from None
        except LockHeld as held:
            if held.foreign:
                raise CheckpointError(f"cannot save to {target}: {lock} exists and is not a lock "
                                      f"file of fsdp_mini; move it away, or save elsewhere") from None
            raise CheckpointError(f"cannot save to {target}: {held.describe()} is saving there "
                                  f"now; wait for it to finish, or save to another folder") from None
        try:
            check_replaceable(target)
            draw = secrets.token_hex(8)  # Note: the OS's randomness, not the user's generators
            _make_marked(_aside(target, "tmp", draw))
            _remove_leftovers(target, keep=draw)
        except BaseException:
            self._unlock()
            raise
        return draw

    def _seal(self, files: list[str], meta: dict) -> None:
        missing = [f for f in files if not (self.tmp / f).is_file()]
        if missing:
            raise CheckpointError(f"saving {self.path}: {missing} were not written; "
                                  f"nothing was committed")
        check_replaceable(self.path)  # Note: again: files may have been put there meanwhile
        meta = {"format": FORMAT, **meta, "files": {f: fingerprint(self.tmp / f) for f in files}}
        part = self.tmp / "metadata.json.part"
        part.write_text(json.dumps(meta, indent=1))
        os.replace(part, self.tmp / "metadata.json")
        old = _aside(self.path, "old", self.id)
        if self.path.exists():
            _write_mark(self.path, old.name)  # Note: marked before it is moved aside
            os.replace(self.path, old)
        os.replace(self.tmp, self.path)
        (self.path / MARK_FILE).unlink()  # a checkpoint holds what its metadata lists
        remove_if_made_by_a_save(old)
        self._unlock()

    def _unlock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            release_lock(*lock)

    def _on_rank0(self, work):
        """Rank 0 runs ``work``; every rank gets its text result, or raises its error (rank 0
        its own exception, the others a CheckpointError with its message)."""
        outcome = ""
        if self.comm.rank == 0:
            try:
                outcome = "ok:" + (work() or "")
            except BaseException as e:
                self._unlock()
                if self.comm.world_size > 1:
                    message = str(e) if isinstance(e, CheckpointError) else \
                        f"rank 0 failed: {type(e).__name__}: {e}"
                    _broadcast_text(self.comm, "error:" + message)
                raise
        outcome = _broadcast_text(self.comm, outcome)
        if outcome.startswith("error:"):
            raise CheckpointError(outcome.removeprefix("error:"))
        return outcome.removeprefix("ok:")


# -- where a save may write ------------------------------------------------------------------------

def target_folder(path) -> Path:
    """The absolute folder a save to ``path`` replaces; a clear error if ``path`` names none that
    a save could replace ('.', '..', '/', the working folder or a folder above it)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise CheckpointError(f"the checkpoint path must be a non-empty str or Path, got "
                              f"{path!r}")
    p = Path(path)
    folder = p.resolve() if p.name in ("", "..") else p.parent.resolve() / p.name
    cwd = Path.cwd().resolve()
    if folder == cwd or folder in cwd.parents:
        raise CheckpointError(f"cannot save a checkpoint to {os.fspath(path)!r}: that is "
                              f"{folder}, {'the working folder' if folder == cwd else 'above the working folder'}"
                              f", and a save replaces its folder whole; name a folder of its own, "
                              f"e.g. {os.path.join(os.fspath(path), 'ckpt')!r}")
    return folder


def check_replaceable(folder: Path) -> None:
    """A clear error unless replacing ``folder`` destroys nothing the kit did not write."""
    if folder.is_symlink():
        raise CheckpointError(f"cannot save to {folder}: it is a symbolic link (to "
                              f"{os.readlink(folder)}); save to the folder it points to, or "
                              f"remove the link")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise CheckpointError(f"cannot save to {folder}: it is a file, not a checkpoint folder, "
                              f"and saving would replace it; choose another path, or move the "
                              f"file away")
    others = foreign_entries(folder)
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise CheckpointError(f"cannot save to {folder}: it holds {shown}, which no checkpoint "
                              f"save wrote, and saving replaces the whole folder; save to a new "
                              f"folder (e.g. {folder / 'ckpt'}), or move them away")


def foreign_entries(folder: Path) -> list[str]:
    """What ``folder`` holds beyond a checkpoint of the kit ('data/' for a folder): [] for an
    empty folder or a checkpoint whose files are exactly those its metadata lists."""
    entries = sorted(os.listdir(folder))
    allowed = set()
    try:
        meta = json.loads((folder / "metadata.json").read_text())
        if isinstance(meta, dict) and meta.get("format") == FORMAT \
                and isinstance(meta.get("files"), dict):
            allowed = {"metadata.json", MARK_FILE, *meta["files"]}
    except (OSError, ValueError):
        pass  # no readable metadata: every entry is someone else's
    return [e + "/" if (folder / e).is_dir() else e for e in entries
            if e not in allowed or not (folder / e).is_file() or (folder / e).is_symlink()]


def _aside(target: Path, kind: str, draw: str) -> Path:
    return target.with_name(f"{target.name}.{kind}-{draw}")


def _lock_path(target: Path) -> Path:
    return target.with_name(f"{target.name}.lock")


def _remove_leftovers(target: Path, keep: str) -> None:
    """Folders of earlier saves that died (ckpt.tmp-<id>/, ckpt.old-<id>/), and only those: each
    must still hold its mark and nothing but the kit's files. Called while holding the lock."""
    pattern = re.compile(re.escape(target.name) + r"\.(tmp|old)-[0-9a-f]{16}")
    for leftover in target.parent.iterdir():
        if pattern.fullmatch(leftover.name) and not leftover.name.endswith(keep):
            remove_if_made_by_a_save(leftover)


def remove_if_made_by_a_save(folder: Path) -> bool:
    """Remove ``folder`` if a save made it: it holds the mark naming it, and only the kit's
    files. Anything else (a copy, a folder holding a file of the user's) stays."""
    if folder.is_symlink() or not folder.is_dir() or not _marked(folder):
        return False
    if not all(e.is_file() and not e.is_symlink() and (e.name == MARK_FILE
                                                      or _KIT_FILE.fullmatch(e.name))
               for e in folder.iterdir()):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _make_marked(folder: Path) -> None:
    """A new folder (never an existing one) holding the mark that names it."""
    folder.mkdir()
    _write_mark(folder, folder.name)


def _write_mark(folder: Path, name: str) -> None:
    part = folder / f"{MARK_FILE}.part"
    part.write_text(json.dumps({"mark": _MARK, "folder": name}))
    os.replace(part, folder / MARK_FILE)


def _marked(folder: Path) -> bool:
    try:
        mark = json.loads((folder / MARK_FILE).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(mark, dict) and mark.get("mark") == _MARK and mark.get("folder") == folder.name


# -- two small agreements between ranks -------------------------------------------------------------

def _broadcast_text(comm: Comm, text: str) -> str:
    """Rank 0's ``text`` on every rank (its length, then its bytes)."""
    if comm.world_size == 1:
        return text
    data = text.encode() if comm.rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=comm.device)
    comm.broadcast(size, label="checkpoint")
    buffer = (torch.tensor(list(data), dtype=torch.uint8) if comm.rank == 0
              else torch.zeros(int(size), dtype=torch.uint8)).to(comm.device)
    comm.broadcast(buffer, label="checkpoint")
    return bytes(buffer.cpu().tolist()).decode()


def ranks_that_failed(comm: Comm, failed: bool) -> list[int]:
    """The ranks that report a failure (one all-reduce of a flag per rank)."""
    flags = torch.zeros(comm.world_size, dtype=torch.int32, device=comm.device)
    flags[comm.rank] = int(failed)
    if comm.world_size > 1:
        comm.all_reduce(flags, label="checkpoint")
    return [r for r, f in enumerate(flags.tolist()) if f]
