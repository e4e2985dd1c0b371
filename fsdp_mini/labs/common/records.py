"""What a check records of one run, and where: configurations and records.

    cfgs = spread(world_size=[1, 2, 3, 4], numel=[3, 7])     # every combination, smallest first
    record.see("weights", state, step=2)                      # on rank ``record.rank``
    record.get("weights", rank=1, step=2)                     # what rank 1 had after step 2

See :mod:`fsdp_mini.labs.common.differential` for the checks that compare two records.
"""

from __future__ import annotations

import itertools

import torch

from .checking import user_line


# -- configurations ------------------------------------------------------------------------------

class Config(dict):
    """One point of the spread: named fields (``world_size``, ``numel``, ``steps``...)."""

    def __hash__(self):
        return hash(repr(sorted(self.items(), key=lambda kv: kv[0])))

    def words(self) -> str:
        """``world size 3, numel 7`` (what a verdict says of where it looked)."""
        return ", ".join(f"{k.replace('_', ' ')} {shown(v)}" for k, v in self.items()
                         if not k.startswith("_"))


def spread(**axes) -> list[Config]:
    """Every combination of the axes' values, smallest first (by each numeric field in turn)."""
    names = list(axes)
    out = [Config(zip(names, values)) for values in itertools.product(*axes.values())]
    return sorted(out, key=size)


def size(cfg: Config) -> tuple:
    """How big a configuration is: its numbers in field order (lists and dicts count their
    length; names count nothing, so they keep the order given)."""
    def one(v):
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return 0
        if isinstance(v, (int, float)):
            return v
        return len(v) if hasattr(v, "__len__") else 0
    return tuple(one(v) for v in cfg.values())


# -- what a run records --------------------------------------------------------------------------

class Record:
    """What one run showed, in the order it happened: ``see(observable, value, step=, rank=...)``."""

    def __init__(self, rank: int = 0):
        self.rank, self.seen, self.error, self.seconds = rank, {}, None, 0.0

    def see(self, observable: str, value, **where) -> None:
        where.setdefault("rank", self.rank)
        key = (observable, tuple(sorted(where.items())))
        self.seen[key] = _portable(value)

    def get(self, observable: str, **where):
        """What was seen of ``observable`` there (rank 0 unless said), or None."""
        where.setdefault("rank", 0)
        return self.seen.get((observable, tuple(sorted(where.items()))))

    def fail(self, error: BaseException, traceback: str = "") -> None:
        message, line = str(error), user_line(traceback)
        if any(words in message for words in PEER_GONE):
            # Note: gloo's words when a peer exits (or never comes) while this rank waits for
            # it: the peer never joined the collective this rank was in
            self.error = ("a hang", f"rank {self.rank} waited in a collective" + (
                f" (at {line})" if line else "") + " that another rank never joined: it had "
                "gone on and finished", "")
        else:
            self.error = (type(error).__name__, message[:500], line)


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
             "Timed out waiting")


def _portable(value):
    """What travels back from a rank: tensors detached on the CPU, containers as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_portable(v) for v in value)
    return value


def shown(v) -> str:
    if isinstance(v, torch.Tensor):
        if v.numel() <= 4:
            return "[" + ", ".join(f"{x:.4g}" for x in v.flatten().tolist()) + "]"
        return f"a tensor of {tuple(v.shape)}, norm {float(v.double().norm()):.4g}"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)) and (len(v) > 6 or any(isinstance(x, (dict, list, tuple))
                                                            for x in v)):
        return f"{len(v)} of them"
    return repr(v) if isinstance(v, str) else str(v)
