"""The text of a launch error, kept short: a rank's log may end in one 5 MB line.

Each piece has a cap (a line, the log's tail, a message, a traceback), and whatever is cut is named
by its size and the file that holds it whole, so nothing is lost, only left where it is.
"""
import os
import re

LINE_CHARS = 500          # one line of a log or traceback
TAIL_LINES = 40           # lines of the log shown
TAIL_CHARS = 8000         # ... and at most this many characters of them
SCAN_BYTES = 64 << 20     # how far back from the end of a log to look for its last lines
_CHUNK = 64 << 10
_DUMP_START = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+.*\(most recent call first\):", re.M)


def size(n):
    """A byte count for people: 740 B, 12.5 KB, 4.9 MB."""
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def clip(text, limit, where=None):
    """text cut to `limit` characters, saying how much more there is (and where to find it)."""
    if len(text) <= limit:
        return text
    more = size(len(text[limit:].encode(errors="replace")))
    return f"{text[:limit]} … ({more} more{f' in {where}' if where else ''})"


def _fit(lines, limit):
    """The last lines that fit in `limit` characters together."""
    kept, used = [], 0
    for line in reversed(lines):
        if used + len(line) + 1 > limit:
            break
        kept.append(line)
        used += len(line) + 1
    return kept[::-1]


def clip_lines(text, limit, where):
    """text (a traceback, a stack) with long lines clipped, and only its last `limit` characters."""
    lines = [clip(line, LINE_CHARS, where) for line in text.splitlines()]
    kept = _fit(lines, limit)
    if len(kept) < len(lines):
        kept.insert(0, f"… ({len(lines) - len(kept)} earlier lines not shown; see {where})")
    return "\n".join(kept)


def _end_without(path, total, traceback):
    """Where the log ends once the traceback the rank printed last is cut off (shown apart)."""
    tail = traceback.encode(errors="backslashreplace")
    if not traceback.strip() or len(tail) > total:
        return total
    with open(path, "rb") as f:
        f.seek(total - min(len(tail), _CHUNK))
        return total - len(tail) if f.read() == tail[-_CHUNK:] else total


def _line_spans(f, end, count):
    """(start, stop) byte offsets of the last `count` non-empty lines before `end`, oldest first.

    Note: reads backwards in chunks, so a huge log (or a huge last line) is never read whole.
    """
    spans, stop, pos = [], end, end
    while pos > 0 and len(spans) < count and end - pos < SCAN_BYTES:
        start = max(0, pos - _CHUNK)
        f.seek(start)
        chunk = f.read(pos - start)
        i = len(chunk)
        while len(spans) < count and (i := chunk.rfind(b"\n", 0, i)) >= 0:
            if start + i + 1 < stop or spans:
                spans.append((start + i + 1, stop))
            stop = start + i
        pos = start
    if len(spans) < count and stop > pos or (not spans and stop > 0):
        spans.append((pos, stop))  # the file's first line, or one longer than SCAN_BYTES
    return spans[::-1]


def _read_line(f, start, stop, path):
    f.seek(start)
    data = f.read(min(stop - start, 4 * LINE_CHARS))
    text = data.decode(errors="replace").rstrip("\r")
    shown = text[:LINE_CHARS]
    if len(shown) == len(text) and len(data) == stop - start:
        return shown
    more = stop - start - len(shown.encode(errors="replace"))
    return f"{shown} … ({size(more)} more in {path})"


def log_tail(path, traceback=""):
    """The end of a rank's log, capped, without the traceback printed at its end (shown apart)."""
    try:
        total = os.path.getsize(path)
    except OSError:
        return ""
    with open(path, "rb") as f:
        end = _end_without(path, total, traceback)
        lines = [_read_line(f, a, b, path) for a, b in _line_spans(f, end, TAIL_LINES)]
    while lines and not lines[-1].strip():
        lines.pop()
    lines = _fit(lines, TAIL_CHARS)
    if not lines:
        return ""
    whole = f" (the whole log: {size(total)})" if total > TAIL_CHARS else ""
    plural = "s" if len(lines) > 1 else ""
    return f"--- last {len(lines)} line{plural} of {path}{whole} ---\n" + "\n".join(lines)


def stack_dump(path):
    """The Python stacks a rank dumped into its log when it was stopped (faulthandler), or ""."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - _CHUNK))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    found = _DUMP_START.search(text)
    return text[found.start():].rstrip() if found else ""
