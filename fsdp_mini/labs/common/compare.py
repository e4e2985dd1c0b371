"""Comparing two records: the first divergence, in the order things happen, and its words.

``compare(mine, want, ...)`` walks the reference's record step by step (then by observable, then
by rank) and returns the first :class:`Divergence` of the answer's, or None; ``agree`` compares
two observed values (tensors relatively, numbers relatively, dicts and lists entry by entry) and
says where inside them and by how much they differ.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from .records import Config, Record, shown


# -- comparing two records ------------------------------------------------------------------------

@dataclass
class Divergence:
    """The first thing the answer's run did otherwise than the reference's."""

    config: Config
    observable: str
    where: dict
    mine: object
    want: object
    how_much: str = ""
    ratio: float | None = None        # mine / reference, for numbers and tensors alike
    path: str = ""                    # where inside the observed dict or list ("'0.weight'")
    whole: tuple = (None, None)       # the whole observed values (yours, the reference's)
    raised: tuple | None = None       # (type, message, `line` in function) if the answer raised
    agree: list = field(default_factory=list)     # configurations where everything agreed
    differ: list = field(default_factory=list)    # configurations where something differed
    later: list = field(default_factory=list)     # (step, yours - the reference's) from here on
    table: dict = field(default_factory=dict)     # {config: (the answer's, the reference's)}

    def pairs(self, observable: str, **where):
        """(config, yours, the reference's) of ``observable`` there, in every configuration."""
        for cfg, (mine, want) in self.table.items():
            yield cfg, mine.get(observable, **where), want.get(observable, **where)

    def only_where(self, test: Callable[[Config], bool]) -> bool:
        """Every differing configuration passes ``test`` and every agreeing one fails it."""
        return bool(self.differ) and all(map(test, self.differ)) and \
            not any(map(test, self.agree))

    @property
    def grows(self) -> bool:
        """The excess over the reference grows step after step (something kept, a leak)."""
        excess = [r for _, r in self.later if r is not None]
        return len(excess) >= 2 and all(b > a for a, b in zip(excess, excess[1:]))

    @property
    def from_a_later_step(self) -> bool:
        """The first step agreed and a later one did not (what carries over between steps)."""
        return self.where.get("step", 0) > 1


def compare(mine: Record, want: Record, order: tuple, tolerance: dict, cfg: Config):
    """The first divergence of ``mine`` from ``want`` (None if they agree), in causal order."""
    keys = sorted(want.seen, key=lambda k: _causal(k, order, want.seen))
    for key in keys:
        observable, where = key[0], dict(key[1])
        if key not in mine.seen:
            if mine.error is not None:
                return Divergence(cfg, "raised", where, None, None, raised=mine.error)
            return Divergence(cfg, observable, where, None, want.seen[key], "missing in yours",
                              whole=(None, want.seen[key]))
        a = agree(mine.seen[key], want.seen[key], tolerance.get(observable, 0))
        if not a.same:
            later = [(s, agree(mine.seen.get(k), want.seen[k], 0))
                     for s, k in _same_key_later(key, want.seen)]
            later = [(s, b.mine - b.want if _is_number(b.mine) and _is_number(b.want) else None)
                     for s, b in later]
            return Divergence(cfg, observable, where, a.mine, a.want, a.how, a.ratio,
                              path=a.path, whole=(mine.seen[key], want.seen[key]), later=later)
    if mine.error is not None:
        return Divergence(cfg, "raised", {}, None, None, raised=mine.error)
    extra = [k for k in mine.seen if k not in want.seen]
    if extra:
        key = min(extra, key=lambda k: _causal(k, order, mine.seen))
        return Divergence(cfg, key[0], dict(key[1]), mine.seen[key], None, "not in the reference",
                          whole=(mine.seen[key], None))
    return None


def _causal(key, order, seen) -> tuple:
    observable, where = key[0], dict(key[1])
    rank = order.index(observable) if observable in order else len(order)
    return (where.get("step", 0), rank, where.get("rank", 0), list(seen).index(key))


def _same_key_later(key, seen):
    where = dict(key[1])
    if "step" not in where:
        return []
    for k in seen:
        w = dict(k[1])
        if k[0] == key[0] and w.get("step", 0) >= where["step"] and \
                {a: b for a, b in w.items() if a != "step"} == \
                {a: b for a, b in where.items() if a != "step"}:
            yield w["step"], k


class Agreement(NamedTuple):
    same: bool
    how: str = ""                  # how much they differ, in words
    ratio: float | None = None     # mine / want (a tensor's projection on the reference's)
    path: str = ""                 # where inside a dict or list: "'0.weight'", "#2"
    mine: object = None            # the values that differ there
    want: object = None


def agree(mine, want, tol: float) -> Agreement:
    """Do two observed values agree (within ``tol``, relative)? If not, where and by how much."""
    if isinstance(want, torch.Tensor) or isinstance(mine, torch.Tensor):
        return _agree_tensors(mine, want, tol)
    if isinstance(want, dict) and isinstance(mine, dict) and set(want) == set(mine):
        return _agree_each(((repr(k), mine[k], want[k]) for k in want), tol)
    if isinstance(want, list) and isinstance(mine, list):
        if len(mine) != len(want):
            return Agreement(False, "", None, "", f"{len(mine)} of them", f"{len(want)}")
        return _agree_each(((f"#{i}", m, w) for i, (m, w) in enumerate(zip(mine, want))), tol)
    if isinstance(want, bool) or isinstance(mine, bool) or not (
            isinstance(want, (int, float)) and isinstance(mine, (int, float))):
        return Agreement(mine == want, "", None, "", mine, want)
    if math.isinf(want) or math.isinf(mine) or math.isnan(want) or math.isnan(mine):
        return Agreement(mine == want or (math.isnan(mine) and math.isnan(want)), "", None, "",
                         mine, want)
    if want == 0:
        return Agreement(mine == 0, "", None, "", mine, want)
    diff = abs(mine - want) / abs(want)
    return Agreement(diff <= tol, f"by {diff:.2g} (relative)", mine / want, "", mine, want)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _agree_tensors(mine, want, tol) -> Agreement:
    if not (isinstance(mine, torch.Tensor) and isinstance(want, torch.Tensor)):
        return Agreement(False, "", None, "", mine, want)
    if mine.shape != want.shape or mine.dtype != want.dtype:
        return Agreement(False, (f"shape {tuple(mine.shape)} {str(mine.dtype)[6:]}, the "
                                 f"reference's {tuple(want.shape)} {str(want.dtype)[6:]}"),
                         None, "", mine, want)
    if want.numel() == 0:
        return Agreement(True)
    m, w = mine.double().flatten(), want.double().flatten()
    if torch.isnan(m).any() and not torch.isnan(w).any():
        return Agreement(False, "nan where the reference has numbers", None, "", mine, want)
    rel = float((m - w).norm() / (w.norm() + 1e-12))
    ratio = float(m @ w / (w @ w)) if float(w @ w) > 0 else None
    return Agreement(rel <= tol, f"by {rel:.2g} (relative)", ratio, "", mine, want)


def _agree_each(items, tol) -> Agreement:
    """The first of ``(name, mine, want)`` that differs says where and by how much."""
    for name, m, w in items:
        a = agree(m, w, tol)
        if not a.same:
            return a._replace(path=name + (f"[{a.path}]" if a.path else ""))
    return Agreement(True)


def collective_words(mine, want) -> str:
    """What one ledger has that the other lacks: '2 all_reduce of 28 B that the reference does
    not make; the reference's all_reduce of 56 B is missing'."""
    have, need = Counter(mine or ()), Counter(want or ())

    def listed(c):
        return ", ".join(f"{n} {op} of {size:,} B" + (f" on {group}" if group != "world" else "")
                         for (op, size, group), n in sorted(c.items()))
    extra, missing = have - need, need - have
    parts = ([f"yours makes {listed(extra)} that the reference does not"] if extra else []) + \
        ([f"the reference's {listed(missing)} {'is' if sum(missing.values()) == 1 else 'are'} "
          f"missing in yours"] if missing else [])
    return "; ".join(parts) or "the same collectives in another order"


# -- words ----------------------------------------------------------------------------------------

def axes_in_words(cfgs) -> str:
    """'world sizes 1, 2, 3, 4', or the values of each axis that varies, in a few words."""
    axes = {k: sorted({shown(c[k]) for c in cfgs}) for k in (cfgs[0] if cfgs else {})
            if not k.startswith("_")}
    return ", ".join(f"{k.replace('_', ' ')} {' / '.join(v[:5])}{' ...' * (len(v) > 5)}"
                     for k, v in axes.items() if len(v) > 1 or k == "world_size")


def where_right(agree: list, differ: list) -> str:
    """Where the answer is right and where not: by the axis that separates them, if one does
    ("right with optimizer 'momentum', wrong with 'sgd', 'adam'"), else by counts."""
    total = len(agree) + len(differ)
    if not agree:
        return f"wrong in all {total} configurations"
    for axis in agree[0]:
        good = {shown(c[axis]) for c in agree}
        bad = {shown(c[axis]) for c in differ}
        if good and bad and not good & bad:
            name = axis.replace("_", " ")
            return (f"right with {name} {', '.join(sorted(good))}, wrong with "
                    f"{', '.join(sorted(bad))} ({len(agree)} of {total} configurations right)")
    return f"right in {len(agree)} of {total} configurations ({axes_in_words(agree)})"
