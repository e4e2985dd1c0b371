"""The strategies ``parallelize`` knows, by name.

The kit's own are listed below, one line each. A new strategy is a module with a subclass of
:class:`~fsdp_mini.strategy.Strategy` plus one line: here, or ``register_strategy(MyStrategy)``
at run time (the labs do that for the strategies learners write).
"""

from __future__ import annotations

from .ddp import DDP
from .fsdp.algorithm import FSDP
from .fsdp.hsdp import HSDP
from .strategy import Single, Strategy
from .zero import Zero1, Zero2

_BY_NAME: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Make ``parallelize(model, cls.strategy)`` build ``cls``; returns ``cls`` (a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"register_strategy takes a subclass of fsdp_mini.Strategy, got {cls!r}")
    if not isinstance(cls.strategy, str) or not cls.strategy.isidentifier():
        raise ValueError(f"{cls.__name__}.strategy must be a name such as 'my_ddp', got "
                         f"{cls.strategy!r}")
    kit = _BUILT_IN.get(cls.strategy)
    if kit is not None and kit is not cls:
        raise ValueError(f"{cls.__name__}.strategy is {cls.strategy!r}, the name of the kit's own "
                         f"{kit.__name__}; give your class a name of its own, e.g. strategy = "
                         f"'my_{cls.strategy}'")
    _BY_NAME[cls.strategy] = cls  # Note: a class of yours defined again (a cell re-run) replaces
    return cls


def get_strategy(name: str) -> type[Strategy]:
    if not isinstance(name, str):
        raise TypeError(f"strategy must be a strategy's name ({', '.join(_BY_NAME)}) or a "
                        f"Strategy class, got {name!r} (a {type(name).__name__})")
    if name not in _BY_NAME:
        raise ValueError(f"unknown strategy {name!r}; use one of {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def strategy_names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


_BUILT_IN: dict[str, type[Strategy]] = {}
for _cls in (Single, DDP, Zero1, Zero2, FSDP, HSDP):  # the kit's own, in ZeRO order
    register_strategy(_cls)
_BUILT_IN.update(_BY_NAME)  # their names stay theirs
