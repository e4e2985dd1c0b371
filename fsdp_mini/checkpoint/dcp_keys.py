"""Reading a DCP checkpoint's keys against the model and optimizer that load it.

Which keys hold the model (``model.<name>``, or at the top level as torchtitan saves) and the
optimizer (``optim.state.<name>.<key>``, ``optim.param_groups.<i>.<key>``, or under
"optimizer"), checked before anything is read: the first mismatching key is named with both
shapes, missing and extra keys are listed. Then where each saved optimizer value goes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from .dcp_boxes import add_boxes
from .files import CheckpointError

MODEL, OPTIM = "model", "optim"      # the top-level keys a save writes
OPTIM_KEYS = (OPTIM, "optimizer")    # where a load looks for the optimizer


@dataclasses.dataclass
class Keys:
    """Where things are in the DCP index: model name -> key, (name, state key) -> key,
    (group index, hyperparameter) -> key."""
    model: dict
    state: dict
    groups: dict


def keys_of(index, engine, path: Path) -> Keys:
    names = list(engine.module.state_dict())
    paths = getattr(index, "planner_data", None) or {}
    found = Keys({}, {}, {})
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


def check_model(keys: Keys, index, engine, pieces, path: Path) -> None:
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


def check_optimizer(keys: Keys, kit, optimizer, optimizer_class, path: Path) -> None:
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


def empty_like_saved(index, key: str):
    saved = index.state_dict_metadata[key]
    if isinstance(saved, TensorStorageMetadata):
        return torch.empty(saved.size, dtype=saved.properties.dtype)
    return None  # Note: stored as bytes: the loader's load_bytes receives it


def plan_optimizer(keys: Keys, index, dest: dict, optim_params, path: Path) -> list:
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
                add_boxes(dest, key, staging, r, writes_empty=False)
                new[k] = ("slice", staging)
            else:
                dest.setdefault(key, empty_like_saved(index, key))
                new[k] = ("whole", key)
        plan.append((p, new))
    return plan


def put_optimizer(plan: list, values: dict, keys: Keys, optimizer) -> int | None:
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
