"""What `launch` checks before it starts anything: its arguments, and that fn and args pickle.

Every check here runs before a folder is made or a process started, so a bad argument costs one
clear error and leaves nothing behind.
"""
import io
import linecache
import marshal
import math
import os
import sys
import types
from collections import ChainMap
from collections.abc import Mapping
from numbers import Integral, Real

import cloudpickle
import torch

MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_WORLD_SIZE = 512


def kind(value):
    """'a NoneType', 'an int': what a value is, for an error message."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def check_world_size(world_size):
    """world_size as an int in [1, MAX_WORLD_SIZE]."""
    if isinstance(world_size, bool) or not isinstance(world_size, Integral):
        raise TypeError(f"world_size must be an int >= 1 (the number of ranks), got {world_size!r} "
                        f"of type {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 (the number of ranks), got {world_size}")
    if world_size > MAX_WORLD_SIZE:
        # Note: each rank is a whole Python process with torch imported (~300 MB); far fewer than
        # this already exhaust one machine, and torch's store overflows on absurd counts.
        raise ValueError(f"world_size must be at most {MAX_WORLD_SIZE} (every rank is a process on "
                         f"this machine), got {world_size}")
    return int(world_size)


def _seconds(value):
    """value as a float if it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    return float(value)


def check_timeout(timeout):
    """timeout as a float in [MIN_TIMEOUT_S, MAX_TIMEOUT_S]."""
    seconds = _seconds(timeout)
    if seconds is None or not MIN_TIMEOUT_S <= seconds <= MAX_TIMEOUT_S:
        # Note: below a second, rendezvous alone times out; inf and nan overflow torch's timers.
        raise ValueError(f"timeout must be a positive number of seconds, from {MIN_TIMEOUT_S:g} to "
                         f"{MAX_TIMEOUT_S:g} (one week); it bounds each collective. Got {timeout!r}. "
                         "For a limit on the whole job use deadline=...")
    return seconds


def check_deadline(deadline):
    """deadline as None (no limit) or a finite positive float."""
    if deadline is None:
        return None
    seconds = _seconds(deadline)
    if seconds is None or not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"deadline must be None (no limit) or a finite number of seconds > 0 for "
                         f"the whole job, got {deadline!r}")
    return seconds


def check_backend_name(backend):
    """backend as "gloo" or "nccl" (a plain str); a TypeError or ValueError naming it otherwise."""
    if not isinstance(backend, str):
        raise TypeError(f'backend must be None, "gloo" or "nccl", got {backend!r} '
                        f"({kind(backend)})")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f'backend must be None, "gloo" or "nccl", got {backend!r}')
    return str.__str__(backend)


def pick_backend(backend, world_size):
    """None means: NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        return "nccl" if 0 < world_size <= gpus else "gloo"
    backend = check_backend_name(backend)
    if backend == "nccl" and gpus == 0:
        why = ("this torch is a CPU build" if torch.version.cuda is None
               else "torch.cuda.is_available() is False")
        raise ValueError(f'backend="nccl" needs GPUs, one per rank, and no CUDA GPU is visible '
                         f'here ({why}). Use backend="gloo" to run the ranks on the CPU.')
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f'backend="nccl" needs one GPU per rank: world_size={world_size} but only '
                         f'{gpus} CUDA device(s) are visible. Use backend="gloo" (CPU) or a '
                         f"world_size <= {gpus}.")
    return backend


def check_log_dir(log_dir):
    """log_dir as None or an absolute path (a str) that is not an existing file."""
    if log_dir is None:
        return None
    path = os.fspath(log_dir) if isinstance(log_dir, os.PathLike) else log_dir
    if isinstance(path, bytes):
        raise TypeError(f"log_dir must be None or a folder path (a str or pathlib.Path), got "
                        f"{log_dir!r} (bytes); write log_dir={os.fsdecode(path)!r}")
    if not isinstance(path, str):
        raise TypeError(f"log_dir must be None or a folder path (a str or pathlib.Path), got "
                        f"{log_dir!r} ({kind(log_dir)})")
    if not path:
        # Note: os.path.abspath("") is the current folder, which is surely not what was meant
        raise ValueError("log_dir must be None or a folder path, got '' (an empty path); write "
                         "log_dir='logs' for a folder logs/ here")
    if "\x00" in path:
        raise ValueError(f"log_dir holds a NUL character (\\x00), which no path can carry: {path!r}")
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"log_dir {path} is a file, not a folder; pass a folder path")
    return path


_MONITOR_METHODS = ("launch_started", "launch_poll", "launch_finished")


def check_monitor(monitor):
    """monitor as None or an object with the three methods launch calls."""
    if monitor is None:
        return None
    missing = [m for m in _MONITOR_METHODS if not callable(getattr(monitor, m, None))]
    if missing:
        raise TypeError(f"monitor must be None or an object with the methods launch_started("
                        f"world_size, events_dir), launch_poll() and launch_finished(ok) (e.g. "
                        f"fsdp_mini.widgets.Dashboard() or fsdp_mini.telemetry.EventLog()), got "
                        f"{monitor!r} ({kind(monitor)}), which lacks "
                        f"{', '.join(missing)}")
    return monitor


def check_launch_args(world_size, backend=None, timeout=120.0, deadline=None):
    """The launch arguments, checked and normalised: (world_size, backend, timeout, deadline).

    Also for callers that want to fail early, before they prepare their own work (the CLI).
    """
    world_size = check_world_size(world_size)
    return world_size, pick_backend(backend, world_size), check_timeout(timeout), check_deadline(deadline)


# ---------------------------------------------------------------- fn and args, by value
class _Pickler(cloudpickle.Pickler):
    """cloudpickle, except that code objects travel with marshal and so keep their file name.

    Note: cloudpickle renames the file of functions it pickles by value (notebook cells, __main__)
    to "<dynamic-code>", so a rank's traceback would show neither the cell nor its source lines.
    marshal keeps co_filename, and the ranks run this same interpreter, so its format matches.
    """

    def __init__(self, file):
        self.filenames = set()
        # Note: the C pickler reads dispatch_table when it is initialised, so set it first.
        self.dispatch_table = ChainMap({types.CodeType: self._reduce_code}, cloudpickle.Pickler.dispatch_table)
        super().__init__(file)

    def _reduce_code(self, code):
        self.filenames.add(code.co_filename)
        return marshal.loads, (marshal.dumps(code),)


def _dumps(obj):
    """Pickle obj by value; return the bytes and the source files its functions come from."""
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.filenames


def pickle_payload(fn, args):
    """Pickle fn and args now, so a bad argument fails here and not in N processes at once.

    Returns the payload and the source lines of files that exist only in memory (notebook cells),
    which the ranks put into their linecache so tracebacks show the offending line.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(rank, world_size, *args), got {fn!r}")
    parts = [("fn " + getattr(fn, "__qualname__", repr(fn)), fn)]
    parts += [(f"args[{i}] ({type(a).__name__})", a) for i, a in enumerate(args)]
    for what, obj in parts:
        try:
            _dumps(obj)
        except Exception as e:
            raise TypeError(
                f"launch could not pickle {what}: {type(e).__name__}: {e}. Ranks are fresh processes, "
                "so fn and args are sent by value with cloudpickle. Define the function at module "
                "level or in its own notebook cell, and do not capture locks, open files, sockets, "
                "generators or process groups in it or its arguments; create those inside fn."
            ) from e
    payload, filenames = _dumps((fn, tuple(args)))
    sources = {name: linecache.getlines(name) for name in filenames if not os.path.exists(name)}
    return payload, {name: lines for name, lines in sources.items() if lines}


def _env_str(what, value, fix):
    """value (a str, or a path) as the str a process environment can carry; else one clear
    error, ending with `fix(suggested str or None)`.

    Note: an os.PathLike becomes its path, as subprocess does with env values; anything else is
    refused: str(None) would reach the ranks as "None" and str(b"/data") as "b'/data'".
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        meant = (os.fsdecode(value) if isinstance(value, bytes)
                 else str(value) if isinstance(value, Real) and not isinstance(value, bool) else None)
        raise TypeError(f"launch(env): {what} must be a str, got {value!r} ({kind(value)}); "
                        f"write {fix(meant)}")
    value = str.__str__(value)  # Note: a str subclass's own __str__ may say something else
    if "\x00" in value:
        raise ValueError(f"launch(env): {what} holds a NUL character (\\x00), which no "
                         f"environment variable can carry: {value!r}")
    try:
        os.fsencode(value)
    except UnicodeError:
        raise ValueError(f"launch(env): {what} cannot be encoded for the environment "
                         f"({sys.getfilesystemencoding()}): {value!r}") from None
    return value


# Note: launch sets these for each rank (its rank, the store's address); one value for all ranks
# would be wrong on all but one, so they are refused instead of silently replaced or taken.
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def check_env(env):
    """env as a dict of str to str (variables added to the ranks' environment).

    A Mapping (dict, os.environ...) of names to values: names non-empty, without '=' or NUL,
    values str (or a path) without NUL. Anything else is refused, naming the key.
    """
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"launch(env) must be None or a dict of environment variables (str to "
                        f"str), got {env!r} ({kind(env)}); e.g. env={{'DEBUG': '1'}}")
    checked = {}
    for key, value in list(env.items()):
        if not isinstance(key, str):
            name = os.fsdecode(key) if isinstance(key, bytes) else "NAME"
            raise TypeError(f"launch(env): the name {key!r} must be a str, got {kind(key)}; "
                            f"write env={{{name!r}: ...}}")
        key = _env_str(f"the name {key!r}", key, lambda meant: f"env={{{meant!r}: ...}}")
        if not key or "=" in key:
            raise ValueError(f"launch(env): the name {key!r} is not an environment variable's "
                             "name: it must be non-empty and hold no '='; e.g. env={'DEBUG': '1'}")
        if key in RANK_ENV:
            raise ValueError(f"launch(env): {key!r} is set by launch itself, for each rank "
                             f"({', '.join(RANK_ENV)}); leave it out of env")
        checked[key] = _env_str(f"the value of {key!r}", value, lambda meant, k=key: (
            f"env={{{k!r}: {meant!r}}}" if meant is not None
            else f"env={{{k!r}: '1'}} or leave the key out"))
    return checked
