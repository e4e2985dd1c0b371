"""Checkpoint folders on disk: complete or absent, and read back with clear errors.

A checkpoint is a folder (see :mod:`fsdp_mini.checkpoint` for what the files hold)::

    ckpt/metadata.json     kind, world size, strategy, units, step; each file's bytes and sha256
    ckpt/rank0.pt ...      sharded: what each rank holds
    ckpt/full.pt           full: the whole model and optimizer, under the original names

Saving, every rank (``CheckpointWriter``)::

    1. agree on a fresh id (rank 0 draws it, a broadcast)      ckpt.tmp-<id>/
    2. each rank writes its file as rankR.pt.part, then renames it to rankR.pt
    3. barrier: every file is complete
    4. rank 0 checks the files, writes metadata.json, and commits: an older ckpt/ is renamed to
       ckpt.old-<id>/, ckpt.tmp-<id>/ to ckpt/, and the old one is removed
    5. barrier: nobody returns before the checkpoint exists

A rank that dies before step 4 leaves ``ckpt/`` as it was (the next save removes the leftover
``ckpt.tmp-*``); renames within one folder are atomic, so a reader sees the old checkpoint or the
new one, never half of one. Only between the two renames of step 4 is ``ckpt/`` absent for an
instant (then ``ckpt.old-<id>/`` still holds the old one, and :func:`read_metadata` says so).
Files are read with ``torch.load(..., weights_only=True)``: tensors and plain containers only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from .comm import Comm

FORMAT = "fsdp_mini.checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing, truncated, corrupt or for another model."""


class CheckpointWriter:
    """One save: the temporary folder every rank writes into, and the commit (see above)."""

    def __init__(self, path, comm: Comm):
        self.path, self.comm = Path(path), comm
        draw = torch.randint(0, 2**62, (1,), dtype=torch.int64) if comm.rank == 0 else \
            torch.zeros(1, dtype=torch.int64)
        comm.broadcast(draw, label="checkpoint")  # Note: one folder name on every rank
        self.id = f"{int(draw):x}"
        self.tmp = self.path.with_name(f"{self.path.name}.tmp-{self.id}")
        self.tmp.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, obj) -> None:
        """``obj`` into the temporary folder, complete or not at all."""
        part = self.tmp / f"{name}.part"
        with open(part, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # Note: on disk before the rename makes it count
        os.replace(part, self.tmp / name)

    def remove(self, name: str) -> None:
        (self.tmp / name).unlink()

    def commit(self, files: list[str], meta: dict) -> None:
        """Rank 0 seals the folder and puts it in place; every rank waits for that."""
        self.comm.barrier(label="checkpoint")
        if self.comm.rank == 0:
            missing = [f for f in files if not (self.tmp / f).is_file()]
            if missing:
                raise CheckpointError(f"saving {self.path}: {missing} were not written; "
                                      f"nothing was committed")
            meta = {"format": FORMAT, **meta, "files": {f: _fingerprint(self.tmp / f)
                                                        for f in files}}
            part = self.tmp / "metadata.json.part"
            part.write_text(json.dumps(meta, indent=1))
            os.replace(part, self.tmp / "metadata.json")
            self._swap()
        self.comm.barrier(label="checkpoint")

    def _swap(self) -> None:
        old = self.path.with_name(f"{self.path.name}.old-{self.id}")
        if self.path.exists():
            os.replace(self.path, old)
        os.replace(self.tmp, self.path)
        for kind in ("old", "tmp"):  # this old one, and folders of interrupted saves
            for leftover in self.path.parent.glob(f"{self.path.name}.{kind}-*"):
                shutil.rmtree(leftover, ignore_errors=True)


def _fingerprint(file: Path) -> dict:
    return {"bytes": file.stat().st_size, "sha256": _sha256(file)}


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_metadata(path) -> dict:
    """``metadata.json`` of the checkpoint at ``path``, checked."""
    path = Path(path)
    file = path / "metadata.json"
    if not path.exists():
        aside = sorted(path.parent.glob(f"{path.name}.old-*"))
        hint = (f"; {aside[0]} holds the previous one (a save was interrupted between its two "
                f"renames): rename it to {path.name}") if aside else ""
        raise FileNotFoundError(f"no checkpoint at {path}{hint}")
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: {path} is not a complete fsdp_mini "
                              f"checkpoint (was it written by save_checkpoint?)")
    try:
        meta = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is corrupt: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise CheckpointError(f"{file}: unknown format {found!r}, expected {FORMAT!r}")
    return meta


def read_file(path, name: str, meta: dict):
    """One file of the checkpoint, after checking it is the one the metadata describes."""
    file = Path(path) / name
    expected = meta["files"].get(name)
    if expected is None:
        raise CheckpointError(f"{file}: not listed in {Path(path) / 'metadata.json'}")
    if not file.is_file():
        raise CheckpointError(f"{file} is missing (the checkpoint was saved at world size "
                              f"{meta['world_size']} with files {sorted(meta['files'])}); "
                              f"copy the whole folder")
    size = file.stat().st_size
    if size != expected["bytes"]:
        raise CheckpointError(f"{file} is truncated or changed: {size} bytes, "
                              f"{expected['bytes']} when saved")
    if _sha256(file) != expected["sha256"]:
        raise CheckpointError(f"{file} is corrupt: its sha256 differs from the one saved in "
                              f"metadata.json")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (torch raises many kinds for a damaged zip)
        raise CheckpointError(f"{file} cannot be read: {type(e).__name__}: {e}") from None
