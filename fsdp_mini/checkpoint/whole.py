"""The currency of checkpoints: per original parameter name, the whole tensor.

:class:`Whole` holds, for every parameter, its whole flattened values, and for its optimizer
state each tensor of the parameter's shape whole too (``exp_avg``, ``momentum_buffer``...);
scalar state such as ``step`` as it is. Any strategy can write its pieces into one and take its
own pieces out of it (:mod:`fsdp_mini.checkpoint.save_load`). Example, w of 9 elements, two files::

    rank0.pt  w [0, 5) values, exp_avg [0, 5), step 3    rank1.pt  w [5, 9) ..., step 3
    Whole     params["w"] = 9 values   optim["w"] = {"exp_avg": 9 values, "step": 3}

Every element must come from some file (pieces may overlap: HSDP's replicas hold equal copies);
a hole is an error naming the files.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .files import CheckpointError


@dataclass
class Whole:
    params: dict[str, torch.Tensor] = field(default_factory=dict)    # first name -> flat values
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)            # every name -> first name
    origin: dict[str, str] = field(default_factory=dict)             # first name -> a file
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)                     # state_dict() order
    optim: dict[str, dict] = field(default_factory=dict)             # first name -> state
    sliced: dict[str, set] = field(default_factory=dict)             # its per-element keys
    group_of: dict[str, int] = field(default_factory=dict)
    groups: list[dict] = field(default_factory=list)                 # hyperparameters
    optimizer: str | None = None                                     # its class name

    def full_dict(self) -> dict:
        """What ``full.pt`` holds: torch's own layouts, under the original names."""
        model = OrderedDict(
            (k, self.params[self.aliases[k]].view(self.shapes[self.aliases[k]])
             if k in self.aliases else self.buffers[k]) for k in self.keys)
        state = {name: {k: v.view(self.shapes[name]) if k in self.sliced[name] else v
                        for k, v in s.items()} for name, s in self.optim.items() if s}
        names = [n for n in dict.fromkeys(self.aliases[k] for k in self.keys if k in self.aliases)
                 if n in self.group_of]
        groups = [{**g, "params": [n for n in names if self.group_of[n] == i]}
                  for i, g in enumerate(self.groups)]
        return {"model": model, "optimizer": {"state": state, "param_groups": groups},
                "optimizer_class": self.optimizer}


def per_element(key: str, value, shape) -> bool:
    """Whether an optimizer state entry has one value per parameter element."""
    return torch.is_tensor(value) and key != "step" and tuple(value.shape) == tuple(shape)


def from_records(records: dict[str, dict]) -> Whole:
    """Assemble the rank files of a sharded checkpoint (file path -> its contents)."""
    head = next(r for r in records.values() if "keys" in r)
    whole = Whole(buffers=head["buffers"], keys=head["keys"], groups=head["param_groups"],
                  optimizer=head["optimizer"])
    filled: dict[tuple[str, str], torch.Tensor] = {}
    for file, rec in records.items():
        for e in rec["params"]:
            name = _declare(whole, e, file)
            whole.params.setdefault(name, torch.empty(_numel(e), dtype=e["values"].dtype))
            _put(whole.params[name], filled, (name, ""), e, e["values"], file)
    entries = [(file, e) for file, rec in records.items() for e in rec["optim"]]
    for file, e in sorted(entries, key=lambda fe: fe[1]["hi"] > fe[1]["lo"]):
        name = _declare(whole, e, file)  # Note: empty pieces first: scalars of real ones win
        whole.group_of[name] = e["group"]
        state = whole.optim.setdefault(name, {})
        whole.sliced.setdefault(name, set()).update(e["sliced"])
        for k, v in e["state"].items():
            if k in e["sliced"]:
                state.setdefault(k, torch.empty(_numel(e), dtype=v.dtype))
                _put(state[k], filled, (name, k), e, v, file)
            else:
                state[k] = v
    _check_filled(whole, filled, sorted(records))
    return whole


def from_full(saved: dict, names: list[tuple[str, ...]], file: str) -> Whole:
    """``full.pt``'s contents; ``names``: the target model's parameters (tied: several names)."""
    if not isinstance(saved, dict) or not {"model", "optimizer"} <= set(saved):
        raise CheckpointError(f"{file}: expected a dict with 'model' and 'optimizer'")
    model, optim = saved["model"], saved["optimizer"]
    whole = Whole(keys=list(model), optimizer=saved.get("optimizer_class"),
                  groups=[{k: v for k, v in g.items() if k != "params"}
                          for g in optim["param_groups"]])
    for group in names:
        for n in group:
            whole.aliases[n] = group[0]
        if group[0] in model:
            whole.params[group[0]] = model[group[0]].reshape(-1)
            whole.shapes[group[0]] = tuple(model[group[0]].shape)
            whole.origin[group[0]] = file
    whole.buffers = {k: v for k, v in model.items() if k not in whole.aliases}
    for i, g in enumerate(optim["param_groups"]):
        for name in g["params"]:
            whole.group_of[name] = i
    for name, state in optim["state"].items():
        if name not in whole.shapes:
            raise CheckpointError(f"{file}: optimizer state for {name!r}, which is not a "
                                  f"parameter of this model")
        shape = whole.shapes[name]
        whole.sliced[name] = {k for k, v in state.items() if per_element(k, v, shape)}
        whole.optim[name] = {k: v.reshape(-1) if k in whole.sliced[name] else v
                             for k, v in state.items()}
    return whole


def _numel(e: dict) -> int:
    return math.prod(e["shape"])


def _declare(whole: Whole, e: dict, file: str) -> str:
    """Register the names and shape of the parameter ``e`` is a piece of; its first name."""
    name, shape = e["names"][0], tuple(e["shape"])
    if whole.shapes.setdefault(name, shape) != shape:
        raise CheckpointError(f"{file}: {name!r} has shape {shape} here but "
                              f"{whole.shapes[name]} in {whole.origin[name]}")
    whole.origin.setdefault(name, file)
    for n in e["names"]:
        whole.aliases[n] = name
    return name


def _put(full: torch.Tensor, filled: dict, key, e: dict, values: torch.Tensor, file) -> None:
    lo, hi = e["lo"], e["hi"]
    if not 0 <= lo <= hi <= full.numel() or values.numel() != hi - lo:
        raise CheckpointError(f"{file}: a piece of {key[0]!r} claims elements [{lo}, {hi}) of "
                              f"{full.numel()} with {values.numel()} values")
    full[lo:hi] = values
    mask = filled.setdefault(key, torch.zeros(full.numel(), dtype=torch.bool))
    mask[lo:hi] = True


def _check_filled(whole: Whole, filled: dict, files: list[str]) -> None:
    for (name, k), mask in filled.items():
        if not bool(mask.all()):
            what = f"optimizer state {k!r} of {name!r}" if k else f"parameter {name!r}"
            raise CheckpointError(f"{what}: {int((~mask).sum())} of {mask.numel()} elements are "
                                  f"in none of the files {files}")
