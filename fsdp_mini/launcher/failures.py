"""Why a launch failed: from each rank's outcome to one clear error about the first real cause.

When one rank fails, its peers fail too, a moment later ("Connection closed by peer", a timeout
in a collective). Those are consequences; the error names the rank that failed *first* for a
reason of its own, with its traceback and the end of its log, and lists the others in brief.
A consequence is recognised by where it comes from (torch.distributed), never by its words alone:
a user's own `RuntimeError("request timed out")` is a cause.
"""
import contextlib
import json
import os
import re
import signal

from .text import clip, clip_lines, log_tail, stack_dump

_SECONDARY_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError")
_PEER_LOST = re.compile(r"closed by peer|reset by peer|broken pipe|connection refused|connection reset"
                        r"|connection closed|socket closed|end of file", re.I)
_TIMED_OUT = re.compile(r"timed out|timeout", re.I)
# gloo and c10d errors start with their C++ source location, e.g. "[.../gloo/transport/tcp/pair.cc:553]"
_CPP_ORIGIN = re.compile(r"\[[^\]\s]*(gloo|c10d|distributed)[^\]\s]*\.(cc|cpp|h|hpp):\d+\]")
_TORCH_DIST = os.sep + os.path.join("torch", "distributed") + os.sep
# Note: the whole fsdp_mini package (this file is in fsdp_mini/launcher/), not the user's code
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.dirname(os.path.abspath(contextlib.__file__)) + os.sep
MESSAGE_CHARS = 2000
TRACEBACK_CHARS = 4000
MORE_STACKS = 4  # ranks besides the blamed one whose Python stack is shown in a deadline error


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
    """Ranks were stopped for taking too long: a collective timed out, a rank was blocked, or the
    job passed its deadline."""


# ---------------------------------------------------------------- what happened to each rank
def outcome(launch_dir, rank, proc, exited_at):
    """What happened to one rank, as a dict with kind ok / error / signal / exit / running."""
    out = {"rank": rank, "time": exited_at.get(rank, float("inf")), "traceback": "", "frames": []}
    try:
        with open(rank_file(launch_dir, rank, "error")) as f:
            return {**out, "kind": "error", **json.load(f)}
    except (FileNotFoundError, ValueError):
        pass
    rc = proc.returncode
    if rank not in exited_at:
        return {**out, "kind": "running", "type": "StillRunning", "message": f"rank {rank} was still running",
                "frames": _dump_frames(launch_dir, rank)}
    if rc < 0:
        name = signal.Signals(-rc).name
        hint = " (os.kill, or the out-of-memory killer)" if name == "SIGKILL" else ""
        return {**out, "kind": "signal", "type": name,
                "message": f"rank {rank} was killed by signal {name}{hint}"}
    result = rank_file(launch_dir, rank, "result")
    if rc != 0 or not os.path.exists(result):
        return {**out, "kind": "exit", "type": f"ExitCode{rc}",
                "message": f"rank {rank} exited with code {rc} without raising a Python exception"}
    return {**out, "kind": "ok"}


def _dump_frames(launch_dir, rank):
    """Frames (file, line, function; outermost first) of the stack a stopped rank dumped, if any."""
    dump = stack_dump(rank_file(launch_dir, rank, "log"))
    current = dump.split("Current thread", 1)[-1] if dump else ""
    frames = re.findall(r'^\s+File "(.*)", line (\d+) in (.*)$', current, re.M)
    return [(path, int(line), name) for path, line, name in reversed(frames)]


def _from_torch_distributed(o):
    """Did this error come from torch.distributed (or its gloo/NCCL backends), not from user code?"""
    frames = o.get("frames") or []
    return bool((frames and _TORCH_DIST in frames[-1][0]) or _CPP_ORIGIN.search(o["message"][:1000]))


def is_secondary(o):
    """Errors of ranks that lost their peer or timed out waiting for it: consequences, not causes."""
    if o["kind"] != "error":
        return False
    if o["type"].rsplit(".", 1)[-1] in _SECONDARY_TYPES:
        return True
    message = o["message"][:1000]
    return _from_torch_distributed(o) and bool(_PEER_LOST.search(message) or _TIMED_OUT.search(message))


def _is_timeout(o):
    return is_secondary(o) and bool(_TIMED_OUT.search(o["message"][:1000]))


# ---------------------------------------------------------------- whom to blame, and how to say it
def _ranks(ranks, verb=None):
    """'rank 1' / 'ranks 1, 2', with the verb agreeing: ('is', 'are'), ('was', 'were')..."""
    ranks = sorted(ranks)  # Note: in rank order, whatever order they failed in
    text = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return text if verb is None else f"{text} {verb[len(ranks) > 1]}"


def _in_collective(frames):
    """Do these frames (outermost first) end inside a collective: torch.distributed or a Handle.wait?"""
    return bool(frames) and (any(_TORCH_DIST in f[0] for f in frames)
                             or frames[-1][0] == os.path.join(_PACKAGE, "comm", "collectives.py"))


def _is_user_code(path):
    """Not torch, not this package, not the standard library (a ``with`` block's
    ``contextlib.__enter__``, frozen runpy): the user's own file."""
    return not (path.startswith((_PACKAGE, "<", _STDLIB)) or os.sep + "torch" + os.sep in path)


def collective_site(frames):
    """'all_reduce at file:line in fn': the collective a rank was in and the user's line calling it."""
    if not frames:
        return None
    dist_at = [i for i, f in enumerate(frames) if _TORCH_DIST in f[0]]
    op = next((frames[i][2] for i in dist_at if frames[i][2] != "wrapper"), frames[-1][2])
    callers = frames[:dist_at[0]] if dist_at else frames[:-1]
    user = [i for i, f in enumerate(callers) if _is_user_code(f[0])]
    if not user:
        return op
    path, line, name = callers[user[-1]]
    # fsdp_mini's function called (past contextlib's __enter__ for a ``with`` block)
    via = next((f[2] for f in callers[user[-1] + 1:] if f[0].startswith(_PACKAGE)), None)
    return f"{op}{f' via {via}' if via and via != op else ''} at {path}:{line} in {name}"


def _blame(outcomes, why, blocked, timeout, deadline):
    """Choose the rank to blame: (error class, its outcome, headline, whether it is its own error).

    Note: the earliest *primary* failure (an exception of its own, a signal, an exit code) wins over
    secondary ones. Otherwise the reason the launch stopped the ranks decides the headline.
    """
    failed = sorted((o for o in outcomes if o["kind"] not in ("ok", "running")), key=lambda o: o["time"])
    causes = [o for o in failed if not is_secondary(o)]
    running = [o for o in outcomes if o["kind"] == "running"]
    returned = [o["rank"] for o in outcomes if o["kind"] == "ok"]
    timed_out = [o for o in failed if _is_timeout(o)]
    stuck = [o for o in running if o["rank"] in blocked]
    waiting = [o for o in failed if not _is_timeout(o)] + [o for o in stuck if _in_collective(o["frames"])]
    if causes or not (running or timed_out or (returned and waiting)):
        return _failed_first((causes or failed)[0])
    if why == "deadline" and running:
        return LaunchTimeoutError, running[0], _deadline_head(running, deadline), False
    if returned and waiting and not timed_out:
        return _mismatch(returned, waiting, stuck, timeout)
    if stuck:
        return LaunchTimeoutError, stuck[0], _blocked_head(blocked, returned, timeout), False
    head = (f"{_ranks([o['rank'] for o in timed_out])} timed out after {timeout:g} s waiting in a "
            "collective; " if timed_out else "")
    head += (f"{_ranks([o['rank'] for o in running])} still running, probably stuck (stopped; the "
             "Python stack it was in is dumped into its log, below)" if running
             else "no rank was left running")
    return LaunchTimeoutError, (running or timed_out)[0], head, False


def _failed_first(first):
    if first["kind"] == "error":
        head = f"rank {first['rank']} failed first: {first['type']}: {clip(first['message'], MESSAGE_CHARS)}"
    else:
        head = f"{first['message']}; it failed first"
    return LaunchError, first, head, True


def _deadline_head(running, deadline):
    return (f"the job passed its deadline of {deadline:g} s; ranks still running: "
            f"{', '.join(str(o['rank']) for o in running)} (stopped; the Python stack each one was "
            "in is dumped into its log, below)")


def _blocked_head(blocked, returned, timeout):
    return (f"{_ranks(blocked)} used no CPU for {timeout:g} s after {_ranks(returned)} returned: "
            f"{'it is' if len(blocked) == 1 else 'they are'} blocked waiting for something that will "
            "not come (a collective its peers no longer join, a lock, input()...). Stopped; the "
            "Python stack it was in is dumped into its log, below. A rank that waits this long on "
            "purpose (slow I/O, a sleep) needs a larger timeout")


def _mismatch(returned, waiting, stuck, timeout):
    """Some ranks returned while others still waited in a collective: the collectives differ."""
    first = waiting[0]
    site = collective_site(first["frames"])
    still_in = _ranks(sorted(o["rank"] for o in waiting), ("was", "were"))
    head = (f"{_ranks(sorted(returned))} returned while {still_in} still in a collective"
            f"{f' ({site})' if site else ''}; every rank must issue the same "
            "collectives in the same order: one rank ran fewer steps, or called a collective "
            "(e.g. full_state_dict) that the others did not")
    if not stuck:
        return LaunchError, first, head, False
    head += (f". {_ranks([o['rank'] for o in stuck], ('was', 'were'))} stopped after using no CPU "
             f"for {timeout:g} s there")
    return LaunchTimeoutError, first, head, False


def _brief(o, why):
    """One line about a rank that is not the one blamed."""
    if o["kind"] == "running":
        cause = {"deadline": "at the deadline",
                 "blocked": "when a rank was found blocked"}.get(why, "after the failure")
        return f"  rank {o['rank']}: still running, stopped {cause} (its Python stack is in its log)"
    note = (" (timed out waiting: a consequence)" if _is_timeout(o)
            else " (lost its peer: a consequence)" if is_secondary(o) else "")
    return f"  rank {o['rank']}: {o['type']}{note}"


def _stacks(launch_dir, ranks):
    """The Python stacks that stopped ranks dumped (a few ranks, each capped)."""
    shown = []
    for rank in ranks[:MORE_STACKS]:
        log = rank_file(launch_dir, rank, "log")
        dump = stack_dump(log)
        if dump:
            shown.append(f"--- Python stack of rank {rank} when stopped ---\n"
                         + clip_lines(dump, TRACEBACK_CHARS // 2, log))
    if len(ranks) > MORE_STACKS:
        shown.append(f"(stacks of {len(ranks) - MORE_STACKS} more ranks are in their logs)")
    return shown


def failure_error(outcomes, launch_dir, timeout, *, why="failed", blocked=(), deadline=None):
    """The exception to raise: headline, traceback and log of the blamed rank, the others in brief.

    `why` is why the ranks were stopped: "done" (all exited), "failed", "blocked" (the ranks in
    `blocked` used no CPU for `timeout` s after others returned) or "deadline".
    """
    cls, first, head, own = _blame(outcomes, why, list(blocked), timeout, deadline)
    log = rank_file(launch_dir, first["rank"], "log")
    tb = clip_lines(first["traceback"].rstrip(), TRACEBACK_CHARS, log)
    others = [o for o in outcomes if o is not first and o["kind"] != "ok"]
    running = [o["rank"] for o in others if o["kind"] == "running"]
    stacks = _stacks(launch_dir, running) if why == "deadline" else []
    text = "\n".join(filter(None, [
        head, tb and f"Traceback in rank {first['rank']}:\n{tb}",
        log_tail(log, first["traceback"]), *stacks,
        others and "other ranks:\n" + "\n".join(_brief(o, why) for o in others),
        f"logs of all ranks are kept in {launch_dir}"]))
    return cls(text, rank=first["rank"], exc_type=first["type"],
               message=first["message"] if own else head,
               traceback=first["traceback"], log_dir=launch_dir)
