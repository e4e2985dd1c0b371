"""Checkpoints in the format of ``torch.distributed.checkpoint`` (DCP), both ways.

    fsdp_mini.save_checkpoint(model, optimizer, "ckpt", format="dcp")   # every rank calls it
    meta = fsdp_mini.load_checkpoint(model, optimizer, "ckpt")          # a DCP folder is recognised

The folder is what a torch job writes with ``dcp.save({"model": m, "optim": o})`` where
``m, o = get_state_dict(model, optimizer)`` (the top-level keys of torch's own DCP examples), so
such a job (torch's ``fully_shard``, torchtitan-style) resumes from it, and the kit from theirs::

    ckpt/.metadata           DCP's index: every key, its shape, dtype and where its chunks are
    ckpt/__0_0.distcp ...    each rank's chunks
    ckpt/metadata.json       the kit's own (step, strategy, world size; each file's sha256)

    model.<name>                  every state_dict() key of the unwrapped module
    optim.state.<name>.<key>      exp_avg, exp_avg_sq, step, momentum_buffer ... (<name>: the
                                  first name of a tied parameter, as torch's named_parameters)
    optim.param_groups.<i>.<key>  lr, betas ..., and "params": the group's parameter names

Loading also finds the model's keys at the top level (torchtitan's layout) and the optimizer
under "optimizer" (:mod:`fsdp_mini.checkpoint.dcp_keys`). Nobody gathers a parameter: each
rank's piece is written and read as the boxes DCP stores as chunks
(:mod:`fsdp_mini.checkpoint.dcp_boxes`), at any world size and strategy, from the kit's boxes or
FSDP2's row shards alike.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from ..comm.collectives import Comm
from .atomic import MARK_FILE, CheckpointWriter, ranks_that_failed, remove_if_made_by_a_save
from .dcp_boxes import BoxLoader, BoxSaver, add_boxes
from .dcp_keys import (MODEL, OPTIM, check_model, check_optimizer, empty_like_saved,
                       keys_of, plan_optimizer, put_optimizer)
from .files import FORMAT, CheckpointError, fingerprint
from .whole import per_element



def is_dcp_folder(path) -> bool:
    """Whether ``path`` holds a DCP checkpoint (its ``.metadata`` index)."""
    return (Path(path) / ".metadata").is_file()


def _failures(error: CheckpointException) -> str:
    """DCP's failures, one line per rank: 'rank 1: OSError: disk full'."""
    return "; ".join(f"rank {r}: {type(e).__name__}: {e}"
                     for r, (e, _) in sorted(error.failures.items()))


@contextmanager
def _single_process_is_meant():
    """DCP warns whenever it runs without collectives; here that is on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# -- saving ------------------------------------------------------------------------------------------

def save_dcp(engine, optimizer, path, optim_params, meta: dict) -> None:
    """Every rank: its pieces as DCP chunks into the folder ``path``, atomically
    (:mod:`fsdp_mini.checkpoint.atomic`); ``meta`` goes into the kit's ``metadata.json``."""
    comm = Comm(name="checkpoint")
    with CheckpointWriter(path, comm) as writer:  # rank 0 has checked and locked the folder
        state, error = None, None
        try:
            state = _to_save(engine, optimizer, optim_params, comm.rank)
        except Exception as e:  # noqa: BLE001  (re-raised below, once every rank knows)
            error = e
        failed = ranks_that_failed(comm, error is not None)
        if error is not None:
            raise error
        if failed:
            raise CheckpointError(f"saving {writer.path}: ranks {failed} failed before writing "
                                  f"(see their errors); nothing was written")
        try:
            with _single_process_is_meant():
                dcp.save(state, storage_writer=FileSystemWriter(writer.tmp),
                         planner=BoxSaver(), no_dist=comm.world_size == 1)
        except CheckpointException as e:
            # Note: DCP raises this on every rank, once every rank is done writing
            if comm.rank == 0:
                remove_if_made_by_a_save(writer.tmp)
            raise CheckpointError(f"saving {writer.path}: {_failures(e)}; nothing was "
                                  f"committed, {writer.path} is as it was") from e
        files = sorted(set(os.listdir(writer.tmp)) - {MARK_FILE}) if comm.rank == 0 else []
        writer.commit(files, {  # Note: rank 0 alone commits: the others would race its renames
            "kind": "dcp", "world_size": comm.world_size,
            "dcp_keys": {"model": MODEL, "optimizer": OPTIM}, **meta})


def _to_save(engine, optimizer, optim_params, rank: int) -> dict:
    """``{"model": ..., "optim": {"state": ..., "param_groups": ...}}`` with this rank's pieces
    as boxes; what the strategy does not shard comes from rank 0 alone."""
    params_here = rank == 0 or "params" in engine.sharded
    optim_here = rank == 0 or "optim" in engine.sharded
    pieces = engine.param_pieces()
    names = {n for _, r in pieces for n in r.names}
    model = {k: v.detach() for k, v in engine.module.state_dict().items() if k not in names}
    for t, r in (pieces if params_here else []):
        for name in r.names:
            add_boxes(model, name, t, r, writes_empty=rank == 0)
    if optimizer is None:
        return {MODEL: model}
    state, groups = {}, [{} for _ in optimizer.param_groups]  # names, in order
    for g, p, r in optim_params:
        groups[g][r.names[0]] = None
        saved = optimizer.state.get(p, {})
        if not (optim_here and saved):
            continue
        entry = state.setdefault(r.names[0], {})
        for k, v in saved.items():
            if per_element(k, v, p.shape):
                add_boxes(entry, k, v, r, writes_empty=rank == 0)
            elif r.hi > r.lo or math.prod(r.shape) == 0:  # Note: a rank holding none of a
                entry[k] = v.detach() if torch.is_tensor(v) else v  # parameter has no say
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {MODEL: model, OPTIM: {"state": state, "param_groups": [
        {**h, "params": list(names)} for h, names in zip(hyper, groups)]}}


# -- loading -------------------------------------------------------------------------------------------

def load_dcp(engine, optimizer, path, optim_params, optimizer_class) -> dict:
    """This rank's pieces out of the DCP folder ``path`` (no collective: every rank reads what
    it needs). Returns the kit's metadata; for a folder without it (a torch job's), ``step`` is
    the optimizer state's and ``step_from`` says so."""
    path = Path(path)
    kit = _kit_meta(path)
    if kit is None:
        warnings.warn(UNVERIFIED.format(path=path), stacklevel=3)
    index = _read_index(path)
    keys = keys_of(index, engine, path)
    pieces = engine.param_pieces()
    check_model(keys, index, engine, pieces, path)
    dest, staged = {}, []
    for t, r in pieces:
        staging = torch.empty(r.hi - r.lo, dtype=t.dtype)
        add_boxes(dest, keys.model[r.names[0]], staging, r, writes_empty=False)
        staged.append((t, staging))
    buffers = [(b, keys.model[n]) for n, b in engine.module.named_buffers() if n in keys.model]
    for b, key in buffers:
        dest[key] = torch.empty(b.shape, dtype=b.dtype)
    plan = None
    if optimizer is not None:
        check_optimizer(keys, kit, optimizer, optimizer_class, path)
        plan = plan_optimizer(keys, index, dest, optim_params, path)
        for key in keys.groups.values():
            dest.setdefault(key, empty_like_saved(index, key))
    # Note: into staging tensors (this rank's share once more), so that a failed read leaves
    # the model as it was
    loader = BoxLoader()
    try:
        with _single_process_is_meant():
            dcp.load(dest, storage_reader=FileSystemReader(path), planner=loader, no_dist=True)
    except CheckpointException as e:
        raise CheckpointError(f"{path} cannot be read: {_failures(e)}; the model is as it "
                              f"was") from e
    values = {**dest, **loader.loaded}  # what came as bytes, beside the tensors
    with torch.no_grad():
        for t, staging in staged:
            t.copy_(staging.view(t.shape))
        for b, key in buffers:
            b.copy_(dest[key])
    step = None
    if optimizer is not None:
        step = put_optimizer(plan, values, keys, optimizer)
    if kit is not None:
        return kit
    found = "the optimizer state's 'step'" if step is not None else \
        "nowhere: the optimizer state has no 'step' (SGD keeps none)"
    return {"kind": "dcp", "format": "torch.distributed.checkpoint", "world_size": None,
            "strategy": None, "step": step,
            "step_from": f"{found} (no fsdp_mini metadata.json in the folder)",
            "verified": False, "unverified": UNVERIFIED.format(path=path)}


UNVERIFIED = ("{path} has no metadata.json of fsdp_mini, so its contents cannot be verified: "
              "torch.distributed.checkpoint keeps no checksums, and damaged bytes in a .distcp "
              "file load as they are. A folder saved by save_checkpoint(..., format='dcp') "
              "keeps each file's sha256 and is checked on every load")


def _read_index(path: Path):
    """DCP's ``.metadata`` index, or a CheckpointError naming the file."""
    try:
        return FileSystemReader(path).read_metadata()
    except Exception as e:  # noqa: BLE001  (torch raises whatever unpickling a damaged file does)
        raise CheckpointError(f"{path / '.metadata'} cannot be read ({type(e).__name__}: {e}): "
                              f"it is truncated or damaged, so {path} is not a readable DCP "
                              f"checkpoint; restore it from a copy") from None


def _kit_meta(path: Path) -> dict | None:
    """The kit's ``metadata.json`` of a DCP folder it saved, its files checked; None if absent."""
    file = path / "metadata.json"
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is corrupt: not valid JSON ({e}); restore it from a "
                              f"copy, or save the checkpoint again") from None
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("kind") == "dcp"
            and isinstance(meta.get("files"), dict)):
        raise CheckpointError(f"{file} is not the metadata of a DCP checkpoint of fsdp_mini, so "
                              f"{path} cannot be checked against it; restore the kit's "
                              f"metadata.json from a copy, or save the checkpoint again")
    for name, saved in meta["files"].items():
        if not (path / name).is_file() or fingerprint(path / name) != saved:
            raise CheckpointError(f"{path / name} is missing or changed since fsdp_mini saved "
                                  f"{path} (its size or sha256 differs from metadata.json's: "
                                  f"damaged, or written by another job); nothing was loaded. "
                                  f"Restore the folder from a copy, or save the checkpoint again")
    return meta
