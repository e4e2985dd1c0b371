"""The caller side of telemetry: follow the ranks' event files live, or load them afterwards."""

from __future__ import annotations

import glob
import json
import os
import time


class EventTail:
    """Follows the ``events_rank*.jsonl`` files of a folder; ``read()`` returns new events."""

    def __init__(self, directory: str):
        self.directory = directory
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, str] = {}

    def read(self) -> list[dict]:
        events = []
        for path in sorted(glob.glob(os.path.join(self.directory, "events_rank*.jsonl"))):
            with open(path) as f:
                f.seek(self._offsets.get(path, 0))
                text = self._partial.pop(path, "") + f.read()
                self._offsets[path] = f.tell()
            lines = text.split("\n")
            if lines[-1]:
                self._partial[path] = lines[-1]  # a line still being written
            events.extend(json.loads(line) for line in lines[:-1] if line)
        return events


def load_events(path: str) -> list[dict]:
    """Every event of a finished job, from its folder (or from one ``.jsonl`` file)."""
    if os.path.isfile(path):
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    return EventTail(path).read()


class LaunchFeed:
    """What ``launch(..., monitor=...)`` talks to. Subclasses implement ``start(world_size)``,
    ``update(events)`` and ``finish(ok)``; this class does the tailing in between."""

    poll_seconds = 0.1

    def launch_started(self, world_size: int, events_dir: str) -> None:
        self._tail, self._last_poll = EventTail(events_dir), 0.0
        self.start(world_size)

    def launch_poll(self) -> None:
        if time.time() - self._last_poll >= self.poll_seconds:
            self._last_poll = time.time()
            events = self._tail.read()
            if events:
                self.update(events)

    def launch_finished(self, ok: bool) -> None:
        events = self._tail.read()
        if events:
            self.update(events)
        self.finish(ok)

    def start(self, world_size: int) -> None:
        pass

    def update(self, events: list[dict]) -> None:
        pass

    def finish(self, ok: bool) -> None:
        pass


class EventLog(LaunchFeed):
    """The simplest monitor: keeps every event in ``self.events``."""

    def __init__(self):
        self.events: list[dict] = []
        self.updates = 0

    def update(self, events: list[dict]) -> None:
        self.events.extend(events)
        self.updates += 1
