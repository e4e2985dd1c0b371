"""A cheap memory view for live telemetry, sampled at phase boundaries.

:func:`~fsdp_mini.memory.track_memory` sees every tensor the program makes, through a
``TorchDispatchMode``. That is exact, but it puts Python on every op: on the tiny GPT it costs
about 30 % of a CPU training step, far too much to leave on while a learner watches a dashboard.

``LiveMemory`` looks only where the memory *is* in training:

* the tensors its sources own, by category (model state, gathered units, buckets...), read at
  each sample (a few dozen tensors);
* the activations autograd saves for backward, seen through
  ``torch.autograd.graph.saved_tensors_hooks`` (one call per saved tensor, in forward only).

It misses short-lived temporaries that are neither (a matmul's output consumed at once), so its
figures are a lower bound of ``track_memory``'s; the categories it reports are exact. On a GPU the
allocator's own figures come with every sample.
"""

from __future__ import annotations

import weakref

import torch

from ..memory import CATEGORIES, OTHER, _storages, categories_of, cuda_figures


class LiveMemory:
    """Samples of model state by category + activations saved for backward, per rank.

    Example::

        live = LiveMemory(model, optimizer)
        with live:                         # installs the saved-tensor hooks
            loss = model(x).sum()          # activations saved for backward are now counted
            total, by_category = live.sample()
            loss.backward()                # ... and released again
    """

    def __init__(self, *sources, device_memory=None):
        self.sources = sources
        self._saved: dict[int, int] = {}  # storage -> its bytes when autograd saved it
        self._saved_bytes = 0             # their sum, kept up to date (no loop at sample time)
        self._hooks = None
        # Note: what the GPU says (fsdp_mini.memory.cuda_figures); a stand-in in the CPU tests
        on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.device_memory = device_memory or (cuda_figures if on_gpu else None)

    @property
    def active(self) -> bool:
        """Whether the saved-tensor hooks are installed (between ``__enter__`` and ``__exit__``)."""
        return self._hooks is not None

    def __enter__(self) -> "LiveMemory":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None

    def _pack(self, t):
        for st in ((t.untyped_storage(),) if type(t) in _TENSORS else _storages(t)):
            key = st._cdata
            if key not in self._saved:
                self._saved[key] = nbytes = st.nbytes()
                self._saved_bytes += nbytes
                weakref.finalize(st, self._release, key)
        return t

    def _release(self, key: int) -> None:
        self._saved_bytes -= self._saved.pop(key, 0)

    def sample(self) -> tuple[int, dict[str, int]]:
        """(total bytes, bytes by category) now. A storage is counted once, in the first
        category that claims it."""
        by_category = dict.fromkeys(CATEGORIES, 0)
        seen: set[int] = set()
        for source in self.sources:
            for category, tensors in categories_of(source).items():
                total = 0
                for t in tensors:
                    if t is None:
                        continue
                    # Note: the fast path for plain tensors; this runs at every phase boundary.
                    for st in ((t.untyped_storage(),) if type(t) in _TENSORS else _storages(t)):
                        key = st._cdata
                        if key not in seen:
                            seen.add(key)
                            total += st.nbytes()
                by_category[category] += total
        # activations: what autograd saved, less what a source already counted (weights, say)
        claimed = sum(self._saved.get(key, 0) for key in seen)
        by_category[OTHER] += self._saved_bytes - claimed
        return sum(by_category.values()), by_category

    def cuda(self) -> dict:
        """The allocator's and the device's figures (``cuda_figures``); empty on the CPU."""
        return self.device_memory() if self.device_memory is not None else {}


_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _unpack(t):
    return t
