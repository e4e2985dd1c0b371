"""Why a launch failed: from each rank's outcome to one clear error about the first real cause.

When one rank fails, its peers fail too, a moment later ("Connection closed by peer", a timeout
in a collective). Those are consequences; the error names the rank that failed *first* for a
reason of its own, with its traceback and the end of its log, and lists the others in brief.
"""
import json
import os
import re
import signal

LOG_TAIL_LINES = 40
_SECONDARY_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError")
_PEER_LOST = re.compile(r"closed by peer|reset by peer|broken pipe|connection refused|connection reset"
                        r"|connection closed|socket closed|end of file", re.I)
_TIMED_OUT = re.compile(r"timed out|timeout", re.I)


def rank_file(launch_dir, rank, kind):
    """Path of a per-rank file: kind is "log", "result" or "error"."""
    return os.path.join(launch_dir, f"rank{rank}.{kind}")


class LaunchError(RuntimeError):
    """A rank failed. `rank`, `exc_type`, `message`, `traceback` describe the first failure."""

    def __init__(self, text, *, rank, exc_type, message, traceback, log_dir):
        super().__init__(text)
        self.rank, self.exc_type, self.message = rank, exc_type, message
        self.traceback, self.log_dir = traceback, log_dir


class LaunchTimeoutError(LaunchError, TimeoutError):
    """Ranks timed out in a collective (or never finished): some rank is probably stuck."""


def _outcome(launch_dir, rank, proc, exited_at):
    """What happened to one rank, as a dict with kind ok / error / signal / exit / running."""
    out = {"rank": rank, "time": exited_at.get(rank, float("inf")), "traceback": ""}
    try:
        with open(rank_file(launch_dir, rank, "error")) as f:
            return {**out, "kind": "error", **json.load(f)}
    except (FileNotFoundError, ValueError):
        pass
    rc = proc.returncode
    if rank not in exited_at:
        return {**out, "kind": "running", "type": "StillRunning", "message": f"rank {rank} was still running"}
    if rc < 0:
        name = signal.Signals(-rc).name
        hint = " (os.kill, or the out-of-memory killer)" if name == "SIGKILL" else ""
        return {**out, "kind": "signal", "type": name, "message": f"rank {rank} was killed by signal {name}{hint}"}
    if rc != 0 or not os.path.exists(rank_file(launch_dir, rank, "result")):
        return {**out, "kind": "exit", "type": f"ExitCode{rc}",
                "message": f"rank {rank} exited with code {rc} without raising a Python exception"}
    return {**out, "kind": "ok"}


def _is_secondary(o):
    """Errors of ranks that lost their peer or timed out waiting for it: consequences, not causes."""
    name = o["type"].rsplit(".", 1)[-1]
    return o["kind"] == "error" and (
        name in _SECONDARY_TYPES
        or (name == "RuntimeError" and bool(_PEER_LOST.search(o["message"]) or _TIMED_OUT.search(o["message"]))))


def _is_timeout(o):
    return _is_secondary(o) and bool(_TIMED_OUT.search(o["message"]))


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _blame(outcomes, timeout):
    """Choose the rank to blame: (error class, its outcome, headline).

    Note: the earliest *primary* failure (an exception of its own, a signal, an exit code) wins over
    earlier secondary ones. With only secondary failures, timeouts or stuck ranks mean a hang.
    """
    failed = sorted((o for o in outcomes if o["kind"] not in ("ok", "running")), key=lambda o: o["time"])
    causes = [o for o in failed if not _is_secondary(o)]
    stuck = [o["rank"] for o in outcomes if o["kind"] == "running"]
    timed_out = sorted(o["rank"] for o in failed if _is_timeout(o))
    if causes or not (stuck or timed_out):
        first = (causes or failed)[0]
        if first["kind"] == "error":
            return LaunchError, first, f"rank {first['rank']} failed first: {first['type']}: {first['message']}"
        return LaunchError, first, f"{first['message']}; it failed first"
    head = (f"{_ranks(timed_out)} timed out after {timeout:g} s waiting in a collective; " if timed_out
            else f"other ranks finished, but not within {timeout:g} s; ")
    head += (f"{_ranks(stuck)} still running, probably stuck (stopped; the Python stack it was in is "
             "dumped into its log, below)" if stuck else "no rank was left running")
    return LaunchTimeoutError, outcomes[(stuck or timed_out)[0]], head


def _log_tail(launch_dir, rank, traceback=""):
    """The last lines of a rank's log, without the traceback at its end (shown separately)."""
    path = rank_file(launch_dir, rank, "log")
    with open(path, errors="replace") as f:
        text = f.read().rstrip()
    if traceback.strip() and text.endswith(traceback.strip()):
        text = text[: -len(traceback.strip())]
    lines = text.splitlines()[-LOG_TAIL_LINES:]
    return lines and f"--- last {len(lines)} lines of {path} ---\n" + "\n".join(lines)


def _error(outcomes, launch_dir, timeout):
    """The exception to raise: headline, traceback and log of the blamed rank, the others in brief."""
    cls, first, head = _blame(outcomes, timeout)
    others = [f"  rank {o['rank']}: {o['type']}"
              + (" (timed out waiting: a consequence)" if _is_timeout(o)
                 else " (lost its peer: a consequence)" if _is_secondary(o) else "")
              for o in outcomes if o is not first and o["kind"] != "ok"]
    tb = first["traceback"].rstrip()
    text = "\n".join(filter(None, [
        head, tb and f"Traceback in rank {first['rank']}:\n{tb}",
        _log_tail(launch_dir, first["rank"], tb), others and "other ranks:\n" + "\n".join(others),
        f"logs of all ranks are kept in {launch_dir}"]))
    return cls(text, rank=first["rank"], exc_type=first["type"],
               message=head if cls is LaunchTimeoutError else first["message"],
               traceback=first["traceback"], log_dir=launch_dir)
