"""Meta-device init: build a model too big for one rank, then materialise it one unit at a time.

A model built under ``with torch.device("meta"):`` has shapes but no values and costs no memory.
``parallelize`` accepts it: under fsdp (and hsdp) each unit, just before its flat group is built,
is *materialised* (allocated on ``device``), *initialised* (``param_init_fn(unit_module)``, or
by default every module's own ``reset_parameters()``), and then sharded: the rank keeps its 1/N
shard and frees the rest. Peak memory is about one unit (twice, while it is flattened) plus the
shards, never the whole model. Strategies that keep whole copies (single, ddp, zero) materialise
the whole model at once. Example::

    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=48))              # no memory yet
    torch.manual_seed(0)                                # the same init at any world size
    model, opt = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks))

Determinism: every rank initialises every unit *whole*, in a fixed order (the units in the order
given, then the root's own parameters), starting from rank 0's CPU random state (broadcast), so
the model does not depend on the world size. The init draws from a copy of that state: every
rank's own random state is as it was before ``parallelize`` (the kit never moves it). While the
root is initialised, the units' parameters and buffers are meta placeholders again: an init
that walks the whole model (like ``GPT.reset_parameters``) touches only the root's own tensors. Note: this is not always the
model ``Model()`` builds with the same seed: a plain build draws random numbers in construction
order (the root's embeddings first), and a model-level init that rewrites the blocks runs when
they are already sharded. Models whose init is each module's ``reset_parameters`` in module order,
with no parameters of their own in the root (a stack of layers), do come out equal.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from ..comm.collectives import Comm, Tag
from ..memory import allocating


def has_meta(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device (has no values)."""
    return any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))


class MetaInit:
    """How to materialise a meta model: the init function, the device, and the units.

    ``materialize(unit_module)`` turns the meta tensors of one unit (for the root: those no unit
    holds) into initialised real ones, in place in the module tree; returns the new parameters by
    the id of the meta ones they replace (FSDP's slots still refer to the meta ones).
    """

    def __init__(self, module: nn.Module, units=(), param_init_fn=None, device=None):
        self.root, self.units = module, list(units)
        self.param_init_fn = param_init_fn
        self.device = torch.device("cpu" if device is None else device)
        self._stand_ins = None  # meta stand-ins for the units' tensors, shown to the root's init
        self._rng = None  # the random state the next unit's init starts from (sync_rng)

    def sync_rng(self, comm: Comm) -> None:
        """Take rank 0's random state (the CPU's, and ``device``'s if it is a GPU) as the state
        every rank initialises from, so all ranks draw the same init. The ranks' own generators
        are left as they are: the init draws from a copy (see ``_drawing``)."""
        states = [torch.get_rng_state()] + ([torch.cuda.get_rng_state(self.device)]
                                            if self.device.type == "cuda" else [])
        for state in states:
            sent = state.to(comm.device)  # Note: NCCL broadcasts GPU tensors only
            comm.broadcast(sent, label=Tag("sync", "rng_state"))
            state.copy_(sent)
        self._rng = states

    @contextmanager
    def _drawing(self):
        """Run the init on the shared stream: it goes on where the last unit's init stopped,
        and the caller's random state is restored afterwards (the kit draws none of it)."""
        cuda = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self.device] if cuda else []):
            if self._rng is not None:
                torch.set_rng_state(self._rng[0])
                if cuda:
                    torch.cuda.set_rng_state(self._rng[1], self.device)
            yield
            self._rng = [torch.get_rng_state()] + ([torch.cuda.get_rng_state(self.device)]
                                                   if cuda else [])

    def materialize(self, module: nn.Module) -> dict[int, nn.Parameter]:
        """Allocate, initialise and return the meta parameters of ``module``'s unit."""
        if self._stand_ins is None:  # Note: at the first call, before any unit has values
            self._stand_ins = [(m, kind, name, _meta_like(t)) for u in self.units
                               for m in u.modules() for kind in ("_parameters", "_buffers")
                               for name, t in getattr(m, kind).items() if t is not None]
        modules = self._modules_of(module)
        new, names = {}, {}
        with torch.no_grad(), self._drawing():
            for m in modules:
                _allocate(m, self.device, new, names)
            if module is self.root and self.units:
                self._with_units_hidden(lambda: self._initialise(module, modules))
            else:
                self._initialise(module, modules)
        _check_initialised(modules, new, names)
        return new

    def _modules_of(self, module: nn.Module) -> list[nn.Module]:
        """The modules of this unit, children before parents (construction order); for the root,
        the modules no unit contains."""
        skip = {id(u) for u in self.units} if module is self.root else set()
        seen, order = set(), []

        def visit(m):
            if id(m) in seen or id(m) in skip:
                return
            seen.add(id(m))
            for child in m.children():
                visit(child)
            order.append(m)
        visit(module)
        return order

    def _initialise(self, module: nn.Module, modules: list[nn.Module]) -> None:
        if self.param_init_fn is not None:
            self.param_init_fn(module)
            return
        for m in modules:
            if callable(getattr(m, "reset_parameters", None)):
                m.reset_parameters()

    def _with_units_hidden(self, fn) -> None:
        saved = [(m, kind, name, getattr(m, kind)[name]) for m, kind, name, _ in self._stand_ins]
        for m, kind, name, stand_in in self._stand_ins:
            getattr(m, kind)[name] = stand_in
        try:
            fn()
        finally:
            for m, kind, name, t in saved:
                getattr(m, kind)[name] = t


def check_meta_init(module: nn.Module, param_init_fn, device) -> None:
    """Clear errors, before anything changes, for what would leave a meta model uninitialised."""
    if param_init_fn is not None and not callable(param_init_fn):
        raise TypeError(f"param_init_fn must be a function called with each unit's module, e.g. "
                        f"param_init_fn=lambda m: [s.reset_parameters() for s in m.modules() if "
                        f"hasattr(s, 'reset_parameters')]; got a {type(param_init_fn).__name__}")
    if device is not None and torch.device(device).type == "meta":
        raise ValueError("device= is where a meta model is materialised: a real device such as "
                         "'cpu' or fsdp_mini.rank_device(), not 'meta'")
    if param_init_fn is not None or not has_meta(module):
        return
    for name, m in module.named_modules():
        owns = [t for t in list(m._parameters.values()) + list(m._buffers.values())
                if t is not None and t.is_meta]
        parts = name.split(".") if name else []
        chain = [module.get_submodule(".".join(parts[:k])) for k in range(len(parts) + 1)]
        if owns and not any(callable(getattr(a, "reset_parameters", None)) for a in chain):
            raise ValueError(f"module {name or 'the root'!r} ({type(m).__name__}) has tensors on "
                             f"the meta device but no reset_parameters() (nor does any module "
                             f"above it) to initialise them; give it one, or pass "
                             f"param_init_fn=, a function that initialises a unit's module in "
                             f"place")


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    stand_in = torch.empty_like(t, device="meta")
    return nn.Parameter(stand_in, t.requires_grad) if isinstance(t, nn.Parameter) else stand_in


def _allocate(m: nn.Module, device: torch.device, new: dict[int, nn.Parameter],
              names: dict[int, str]) -> None:
    """Replace ``m``'s own meta parameters and buffers by uninitialised real ones.

    Note: replaced, not filled in: a meta tensor's ``.data`` cannot be set to a real one. Tied
    weights stay tied: a parameter met twice gets the same replacement (``new``, by id).
    """
    for name, p in m._parameters.items():
        if p is not None and p.is_meta:
            if id(p) not in new:
                with allocating("params"):
                    new[id(p)] = nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
                names[id(new[id(p)])] = f"{type(m).__name__}.{name}"
            m._parameters[name] = new[id(p)]
    for name, b in m._buffers.items():
        if b is not None and b.is_meta:
            m._buffers[name] = torch.empty_like(b, device=device)


def _check_initialised(modules: list[nn.Module], new: dict[int, nn.Parameter],
                       names: dict[int, str]) -> None:
    """After init, every tensor is real and every new parameter is still the one in the tree."""
    made = {id(p) for p in new.values()}
    for m in modules:
        for kind, tensors in (("parameter", m._parameters), ("buffer", m._buffers)):
            for name, t in tensors.items():
                if t is not None and t.is_meta:
                    raise ValueError(f"{kind} {type(m).__name__}.{name} is still on the meta "
                                     f"device after init; param_init_fn must initialise the "
                                     f"unit's tensors in place")
    alive = {id(p) for m in modules for p in m._parameters.values() if p is not None}
    gone = sorted(names[i] for i in made - alive)
    if gone:
        raise ValueError(f"param_init_fn replaced {', '.join(gone)} instead of initialising it in "
                         f"place; write into the existing tensor, e.g. with torch.no_grad(): "
                         f"module.weight.normal_(0, 0.02)")
