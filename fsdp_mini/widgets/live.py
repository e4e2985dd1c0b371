"""What every live widget shares: events in, totals kept, redrawn at a bounded rate."""

from __future__ import annotations

import base64
import io
import time

import ipywidgets as W
from IPython.display import Image, display

from ..telemetry import LaunchFeed, load_events
from ..telemetry.runstate import Runs

# -- the common live machinery --------------------------------------------------------------------

class _Live(W.VBox, LaunchFeed):
    """Accumulates events in :class:`~fsdp_mini.telemetry.runstate.Runs` and redraws, throttled by time."""

    def __init__(self, min_interval: float = 0.15, clock=time.monotonic, **kwargs):
        super().__init__(**kwargs)
        self.min_interval, self._clock = min_interval, clock
        self.runs, self.redraws, self.figure, self._shown_figure = Runs(), 0, None, None
        self._handle = None
        self.status, self.world_size = "waiting for events", None
        self._last_draw, self._dirty, self._displayed = float("-inf"), False, False

    @classmethod
    def from_events(cls, events, **kwargs):
        """A view of recorded events: a list of dicts, or a folder / ``.jsonl`` file of them."""
        view = cls(**kwargs)
        view.runs.add(load_events(events) if isinstance(events, (str, bytes)) or
                      hasattr(events, "__fspath__") else events)
        view.status = "recorded"
        view.redraw(final=True)
        return view

    def _repr_mimebundle_(self, **kwargs):
        self._displayed = True
        return super()._repr_mimebundle_(**kwargs)

    def start(self, world_size: int) -> None:
        self.world_size, self.status = world_size, "running"
        if not self._displayed:
            # Note: displayed with an id, so finish() can add the static figure to this very
            # output: JupyterLab shows the widget, nbconvert and GitHub the figure.
            self._handle = display(self, display_id=True)
            self._displayed = True
        self.redraw()

    def update(self, events) -> None:
        if events:
            self.runs.add(events)
            self._dirty = True
        self.tick()

    def tick(self) -> None:
        """Redraw if something new came and the last redraw is ``min_interval`` old."""
        if self._dirty and self._clock() - self._last_draw >= self.min_interval:
            self.redraw()

    def launch_poll(self) -> None:
        super().launch_poll()
        self.tick()  # draws what came in the last throttled update, even if nothing new comes

    def finish(self, ok: bool) -> None:
        self.status = "finished" if ok else "failed"
        self.redraw(final=True)
        if len(self.runs):
            # Note: shown as a PNG, not display(figure): a pyplot-free Figure has a PNG form only
            # while matplotlib's inline backend is loaded, and nbconvert/GitHub need the PNG.
            self.figure = self.static_figure()
            png = _png(self.figure, dpi=80)
            if self._handle is not None:  # one output: the live widget, or else its figure
                self._handle.update({
                    "application/vnd.jupyter.widget-view+json": {
                        "version_major": 2, "version_minor": 0, "model_id": self.model_id},
                    "image/png": base64.b64encode(png).decode(),
                    "text/plain": f"{type(self).__name__} ({self.status})"}, raw=True)
                return
            image = Image(png, format="png")
            if self._shown_figure is None:  # the first launch: a new output
                self._shown_figure = display(image, display_id=True)
            else:  # a later launch (a Comparison's next strategy): replace that output
                self._shown_figure.update(image)

    def redraw(self, final: bool = False) -> None:
        self._last_draw, self._dirty = self._clock(), False
        self.redraws += 1
        self.render(final)

    def render(self, final: bool) -> None:
        raise NotImplementedError

    def static_figure(self):
        raise NotImplementedError


def _png(fig, dpi) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
