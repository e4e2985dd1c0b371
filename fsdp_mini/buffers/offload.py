"""CPU offload (``offload=True``): the shards live in CPU memory, the units compute on the GPU.

What stays on the GPU is only what a unit needs while it runs: the gathered unit and its
activations. Everything a rank keeps between steps moves to host memory:

    shard (params)      CPU, pinned      copied to the GPU just before each all-gather
    gradient shard      CPU              copied back after each reduce-scatter
    optimizer state     CPU              the optimizer steps on the CPU pieces

Example, N = 2, Ψ = 1 M parameters, fp32 Adam, per rank::

    GPU memory kept between steps   no offload  (4 + 4 + 8) Ψ / 2 = 8 MB     offload  0 MB
    host memory                     no offload  0                          offload  8 MB
    traffic between host and GPU    + one shard up per all-gather, one gradient shard down

Note: ranks that already run on the CPU have nothing to offload; the option then warns once
and changes nothing.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def check_offload(module: nn.Module) -> bool:
    """Whether offloading means anything for ``module`` (its parameters are on a GPU)."""
    devices = {p.device.type for p in module.parameters()}
    if devices == {"cpu"}:
        warnings.warn("offload=True has no effect: the model is on the CPU already, so its "
                      "shards, gradients and optimizer state live there anyway. Move the model "
                      "to its rank's GPU first (model.to(fsdp_mini.rank_device())) to offload",
                      stacklevel=4)
        return False
    return True


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t``, pinned when ``t`` is on a GPU (so copies back can be asynchronous)."""
    host = t.detach().to("cpu", copy=True)
    return host.pin_memory() if t.is_cuda else host
