"""HSDP (hybrid sharding): FSDP inside groups of S ranks, plain replication across the groups.

The N ranks form G = N/S *shard groups* of S consecutive ranks (e.g. the GPUs of one host). Inside
a group the model is sharded exactly as under FSDP at world size S: gather a unit to use it,
reduce-scatter its gradient. Across groups every rank's shard is a *replica* of the same shard
in the other groups, so after each reduce-scatter the averaged gradient shard is all-reduced over
the *replicate group* (the ranks with the same index in every shard group) and divided by G.

Example, N = 4, S = 2 (two hosts of two GPUs), a unit of 4 parameters w::

    shard groups      {0, 1}  {2, 3}           rank 0 and rank 2 keep w[0:2], ranks 1 and 3 w[2:4]
    replicate groups  {0, 2}  {1, 3}
    backward          each group reduce-scatters its 2 local gradients: rank 0 [(a0+b0)/2 ...]
    replicate         rank 0 and rank 2 all-reduce their shards and divide by 2: the mean of all 4

Per rank per step (ring model, Ψ padded elements, 4 bytes each, all units freed after forward):

    inside the group  all-gather Ψ twice + reduce-scatter Ψ    3(S−1)/S x 4Ψ    (as FSDP at S)
    across groups     all-reduce of the Ψ/S shard              2(G−1)/G x 4Ψ/S

so the slow links between hosts carry 2M(G−1)/(SG) for a model of M bytes, instead of FSDP's
3M(N−1)/N over every link (the FSDP paper's 2M(W−1)/(GW), with its G = S and W = G here).
Memory per rank is FSDP's at world size S: 16Ψ/S with Adam, the price of the cheaper traffic.
``shard_size=N`` is FSDP; ``shard_size=1`` is DDP (whole copies, one all-reduce of Ψ).

The ledger says which group each collective ran on (``record.group``: ``"shard"``,
``"replicate"``, or ``"world"`` for the initial broadcast). ``fsdp_mini.clip_grad_norm_`` sums
the norm over the shard group only: the replicas hold equal copies of the same shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..comm.collectives import Comm, Tag, broadcast_module_states
from ..theory import hsdp_sent_bytes, memory_formula
from .algorithm import FSDP
from .group import FlatGroup


class HSDP(FSDP):
    """FSDP over a shard group of ``shard_size`` ranks, replicated over the N/S groups."""

    strategy = "hsdp"
    traffic = "≈ 3Ψ in the group + 2Ψ/S across"

    def __init__(self, module: nn.Module, comm: Comm, recorder=None, units=(),
                 shard_size: int | None = None, **fsdp_options):
        self.shard_size, self.replicas = _check_shard_size(shard_size, comm)
        self.world_comm = comm
        shard_comm, self.replicate_comm = _make_comms(comm, self.shard_size)
        super().__init__(module, shard_comm, recorder, units, **fsdp_options)
        self.watch.strategy = "hsdp"

    @classmethod
    def options(cls) -> set[str]:
        """FSDP's options, and ``shard_size``."""
        return FSDP.options() | {"shard_size"}

    # -- the two places HSDP differs from FSDP --------------------------------------------------

    def broadcast_initial_states(self, module: nn.Module) -> None:
        # Note: over the world, not the shard group: every group must start from the same weights.
        broadcast_module_states(module, self.world_comm)

    def reduce_shard_grad(self, group: FlatGroup, mean: torch.Tensor) -> torch.Tensor:
        """The shard group's averaged gradient shard -> the average over every group."""
        if self.replicas == 1:
            return mean
        self.replicate_comm.all_reduce(mean, label=Tag(group.label, "replicate"))
        return mean.div_(self.replicas)  # Note: −0.0 (no gradient anywhere) stays −0.0

    # -- formulas --------------------------------------------------------------------------------

    def sent_bytes_per_step(self) -> float:
        """FSDP's bytes at world size S, plus the all-reduce of each gradient shard over G."""
        return hsdp_sent_bytes(self.unit_sizes(), self.shard_size, self.world_comm.world_size,
                               *self.collective_bytes())

    @classmethod
    def formulas(cls, element_size: int = 4) -> dict[str, str]:
        memory = memory_formula(cls.sharded).replace("/N", "/S")
        e = element_size
        return {"memory": memory,
                "sent": f"3Ψ·{e}(S−1)/S in the group + 2Ψ/S·{e}(G−1)/G across, G = N/S"}


def _check_shard_size(shard_size, comm: Comm) -> tuple[int, int]:
    """(S, G) once ``shard_size`` is known to divide the world size."""
    n = comm.world_size
    if shard_size is None:
        raise TypeError(f"hsdp needs shard_size=S, the ranks that shard the model together (e.g. "
                        f"the GPUs of one host: under torchrun int(os.environ['LOCAL_WORLD_SIZE'])"
                        f"); world size {n}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int):
        raise TypeError(f"shard_size must be an int, got {shard_size!r}")
    if not 1 <= shard_size <= n or n % shard_size:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise ValueError(f"shard_size must divide the world size {n} (1 <= S <= {n}), got "
                         f"{shard_size}; use one of {divisors}")
    if dist.is_available() and dist.is_initialized() and n != dist.get_world_size():
        raise ValueError("hsdp builds its shard and replicate groups from the whole world; call "
                         "parallelize without process_group")
    return shard_size, n // shard_size


def _make_comms(comm: Comm, shard_size: int) -> tuple[Comm, Comm]:
    """A Comm on this rank's shard group and one on its replicate group, on ``comm``'s ledger.

    Note: ``dist.new_group`` must be called by every rank for every group, in the same order,
    even for groups the rank is not in: first the shard groups, then the replicate groups.
    """
    n, rank = comm.world_size, comm.rank
    shared = {"ledger": comm.ledger, "check_collectives": comm.check is not None,
              "link": comm.link}
    if n == 1:
        return Comm(name="shard", **shared), Comm(name="replicate", **shared)
    shard_groups = [dist.new_group(list(range(g * shard_size, (g + 1) * shard_size)))
                    for g in range(n // shard_size)]
    replicate_groups = [dist.new_group(list(range(i, n, shard_size))) for i in range(shard_size)]
    return (Comm(shard_groups[rank // shard_size], name="shard", **shared),
            Comm(replicate_groups[rank % shard_size], name="replicate", **shared))
