"""Checkpoint folders on disk: complete or absent, and read back with clear errors.

A checkpoint is a folder (see :mod:`fsdp_mini.checkpoint.save_load` for what the files hold)::

    ckpt/metadata.json     kind, world size, strategy, units, step; each file's bytes and sha256
    ckpt/rank0.pt ...      sharded: what each rank holds
    ckpt/full.pt           full: the whole model and optimizer, under the original names

Saving writes the folder atomically, one save at a time, and never replaces a folder or file
the kit did not write (:mod:`fsdp_mini.checkpoint.atomic`). Reading checks every file against the
metadata's size and sha256. Files are read with ``torch.load(..., weights_only=True)``:
tensors and plain containers only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

FORMAT = "fsdp_mini.checkpoint.save_load/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (missing, truncated, corrupt, for another model) or
    saved where asked (a folder holding other files, a save already running there...)."""


def fingerprint(file: Path) -> dict:
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
    problem = _metadata_problem(meta)
    if problem:
        raise CheckpointError(f"{file} is damaged: {problem}; it was not written by "
                              f"save_checkpoint as it is (restore it from a copy, or save again)")
    return meta


def _metadata_problem(meta: dict) -> str:
    """What is wrong with the fields loading relies on ('' when nothing)."""
    if meta.get("kind") not in ("sharded", "full"):
        return f"'kind' is {meta.get('kind')!r}, not 'sharded' or 'full'"
    ws = meta.get("world_size")
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        return f"'world_size' is {ws!r}, not a number of ranks"
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return "'files' (each file's name, bytes and sha256) is missing or empty"
    for name, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int)
                and isinstance(entry.get("sha256"), str)):
            return f"the entry of {name!r} in 'files' has no 'bytes' and 'sha256'"
    return ""


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
