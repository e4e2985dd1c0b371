"""One configuration cell for every lab: how many ranks, which backend, how big a model.

    from fsdp_mini import labs
    cfg = labs.lab_config()          # prints what it chose and why

- ``CI=true`` (the kit's CI, nbval): 2 gloo ranks on CPU and the tiny GPT, a few steps;
- no GPU (a laptop): 4 gloo ranks on CPU and the default GPT (3.2 M parameters);
- two GPUs or more (a workshop box): one NCCL rank per GPU and the default GPT (3.2 M parameters).

Any field can be overridden: ``labs.lab_config(world_size=2)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import torch

from ...arguments import choice, count, flag, text
from ...models import GPTConfig


def in_ci() -> bool:
    """True when the notebook runs in the kit's CI (``CI=true``): small sizes, reference solutions."""
    return os.environ.get("CI", "").lower() == "true"


@dataclass(frozen=True)
class LabConfig:
    world_size: int
    backend: str                 # "gloo" (CPU processes) or "nccl" (one GPU per rank)
    model: str                   # "tiny" or "default": the GPT size jobs take
    steps: int                   # training steps where a lab trains
    global_batch: int            # sequences per step, split over the ranks
    ci: bool
    gpus: int
    why: str = field(default="", compare=False)

    @property
    def device(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"

    def gpt(self) -> GPTConfig:
        return GPTConfig.sized(self.model)

    def __str__(self) -> str:
        return (f"{self.world_size} ranks, {self.backend} on {self.device}, {self.model} GPT, "
                f"{self.steps} steps of {self.global_batch} sequences ({self.why})")


def lab_config(**overrides) -> LabConfig:
    """The sizes this machine runs the labs at; prints them. Keyword arguments override fields."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if in_ci():
        cfg = LabConfig(2, "gloo", "tiny", 3, 4, True, gpus, "CI=true: small and quick")
    elif gpus >= 2:
        cfg = LabConfig(gpus, "nccl", "default", 8, 4 * gpus, False, gpus, f"{gpus} GPUs here")
    else:
        cfg = LabConfig(4, "gloo", "default", 5, 8, False, gpus, "no two GPUs here")
    unknown = set(overrides) - set(LabConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"lab_config: unknown field(s) {sorted(unknown)}; fields: "
                        f"{', '.join(LabConfig.__dataclass_fields__)}")
    _check_overrides(overrides)
    if overrides:
        cfg = replace(cfg, **overrides)
    why = cfg.why
    if not cfg.ci:  # Note: after the overrides, so it names the ranks that will run
        why += (f": {cfg.world_size} NCCL ranks, one per GPU" if cfg.backend == "nccl" else
                f": {cfg.world_size} CPU processes with gloo")
    if overrides:
        why += "; changed by you: " + ", ".join(overrides)
    cfg = replace(cfg, why=why)
    if cfg.global_batch % cfg.world_size:
        raise ValueError(f"global_batch {cfg.global_batch} does not split over {cfg.world_size} "
                         f"ranks: pick a multiple of {cfg.world_size}")
    print(f"lab config: {cfg}")
    return cfg


def _check_overrides(overrides: dict) -> None:
    """Each field given to lab_config, by name, before anything is chosen."""
    for name in ("world_size", "steps", "global_batch", "gpus"):
        if name in overrides:
            count(f"lab_config({name})", overrides[name], at_least=0 if name == "gpus" else 1)
    if "world_size" in overrides and overrides["world_size"] > 64:
        raise ValueError(f"lab_config(world_size) must be at most 64 (each rank is a process "
                         f"on this machine), got {overrides['world_size']}")
    if "backend" in overrides:
        choice("lab_config(backend)", overrides["backend"], ("gloo", "nccl"))
    if "model" in overrides:
        choice("lab_config(model)", overrides["model"], ("tiny", "default"))
    if "ci" in overrides:
        flag("lab_config(ci)", overrides["ci"])
    if "why" in overrides:
        text("lab_config(why)", overrides["why"], empty_ok=True)
