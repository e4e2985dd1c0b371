"""Checkpoints that resume at any world size and under any strategy.

    fsdp_mini.save_checkpoint(model, optimizer, "ckpt")          # every rank calls it
    ...                                                           # later, N and strategy free
    meta = fsdp_mini.load_checkpoint(model, optimizer, "ckpt")   # meta["step"]: where it was

A checkpoint speaks one currency whatever the strategy: per original parameter name, the whole
tensor (:mod:`fsdp_mini.checkpoint.whole`). Under zero and fsdp a rank holds *pieces*, ranges of
flattened parameters (``Strategy.param_pieces``, ``Strategy.optimizer_param_ranges``), and
saving writes them as they are; loading reads every file, puts each parameter back together and
lets each rank take its own new pieces. Example, w of 6 elements, fsdp at N = 2 resumed at N = 3::

    saved      rank0.pt  w [0, 3) + its exp_avg, step     rank1.pt  w [3, 6) + ...
    loading    every rank: w whole (6 values)  ->  rank0 takes [0, 2), rank1 [2, 4), rank2 [4, 6)

``sharded=True`` (default): one file per rank; parameters or optimizer state that a strategy
does not shard are written by rank 0 alone. ``sharded=False``: rank 0 assembles ``full.pt``,
``{"model": state_dict, "optimizer": {"state": {name: {...}}, "param_groups": [...]}}`` under
the original names, which plain torch reads (``load_state_dict(full["model"])``, and torch's
``set_model_state_dict`` / ``set_optimizer_state_dict`` with ``full_state_dict=True``).
Writes are atomic and never touch what the kit did not write: see
:mod:`fsdp_mini.checkpoint.atomic`.

Note: the pieces travel through the checkpoint folder, not through collectives (even for
``sharded=False``): one code path, and loading needs no collective at all. The folder must be
one that every rank sees (a shared file system across hosts).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import nn

from ..comm.collectives import Comm
from ..strategy import Single
from ..wrap import ParallelOptimizer
from .atomic import CheckpointWriter
from .dcp import is_dcp_folder, load_dcp, save_dcp
from .files import CheckpointError, read_file, read_metadata
from .whole import Whole, from_full, from_records, per_element


def save_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer | None, path,
                    sharded: bool = True, step: int | None = None, format: str = "kit") -> None:
    """Write the model and optimizer state to the folder ``path`` (replaced atomically).

    Every rank must call it. ``step`` is stored in the metadata (default: the optimizer's
    ``step`` state where it keeps one, as Adam does; else None). Works for plain modules too
    (as the "single" strategy). ``path`` must be absent, empty, or a checkpoint of the kit: a
    folder holding other files, a file, a link or the working folder is refused with a
    :class:`CheckpointError` before anything is written, as is a second save to the same folder
    while one runs (:mod:`fsdp_mini.checkpoint.atomic`). ``format="dcp"``: the folder that
    ``torch.distributed.checkpoint`` reads, ``{"model": ..., "optim": ...}`` as torch's
    ``get_state_dict`` lays them out (:mod:`fsdp_mini.checkpoint.dcp`); always sharded."""
    engine = _engine(model, optimizer, path, "save_checkpoint")
    if not isinstance(sharded, bool):
        raise TypeError(f"save_checkpoint(sharded) must be True (each rank writes its shard) or "
                        f"False (one full.pt), got {sharded!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"save_checkpoint(step) must be a whole number >= 0 (the training step "
                         f"saved) or None, got {step!r}")
    if not isinstance(format, str) or format not in ("kit", "dcp"):
        raise ValueError(f"save_checkpoint(format={format!r}): say 'kit' (the kit's own files) or "
                         f"'dcp' (the folder torch.distributed.checkpoint reads)")
    if format == "dcp":
        if not sharded:
            raise ValueError("format='dcp' is sharded by nature (each rank writes its chunks); "
                             "drop sharded=False, or use the kit's format for one full.pt")
        params = _optimizer_params(engine, optimizer) if optimizer is not None else []
        return save_dcp(engine, optimizer, path, params, _describe(engine, optimizer, step))
    # Note: over the whole world (hsdp's own comm is a group), and on a ledger of its own, so
    # the checkpoint's collectives do not open a training step in the model's.
    comm = Comm(name="checkpoint")
    files = [f"rank{r}.pt" for r in range(comm.world_size)]
    with CheckpointWriter(path, comm) as writer:  # rank 0 has checked and locked the folder
        writer.write(f"rank{comm.rank}.pt", lambda: _rank_record(engine, optimizer, comm.rank))
        if not sharded:
            writer.on_rank0(lambda: _assemble_full(writer, files))
            files = ["full.pt"]
        writer.commit(files, {"kind": "sharded" if sharded else "full",
                              "world_size": comm.world_size, **_describe(engine, optimizer, step)})


def _describe(engine, optimizer, step: int | None) -> dict:
    """The metadata that says what was saved, whatever the format."""
    return {"strategy": engine.strategy, "sharded": list(engine.sharded),
            "units": [getattr(u, "name", str(u)) for u in getattr(engine, "units", ())],
            "layout": {r.names[0]: list(r.shape) for _, r in engine.param_pieces()},
            "optimizer": _optimizer_class(optimizer), "step": _step(optimizer, step)}


def load_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer | None, path) -> dict:
    """Load a checkpoint of any kind (sharded, full, or a DCP folder: the kit's or a torch
    job's), saved at any world size and strategy, into ``model`` (and ``optimizer``; None: the
    model alone). No collective: every rank reads what it needs (all files; in a DCP folder, its
    own chunks).
    Returns the metadata (``step``, ``world_size``, ``strategy``...). A damaged checkpoint or
    one of another model raises :class:`CheckpointError` naming the file and the problem."""
    engine, path = _engine(model, optimizer, path, "load_checkpoint"), Path(path)
    if is_dcp_folder(path):  # a DCP folder (the kit's, or a torch job's): no flag needed
        params = _optimizer_params(engine, optimizer) if optimizer is not None else []
        return load_dcp(engine, optimizer, path, params, _optimizer_class(optimizer))
    meta = read_metadata(path)
    pieces = engine.param_pieces()
    if meta["kind"] == "full":
        names = [r.names for _, r in pieces]
        whole = from_full(read_file(path, "full.pt", meta), names, str(path / "full.pt"))
    else:
        whole = from_records({str(path / f): read_file(path, f, meta) for f in meta["files"]})
    _check_fits(whole, engine, pieces, path)
    with torch.no_grad():
        for t, r in pieces:
            t.copy_(whole.params[r.names[0]][r.lo:r.hi].view(t.shape))
        for name, buf in engine.module.named_buffers():
            if name in whole.buffers:
                buf.copy_(whole.buffers[name])
    if optimizer is not None:
        _load_optimizer(whole, engine, optimizer, path)
    return meta


# -- saving ------------------------------------------------------------------------------------

def _rank_record(engine, optimizer, rank: int) -> dict:
    """What this rank writes: its pieces of the parameters and of the optimizer state (only
    rank 0 writes what the strategy does not shard); rank 0 adds buffers and hyperparameters."""
    record = {"params": [], "optim": []}
    if rank == 0 or "params" in engine.sharded:
        record["params"] = [{**_where(r), "values": _flat(t)} for t, r in engine.param_pieces()
                            if r.hi > r.lo or math.prod(r.shape) == 0]  # Note: 0-element
        # parameters are written too (an empty piece), so that loading finds them
    if optimizer is not None and (rank == 0 or "optim" in engine.sharded):
        for group, p, r in _optimizer_params(engine, optimizer):
            state = optimizer.state.get(p, {})
            sliced = [k for k, v in state.items() if per_element(k, v, p.shape)]
            record["optim"].append({**_where(r), "group": group, "sliced": sliced, "state": {
                k: _flat(v) if k in sliced else _copy(v) for k, v in state.items()}})
    if rank == 0:
        params = {n for _, r in engine.param_pieces() for n in r.names}
        state_dict = engine.module.state_dict()
        record.update(keys=list(state_dict), optimizer=_optimizer_class(optimizer),
                      buffers={k: _copy(v) for k, v in state_dict.items() if k not in params},
                      param_groups=[{k: v for k, v in g.items() if k != "params"}
                                    for g in (optimizer.param_groups if optimizer else [])])
    return record


def _assemble_full(writer, files: list[str]) -> None:
    """Rank 0: the ranks' files put together into ``full.pt``, which replaces them."""
    records = {f: torch.load(writer.tmp / f, weights_only=True) for f in files}
    full = from_records(records).full_dict()
    writer.write_here("full.pt", full)
    for f in files:
        (writer.tmp / f).unlink()


def _where(r) -> dict:
    return {"names": list(r.names), "lo": r.lo, "hi": r.hi, "shape": list(r.shape)}


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).to("cpu", copy=True)


def _copy(v):
    return v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v


def _step(optimizer, step: int | None) -> int | None:
    if step is not None:
        return int(step)
    steps = [int(s["step"]) for s in (optimizer.state.values() if optimizer else ())
             if "step" in s]
    return max(steps, default=None)


# -- loading -----------------------------------------------------------------------------------

def _check_fits(whole: Whole, engine, pieces, path: Path) -> None:
    """A clear error if the checkpoint does not hold exactly this model's tensors."""
    keys = list(engine.module.state_dict())
    missing = [k for k in keys if k not in whole.keys]
    unexpected = [k for k in whole.keys if k not in keys]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this {type(engine.module).__name__} (saved "
                              f"from another model?): missing {missing[:5]}, unexpected "
                              f"{unexpected[:5]}{' ...' if len(missing + unexpected) > 10 else ''}")
    for _, r in pieces:
        name = r.names[0]
        if name not in whole.params:
            raise CheckpointError(f"{path}: no values for parameter {name!r}")
        if whole.shapes[name] != tuple(r.shape):
            raise CheckpointError(f"{whole.origin[name]}: {name!r} has shape "
                                  f"{whole.shapes[name]}, the model's is {tuple(r.shape)}")
    for name, buf in engine.module.named_buffers():
        if name in whole.buffers and whole.buffers[name].shape != buf.shape:
            raise CheckpointError(f"{path}: buffer {name!r} has shape "
                                  f"{tuple(whole.buffers[name].shape)}, the model's is "
                                  f"{tuple(buf.shape)}")


def _load_optimizer(whole: Whole, engine, optimizer, path: Path) -> None:
    """Each optimizer tensor takes its range of the whole state; hyperparameters by group."""
    mine = _optimizer_class(optimizer)
    if not whole.groups:
        raise CheckpointError(f"{path} holds no optimizer state (it was saved without an "
                              f"optimizer); pass optimizer=None to load the model alone")
    if whole.optimizer is not None and whole.optimizer != mine:
        raise CheckpointError(f"{path} holds the state of a {whole.optimizer}, this optimizer is "
                              f"a {mine}; build the same optimizer, or pass optimizer=None")
    if len(whole.groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{path} has {len(whole.groups)} parameter group(s), this "
                              f"optimizer {len(optimizer.param_groups)}")
    for _, p, r in _optimizer_params(engine, optimizer):
        name = r.names[0]
        saved, sliced = whole.optim.get(name, {}), whole.sliced.get(name, set())
        optimizer.state.pop(p, None)
        if saved:
            optimizer.state[p] = {
                k: v[r.lo:r.hi].view(p.shape).to(p.device, copy=True) if k in sliced
                else (v.clone() if torch.is_tensor(v) else v) for k, v in saved.items()}
    for group, hyper in zip(optimizer.param_groups, whole.groups):
        group.update(hyper)


def _optimizer_params(engine, optimizer) -> list[tuple[int, torch.Tensor, object]]:
    """(group index, tensor, PieceRange) for every tensor the optimizer updates."""
    ranges = {id(t): r for t, r in engine.optimizer_param_ranges()}
    out = []
    for i, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in ranges:
                raise ValueError(f"the optimizer updates a tensor of shape {tuple(p.shape)} that "
                                 f"{engine.strategy!r} did not give it; build it through "
                                 f"fsdp_mini.parallelize(..., optimizer=factory)")
            out.append((i, p, ranges[id(p)]))
    return out


def _optimizer_class(optimizer) -> str | None:
    if optimizer is None:
        return None
    return next(c for c in type(optimizer).__mro__
                if not issubclass(c, ParallelOptimizer)).__name__


def _engine(model: nn.Module, optimizer, path, where: str):
    """The model's engine, once the three arguments every call takes are checked by name."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{where}(model) must be the model (an nn.Module), got {model!r} (a "
                        f"{type(model).__name__})")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{where}(optimizer) must be the optimizer (a torch.optim.Optimizer, "
                        f"e.g. the one parallelize returned) or None for the model alone, got "
                        f"{optimizer!r} (a {type(optimizer).__name__})")
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}(path) must be a folder's path, a non-empty str or Path, got "
                        f"{path!r} (a {type(path).__name__})")
    if not os.fspath(path):
        raise CheckpointError(f"{where}(path) must be a non-empty str or Path (a folder's "
                              f"path), got ''")
    if "\x00" in os.fspath(path):
        raise ValueError(f"{where}(path) holds a NUL character, which no path can: {path!r}")
    engine = getattr(model, "fsdp_mini", None)
    return engine if engine is not None else Single(model, Comm())
