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
under "optimizer". Nobody gathers a parameter: a piece, the flat range [lo, hi) of a flattened
parameter, is a union of at most 2·ndim − 1 boxes (a partial row, whole rows, a partial row),
and each box is a chunk DCP stores and reads by its offsets. Example, w of shape (3, 4) at N = 2::

    rank 0 holds [0, 6)    box at (0, 0) of size (1, 4)  +  box at (1, 0) of size (1, 2)
    rank 1 holds [6, 12)   box at (1, 2) of size (1, 2)  +  box at (2, 0) of size (1, 4)

Loading asks DCP for the boxes of this rank's new pieces; DCP reads them out of whichever saved
chunks overlap them (the kit's boxes, or FSDP2's row shards), at any world size and strategy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner, DefaultSavePlanner,
                                                          create_default_local_load_plan,
                                                          create_default_local_save_plan)
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadPlan, TensorWriteData, WriteItem,
                                                  WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from ..comm.collectives import Comm
from .atomic import CheckpointWriter, ranks_that_failed
from .files import FORMAT, CheckpointError, fingerprint
from .whole import per_element

MODEL, OPTIM = "model", "optim"      # the top-level keys a save writes
OPTIM_KEYS = (OPTIM, "optimizer")    # where a load looks for the optimizer


def is_dcp_folder(path) -> bool:
    """Whether ``path`` holds a DCP checkpoint (its ``.metadata`` index)."""
    return (Path(path) / ".metadata").is_file()


# -- a flat range as boxes -------------------------------------------------------------------------

def boxes(lo: int, hi: int, shape) -> list[tuple[tuple, tuple, int]]:
    """``(offsets, sizes, first flat element)`` of the boxes that elements [lo, hi) of a tensor of
    ``shape`` cover, in order: ``boxes(2, 9, (3, 4))`` is ``[((0, 2), (1, 2), 2), ((1, 0),
    (1, 4), 4), ((2, 0), (1, 1), 8)]``."""
    shape = tuple(shape)
    if hi <= lo:
        return []
    if not shape:
        return [((), (), 0)]
    inner = math.prod(shape[1:])
    (r0, c0), (r1, c1) = divmod(lo, inner), divmod(hi, inner)

    def part_of_row(row, a, b):
        return [((row, *o), (1, *s), row * inner + f) for o, s, f in boxes(a, b, shape[1:])]

    if r0 == r1:
        return part_of_row(r0, c0, c1)
    out = part_of_row(r0, c0, inner) if c0 else []
    first = r0 + bool(c0)
    if r1 > first:
        out.append(((first, *[0] * (len(shape) - 1)), (r1 - first, *shape[1:]), first * inner))
    return out + (part_of_row(r1, 0, c1) if c1 else [])


@dataclasses.dataclass
class _Boxes:
    """A leaf of the state dict given to DCP: this rank's boxes of one tensor of ``shape``,
    ``parts[offsets] = (sizes, a view of the rank's piece)``."""
    shape: tuple
    dtype: torch.dtype
    parts: dict


def _add_boxes(into: dict, key: str, piece: torch.Tensor, r, writes_empty: bool) -> None:
    """``piece`` (elements [r.lo, r.hi) of a tensor of ``r.shape``) as boxes under ``key``.
    ``writes_empty``: a tensor of no elements still gets its one (empty) box, so it is listed."""
    leaf = into.setdefault(key, _Boxes(tuple(r.shape), piece.dtype, {}))
    flat = piece.detach().reshape(-1)
    for offsets, sizes, first in boxes(r.lo, r.hi, r.shape):
        start = first - r.lo
        leaf.parts[offsets] = (sizes, flat[start:start + math.prod(sizes)].view(sizes))
    if writes_empty and math.prod(r.shape) == 0:
        leaf.parts[(0,) * len(r.shape)] = (tuple(r.shape), flat.view(r.shape))


class _BoxSaver(DefaultSavePlanner):
    """DCP's planner, plus write items for the ``_Boxes`` leaves (one per box)."""

    def create_local_plan(self):
        plain = {k: v for k, v in self.state_dict.items() if not isinstance(v, _Boxes)}
        plan = create_default_local_save_plan(plain, self.is_coordinator)
        items = [WriteItem(index=MetadataIndex(fqn, torch.Size(offsets)), type=WriteItemType.SHARD,
                           tensor_data=TensorWriteData(
                               chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)),
                               properties=TensorProperties(dtype=leaf.dtype),
                               size=torch.Size(leaf.shape)))
                 for fqn, leaf in self.state_dict.items() if isinstance(leaf, _Boxes)
                 for offsets, (sizes, _) in leaf.parts.items()]
        self.plan = dataclasses.replace(plan, items=plan.items + items,
                                        planner_data=self.mappings)
        return self.plan

    def resolve_data(self, write_item):
        leaf = self.state_dict[write_item.index.fqn]
        if isinstance(leaf, _Boxes):
            return leaf.parts[tuple(write_item.index.offset)][1]
        return super().resolve_data(write_item)


class _BoxLoader(DefaultLoadPlanner):
    """DCP's planner over a flat state dict, plus read items for the ``_Boxes`` leaves; what
    is stored as bytes lands in ``loaded``."""

    def __init__(self):
        super().__init__(flatten_state_dict=False)
        self.loaded = {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        # Note: not DCP's own, which sets every leaf it does not know (ours) to None
        self.state_dict = self.original_state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def create_local_plan(self):
        plain = {k: v for k, v in self.state_dict.items() if not isinstance(v, _Boxes)}
        items = create_default_local_load_plan(plain, self.metadata, True).items
        for fqn, leaf in self.state_dict.items():
            if isinstance(leaf, _Boxes):
                chunks = [ChunkStorageMetadata(torch.Size(o), torch.Size(s))
                          for o, (s, _) in leaf.parts.items()]
                items += create_read_items_for_chunk_list(
                    fqn, self.metadata.state_dict_metadata[fqn], chunks)
        return LoadPlan(items)

    def lookup_tensor(self, index):
        leaf = self.state_dict[index.fqn]
        if isinstance(leaf, _Boxes):
            return leaf.parts[tuple(index.offset)][1]
        return super().lookup_tensor(index)

    def load_bytes(self, read_item, value) -> None:
        # Note: weights_only: a checkpoint may bring tensors and plain values, never code
        self.loaded[read_item.dest_index.fqn] = torch.load(value, weights_only=True)


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
                         planner=_BoxSaver(), no_dist=comm.world_size == 1)
        except CheckpointException as e:
            # Note: DCP raises this on every rank, once every rank is done writing
            if comm.rank == 0:
                shutil.rmtree(writer.tmp, ignore_errors=True)
            raise CheckpointError(f"saving {writer.path}: {_failures(e)}; nothing was "
                                  f"committed, {writer.path} is as it was") from e
        files = sorted(os.listdir(writer.tmp)) if comm.rank == 0 else []  # Note: rank 0
        writer.commit(files, {  # alone, who commits: the others would race its renames
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
            _add_boxes(model, name, t, r, writes_empty=rank == 0)
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
                _add_boxes(entry, k, v, r, writes_empty=rank == 0)
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
    index = FileSystemReader(path).read_metadata()
    keys = _keys(index, engine, path)
    pieces = engine.param_pieces()
    _check_model(keys, index, engine, pieces, path)
    dest, staged = {}, []
    for t, r in pieces:
        staging = torch.empty(r.hi - r.lo, dtype=t.dtype)
        _add_boxes(dest, keys.model[r.names[0]], staging, r, writes_empty=False)
        staged.append((t, staging))
    buffers = [(b, keys.model[n]) for n, b in engine.module.named_buffers() if n in keys.model]
    for b, key in buffers:
        dest[key] = torch.empty(b.shape, dtype=b.dtype)
    plan = None
    if optimizer is not None:
        _check_optimizer(keys, kit, optimizer, optimizer_class, path)
        plan = _plan_optimizer(keys, index, dest, optim_params, path)
        for key in keys.groups.values():
            dest.setdefault(key, _empty_like_saved(index, key))
    # Note: into staging tensors (this rank's share once more), so that a failed read leaves
    # the model as it was
    loader = _BoxLoader()
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
        step = _put_optimizer(plan, values, keys, optimizer)
    if kit is not None:
        return kit
    found = "the optimizer state's 'step'" if step is not None else \
        "nowhere: the optimizer state has no 'step' (SGD keeps none)"
    return {"kind": "dcp", "format": "torch.distributed.checkpoint", "world_size": None,
            "strategy": None, "step": step,
            "step_from": f"{found} (no fsdp_mini metadata.json in the folder)"}


def _kit_meta(path: Path) -> dict | None:
    """The kit's ``metadata.json`` of a DCP folder it saved, its files checked; None if absent."""
    file = path / "metadata.json"
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is corrupt: not valid JSON ({e})") from None
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("kind") == "dcp"
            and isinstance(meta.get("files"), dict)):
        raise CheckpointError(f"{file} is not the metadata of a DCP checkpoint of fsdp_mini; "
                              f"move it away to load {path} as a plain DCP checkpoint")
    for name, saved in meta["files"].items():
        if not (path / name).is_file() or fingerprint(path / name) != saved:
            raise CheckpointError(f"{path / name} is missing or changed since fsdp_mini saved "
                                  f"{path} (re-saved by another job, or damaged?); restore it, "
                                  f"or remove metadata.json to load the folder as it is now")
    return meta


@dataclasses.dataclass
class _Keys:
    """Where things are in the DCP index: model name -> key, (name, state key) -> key,
    (group index, hyperparameter) -> key."""
    model: dict
    state: dict
    groups: dict


def _keys(index, engine, path: Path) -> _Keys:
    names = list(engine.module.state_dict())
    paths = getattr(index, "planner_data", None) or {}
    found = _Keys({}, {}, {})
    top = {}
    for key in index.state_dict_metadata:
        p = tuple(paths.get(key) or _guess_path(key, names))
        if len(p) == 2 and p[0] == MODEL:
            found.model[p[1]] = key
        elif len(p) == 4 and p[0] in OPTIM_KEYS and p[1] == "state":
            found.state[(p[2], p[3])] = key
        elif len(p) == 4 and p[0] in OPTIM_KEYS and p[1] == "param_groups":
            found.groups[(int(p[2]), p[3])] = key
        elif len(p) == 1 and p[0] in names:
            top[p[0]] = key
    found.model = found.model or top  # Note: torchtitan keeps the model's keys at the top
    return found


def _guess_path(key: str, names: list[str]) -> tuple:
    """A key's path when the index has none (saved without flattening): split at the names."""
    head, _, rest = key.partition(".")
    part, _, tail = rest.partition(".")
    if head == MODEL and rest in names:
        return (MODEL, rest)
    if head in OPTIM_KEYS and part == "param_groups" and tail.partition(".")[0].isdigit():
        return (head, part, *tail.split(".", 1))
    if head in OPTIM_KEYS and part == "state":
        name = max((n for n in names if tail.startswith(n + ".")), key=len, default=None)
        if name:
            return (head, part, name, tail[len(name) + 1:])
    return (key,)


def _check_model(keys: _Keys, index, engine, pieces, path: Path) -> None:
    """A clear error unless the folder holds exactly this model's tensors, shaped alike."""
    shapes = {n: tuple(r.shape) for _, r in pieces for n in r.names}
    shapes.update({n: tuple(b.shape) for n, b in engine.module.named_buffers()})
    wanted = list(engine.module.state_dict())
    missing = [k for k in wanted if k not in keys.model]
    unexpected = [k for k in keys.model if k not in wanted]
    if missing or unexpected:
        raise CheckpointError(f"{path} (a DCP checkpoint) does not fit this "
                              f"{type(engine.module).__name__}: missing {missing[:5]}, unexpected "
                              f"{unexpected[:5]} (model keys found: {len(keys.model)}, under "
                              f"'{MODEL}.' or at the top level)")
    for name in wanted:
        saved = index.state_dict_metadata[keys.model[name]]
        size = tuple(saved.size) if isinstance(saved, TensorStorageMetadata) else "not a tensor"
        if name in shapes and size != shapes[name]:
            raise CheckpointError(f"{path}: {keys.model[name]!r} has shape {size} in the "
                                  f"checkpoint, the model's {name!r} has shape {shapes[name]}; "
                                  f"build the model the checkpoint was saved from")


def _check_optimizer(keys: _Keys, kit, optimizer, optimizer_class, path: Path) -> None:
    if not keys.state and not keys.groups:
        raise CheckpointError(f"{path} holds no optimizer state (under {' or '.join(OPTIM_KEYS)}"
                              f"); pass optimizer=None to load the model alone")
    saved_class = (kit or {}).get("optimizer")
    if saved_class is not None and saved_class != optimizer_class:
        raise CheckpointError(f"{path} holds the state of a {saved_class}, this optimizer is a "
                              f"{optimizer_class}; build the same optimizer, or pass "
                              f"optimizer=None")
    count = len({i for i, _ in keys.groups})
    if count != len(optimizer.param_groups):
        raise CheckpointError(f"{path} has {count} parameter group(s), this optimizer "
                              f"{len(optimizer.param_groups)}")
    saved = {k for _, k in keys.groups} - {"params"}
    mine = {k for g in optimizer.param_groups for k in g} - {"params"}
    if saved - mine and mine - saved:  # Note: one side only: another torch version's options
        raise CheckpointError(f"{path}: its optimizer has {sorted(saved - mine)}, this "
                              f"{optimizer_class} has {sorted(mine - saved)} instead (saved by "
                              f"another optimizer?); build the same optimizer")


def _empty_like_saved(index, key: str):
    saved = index.state_dict_metadata[key]
    if isinstance(saved, TensorStorageMetadata):
        return torch.empty(saved.size, dtype=saved.properties.dtype)
    return None  # Note: stored as bytes: the loader's load_bytes receives it


def _plan_optimizer(keys: _Keys, index, dest: dict, optim_params, path: Path) -> list:
    """Per tensor the optimizer updates: (tensor, {state key: ("slice", staging) or ("whole",
    DCP key)}); the boxes of the slices and the whole values go into ``dest``."""
    params = {r.names[0] for _, _, r in optim_params}
    strays = sorted({n for n, _ in keys.state if n not in params})
    if strays:
        raise CheckpointError(f"{path}: optimizer state for {strays[:3]}, which this optimizer "
                              f"does not update (another model, or other frozen parameters?)")
    plan = []
    for _, p, r in optim_params:
        new = {}
        for (name, k), key in keys.state.items():
            if name != r.names[0]:
                continue
            saved = index.state_dict_metadata[key]
            if (isinstance(saved, TensorStorageMetadata) and k != "step"
                    and tuple(saved.size) == tuple(r.shape)):
                staging = torch.empty(r.hi - r.lo, dtype=saved.properties.dtype)
                _add_boxes(dest, key, staging, r, writes_empty=False)
                new[k] = ("slice", staging)
            else:
                dest.setdefault(key, _empty_like_saved(index, key))
                new[k] = ("whole", key)
        plan.append((p, new))
    return plan


def _put_optimizer(plan: list, values: dict, keys: _Keys, optimizer) -> int | None:
    """The loaded state into the optimizer and each group's hyperparameters; the step."""
    steps = []
    for p, new in plan:
        optimizer.state.pop(p, None)
        if not new:
            continue
        state = {}
        for k, (how, what) in new.items():
            if how == "slice":
                state[k] = what.view(p.shape).to(p.device)
            else:
                v = values[what]
                state[k] = v.clone() if torch.is_tensor(v) else v
        optimizer.state[p] = state
        if "step" in state:
            steps.append(int(state["step"]))
    for (i, k), key in keys.groups.items():
        if k != "params":
            optimizer.param_groups[i][k] = values[key]
    return max(steps, default=None)
