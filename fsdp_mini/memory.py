"""Memory, per rank: live tensor bytes by category, current and peak, around any code.

``with track_memory(model, optimizer) as mem: ...`` counts the bytes of every live tensor storage
of this process, the way a GPU allocator would report "allocated" memory:

* at entry, every tensor already alive (found through the garbage collector) is counted;
* inside, every aten op's outputs are seen by a ``TorchDispatchMode``; a storage is counted once
  however many views point at it, and is uncounted when it dies (a weak reference's callback);
* storage resizes (``tensor.untyped_storage().resize_(0)``, how FSDP frees a gathered unit while
  autograd still holds views of it) are caught too.

The figures are identical run to run, so a test can assert on them. On CUDA the allocator's own
figures (allocated, peak, reserved) are read as well, in ``mem.cuda``.

Categories
    ``params``           parameter storage a rank keeps between steps (its shard under ZeRO-3/FSDP)
    ``gathered_params``  full parameters of a unit, alive only while the unit is unsharded
    ``grads``            gradients kept for the optimizer (full, or this rank's shard)
    ``optimizer_state``  optimizer state (Adam's two moments, momentum buffers, step counters)
    ``comm_buffers``     buffers that only exist to be sent or received (buckets, flat grads)
    ``activations``      everything else: activations saved for backward and temporaries

A storage gets its category in one of two ways: code that allocates it says so
(``with allocating("comm_buffers"): ...``, which the engine does), or one of the *sources* passed
to ``track_memory`` claims it: an object with a ``memory_categories()`` method (fsdp_mini's
wrapped models and optimizers), a plain ``nn.Module`` (its parameters and their gradients) or a
``torch.optim.Optimizer`` (its state). Sources are consulted at entry, at each ``mark`` and when a
new peak is reached, so the breakdown at the peak is exact.

Tensors alive at entry that no source claims (another model, a dataset) count in the process
totals (``current_bytes``, ``peak_bytes``) but in no category: ``own_peak_bytes`` and the
categories describe the block's work and its sources alone, so two models living side by side in
one process can be measured one after the other.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES = ("params", "gathered_params", "grads", "optimizer_state", "comm_buffers",
              "activations")
OTHER = "activations"
EXTERNAL = "external"  # alive at entry, claimed by no source: in the totals, in no category
PERSISTENT = ("params", "grads", "optimizer_state")  # the model state kept between steps

_current_category: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fsdp_mini_allocating", default=None)


@contextlib.contextmanager
def allocating(category: str):
    """Tensors created inside this block are counted under ``category``."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown memory category {category!r}; use one of {CATEGORIES}")
    token = _current_category.set(category)
    try:
        yield
    finally:
        _current_category.reset(token)


@dataclass
class Snapshot:
    label: str
    time: float
    total_bytes: int
    by_category: dict[str, int]
    cuda: dict[str, int] = field(default_factory=dict)  # the allocator's figures, on GPUs
    own_peak_bytes: int = 0  # the tracker's own peak so far: the mark that raised it ends the
    #                          phase where the peak happened (the peak falls between two marks)


@dataclass
class _Storage:
    nbytes: int
    category: str
    ref: weakref.ref


@dataclass
class MemoryTracker:
    """Live tensor bytes of this process while active. Use through :func:`track_memory`."""

    sources: tuple = ()
    current_bytes: int = 0
    peak_bytes: int = 0
    by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    peak_by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    at_peak: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    own_peak_bytes: int = 0   # highest total of the categories (the process less EXTERNAL)
    external_bytes: int = 0
    entry_bytes: int = 0
    entry_by_category: dict[str, int] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)
    cuda: dict[str, int] = field(default_factory=dict)
    active: bool = False
    _live: dict[int, _Storage] = field(default_factory=dict)
    _classifying: bool = False

    # -- what users read ------------------------------------------------------------------------

    def mark(self, label: str) -> Snapshot | None:
        """Record a labelled snapshot (a point on this rank's memory timeline)."""
        if not self.active:
            return None
        self._classify_sources()
        snap = Snapshot(label, time.time(), self.current_bytes, dict(self.by_category),
                        cuda_figures(), self.own_peak_bytes)
        self.snapshots.append(snap)
        return snap

    def reset_peak(self) -> None:
        """Start a new peak window from the current state (e.g. between phases)."""
        self._classify_sources()
        self.peak_bytes = self.current_bytes
        self.own_peak_bytes = self.current_bytes - self.external_bytes
        self.peak_by_category = dict(self.by_category)
        self.at_peak = dict(self.by_category)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def category_bytes(self) -> dict[str, int]:
        self._classify_sources()
        return dict(self.by_category)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _see(self, t, category: str | None = None) -> None:
        for st in _storages(t):
            key = st._cdata
            entry = self._live.get(key)
            if entry is None:
                cat = category or _current_category.get() or OTHER
                ref = weakref.ref(st, lambda _, key=key: self._forget(key))
                self._live[key] = _Storage(0, cat, ref)
                self._add(key, st.nbytes())
            elif entry.nbytes != st.nbytes():
                self._add(key, st.nbytes() - entry.nbytes)

    def _storage_resized(self, st: torch.UntypedStorage) -> None:
        entry = self._live.get(st._cdata)
        if entry is None:
            self._see(st)
        elif entry.nbytes != st.nbytes():
            self._add(st._cdata, st.nbytes() - entry.nbytes)

    def _add(self, key: int, delta: int) -> None:
        entry = self._live[key]
        entry.nbytes += delta
        self.current_bytes += delta
        self._count(entry.category, delta)
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        if self.current_bytes - self.external_bytes > self.own_peak_bytes:
            self.own_peak_bytes = self.current_bytes - self.external_bytes
            self._classify_sources()
            self.at_peak = dict(self.by_category)

    def _count(self, category: str, delta: int) -> None:
        if category == EXTERNAL:
            self.external_bytes += delta
            return
        self.by_category[category] += delta
        if self.by_category[category] > self.peak_by_category[category]:
            self.peak_by_category[category] = self.by_category[category]

    def _forget(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.current_bytes -= entry.nbytes
            self._count(entry.category, -entry.nbytes)

    def _set_category(self, t, category: str) -> None:
        for st in _storages(t):
            entry = self._live.get(st._cdata)
            if entry is None:
                self._see(st, category)
            elif entry.category != category:
                self._count(entry.category, -entry.nbytes)
                entry.category = category
                self._count(category, entry.nbytes)

    def _classify_sources(self) -> None:
        if not self.active or self._classifying:
            return
        self._classifying = True
        try:
            for source in self.sources:
                for category, tensors in categories_of(source).items():
                    for t in tensors:
                        if t is not None:
                            self._set_category(t, category)
        finally:
            self._classifying = False


def categories_of(source) -> dict[str, list[torch.Tensor]]:
    """The tensors ``source`` owns, by memory category (see the module docstring)."""
    if hasattr(source, "memory_categories"):
        return source.memory_categories()
    if isinstance(source, torch.nn.Module):
        params = list(source.parameters())
        return {"params": params, "grads": [p.grad for p in params]}
    if isinstance(source, torch.optim.Optimizer):
        return {"optimizer_state": [v for state in source.state.values()
                                    for v in state.values() if isinstance(v, torch.Tensor)]}
    raise TypeError(f"track_memory: cannot tell the memory categories of a "
                    f"{type(source).__name__}; pass an nn.Module, an optimizer, or an object "
                    f"with a memory_categories() method")


def _storages(t) -> list[torch.UntypedStorage]:
    """The storages holding a tensor's data (a DTensor's local shard, for instance), or the
    storage itself when given one."""
    if isinstance(t, torch.UntypedStorage):
        return [t] if t.device.type != "meta" else []
    if type(t) in (torch.Tensor, torch.nn.Parameter) or not hasattr(t, "__tensor_flatten__"):
        return [t.untyped_storage()] if t.device.type != "meta" else []
    names, _ = t.__tensor_flatten__()
    inner = [getattr(t, name) for name in names]
    return [st for i in inner if isinstance(i, torch.Tensor) for st in _storages(i)]


class _SeeOutputs(TorchDispatchMode):
    def __init__(self, tracker: MemoryTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.tracker._see(leaf)
        return out


@contextlib.contextmanager
def track_memory(*sources):
    """Count live tensor bytes of this process, by category, while the block runs.

    Example (one rank of FSDP at world size 4, a 1000-parameter model in fp32 with Adam)::

        with track_memory(model, optimizer) as mem:
            loss = model(x).sum(); loss.backward(); optimizer.step()
        mem.peak_bytes                        # highest total of the process in the block
        mem.own_peak_bytes                    # ... counting only the categories below
        mem.peak_by_category["params"]        # 1000/4 x 4 B = 1000 B: the shard, not the model
        mem.at_peak                           # breakdown at the moment of the peak

    Note: only one tracker can be active in a process: while it is, ``UntypedStorage.resize_``
    is patched for the whole process. A storage resize (how FSDP frees a gathered unit) is not an
    aten op, so the dispatch mode never sees it; and it may run on a thread other than this one
    (autograd runs GPU backward on its own threads), so the patch cannot be limited to a thread.
    It is removed when the block ends, also on an exception.
    """
    tracker = MemoryTracker(sources=sources)
    original_resize = torch.UntypedStorage.resize_
    if getattr(original_resize, "_fsdp_mini_tracker", False):
        raise RuntimeError("track_memory is already active in this process; nest the work in "
                           "the outer block instead of opening a second one")

    def resize_(storage, size):
        result = original_resize(storage, size)
        tracker._storage_resized(storage)
        return result

    resize_._fsdp_mini_tracker = True
    _count_existing_tensors(tracker)
    tracker.active = True
    tracker._classify_sources()
    for entry in tracker._live.values():  # what no source claimed belongs to someone else
        if entry.category == OTHER:
            tracker._count(OTHER, -entry.nbytes)
            entry.category = EXTERNAL
            tracker._count(EXTERNAL, entry.nbytes)
    tracker.reset_peak()
    tracker.entry_bytes, tracker.entry_by_category = tracker.current_bytes, dict(tracker.by_category)
    torch.UntypedStorage.resize_ = resize_
    try:
        with _SeeOutputs(tracker):
            yield tracker
    finally:
        torch.UntypedStorage.resize_ = original_resize
        tracker._classify_sources()
        tracker.active = False
        tracker.cuda = cuda_figures()


def cuda_figures() -> dict:
    """What this rank's GPU holds beyond the tensors the categories count (empty on the CPU)::

        tensors counted <= allocated (live blocks) <= reserved (cached) <= device used

    ``allocated_bytes`` and ``reserved_bytes`` are the caching allocator's; ``device_used_bytes``
    is what ``nvidia-smi`` shows for the whole GPU (NVML, else ``cudaMemGetInfo``): it adds the
    CUDA context, NCCL's buffers, library workspaces and any other process on the GPU.
    """
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    free, total = torch.cuda.mem_get_info()
    try:
        used, source = torch.cuda.device_memory_used(), "nvml"  # Note: needs nvidia-ml-py
    except Exception:  # noqa: BLE001  (no NVML: the driver's own free/total)
        used, source = total - free, "cudaMemGetInfo"
    return {"allocated_bytes": torch.cuda.memory_allocated(),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "reserved_bytes": torch.cuda.memory_reserved(),
            "device_used_bytes": used, "device_total_bytes": total, "device_source": source}


def _count_existing_tensors(tracker: MemoryTracker) -> None:
    # Note: ``type(obj)`` rather than ``isinstance``: some module-level objects warn or import
    # lazily when their ``__class__`` is asked for.
    for obj in gc.get_objects():
        if issubclass(type(obj), (torch.Tensor, torch.UntypedStorage)):
            try:
                tracker._see(obj)
            except (RuntimeError, NotImplementedError):
                pass  # tensors without storage (sparse, functional wrappers)
