"""What `launch` checks before it starts anything: its arguments, and that fn and args pickle.

Every check here runs before a folder is made or a process started, so a bad argument costs one
clear error and leaves nothing behind.
"""
import io
import linecache
import marshal
import math
import os
import types
from collections import ChainMap
from numbers import Integral, Real

import cloudpickle
import torch

MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_WORLD_SIZE = 512


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


def pick_backend(backend, world_size):
    """None means: NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        return "nccl" if 0 < world_size <= gpus else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f'backend must be None, "gloo" or "nccl", got {backend!r}')
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
    """log_dir as None or an absolute path that is not an existing file."""
    if log_dir is None:
        return None
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(f"log_dir must be None or a folder path, got {log_dir!r}")
    path = os.path.abspath(log_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"log_dir {path} is a file, not a folder; pass a folder path")
    return path


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


def check_env(env):
    """env as a dict of str to str (variables added to the ranks' environment)."""
    if env is None:
        return {}
    if not hasattr(env, "items"):
        raise TypeError(f"env must be None or a dict of environment variables, got {env!r}")
    return {str(k): str(v) for k, v in env.items()}
