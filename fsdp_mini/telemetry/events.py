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
        self._lines: dict[str, int] = {}  # complete lines read so far, per file

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
            first = self._lines.get(path, 0) + 1
            self._lines[path] = first - 1 + len(lines) - 1
            events.extend(parse_lines(path, lines[:-1], first))
        return events


def parse_lines(path: str, lines: list[str], first: int = 1) -> list[dict]:
    """The events of ``lines`` (line ``first`` of ``path`` onwards); a clear error naming the
    file and the line for one that is not an event."""
    events = []
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}, line {number}: not a JSON event ({e.msg}): "
                             f"{line[:80]!r}; the file is damaged or not an event file of the "
                             f"kit") from None
        if not isinstance(event, dict):
            raise ValueError(f"{path}, line {number}: an event is a JSON object, got "
                             f"{line[:80]!r}")
        events.append(event)
    return events


def load_events(path: str) -> list[dict]:
    """Every event of a finished job, from its folder (or from one ``.jsonl`` file)."""
    if os.path.isfile(path):
        with open(path) as f:
            return parse_lines(path, f.read().split("\n"))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no events at {path}: give the events folder of a job, or one "
                                f"of its events_rank*.jsonl files")
    if not glob.glob(os.path.join(path, "events_rank*.jsonl")):
        raise ValueError(f"{path} holds no events_rank*.jsonl files: is it the events folder of "
                         f"a job (the folder the ranks wrote with FSDP_MINI_EVENTS_DIR set)?")
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
