"""The folder of one launch: the ranks' inputs, logs and results, and the lock that keeps it to one.

A launch writes `config.json` and `payload.pkl` there; rank r writes `rank{r}.log` and either
`rank{r}.result` or `rank{r}.error`. Without `log_dir` the folder is temporary: removed after a
success, kept after a failure (the error names it), removed if no rank was ever started.
"""
import json
import os
import re
import shutil
import tempfile

from ..file_lock import LockHeld, release_lock, take_lock
from .failures import rank_file

LOCK_NAME = ".launch.lock"
_EARLIER_FILES = re.compile(r"rank\d+\.(log|result|error)(\.tmp)?|payload\.pkl|config\.json")


class LaunchDir:
    """A fresh temporary folder, or the user's `log_dir`, locked for this launch.

    Note: two launches sharing a log_dir would delete and overwrite each other's files, so a
    log_dir is locked while a launch uses it, and a second launch is refused with a clear error.
    """

    def __init__(self, log_dir):
        self.keep, self._lock_fd = log_dir is not None, None
        if log_dir is None:
            self.path = tempfile.mkdtemp(prefix="fsdp_mini_launch_")
            return
        os.makedirs(log_dir, exist_ok=True)
        self.path = log_dir
        self._lock_fd = _lock(log_dir)
        try:
            _remove_earlier_files(log_dir)  # Note: only once locked: never another launch's files
        except BaseException:
            self.close(ranks_started=False, ok=False)
            raise

    def write_inputs(self, payload, config):
        with open(os.path.join(self.path, "payload.pkl"), "wb") as f:
            f.write(payload)
        with open(os.path.join(self.path, "config.json"), "w") as f:
            json.dump(config, f)

    def close(self, *, ranks_started, ok, world_size=0):
        """Tidy up after the launch and unlock. A failed launch keeps its logs for the error."""
        try:
            if not self.keep and (ok or not ranks_started):
                shutil.rmtree(self.path, ignore_errors=True)
            elif self.keep and ok:
                for path in [os.path.join(self.path, "payload.pkl")] + [
                        rank_file(self.path, r, "result") for r in range(world_size)]:
                    if os.path.exists(path):
                        os.remove(path)
        finally:
            if self._lock_fd is not None:
                _unlock(self.path, self._lock_fd)
                self._lock_fd = None


def _remove_earlier_files(log_dir):
    for name in os.listdir(log_dir):
        if _EARLIER_FILES.fullmatch(name):
            os.remove(os.path.join(log_dir, name))


def _lock(folder):
    """Lock folder for this launch (:mod:`fsdp_mini.file_lock`); return the lock's descriptor,
    or raise ValueError naming the launch that holds it."""
    try:
        return take_lock(os.path.join(folder, LOCK_NAME), "launch")
    except LockHeld as held:
        if held.foreign:
            raise ValueError(f"log_dir {folder} holds a file {LOCK_NAME} that is not a lock of "
                             "fsdp_mini; remove it, or use another log_dir") from None
        same = (" (this very process: another thread or notebook cell)"
                if held.same_process else "")
        raise ValueError(f"log_dir {folder} is in use by another launch (pid "
                         f"{held.owner.get('pid', 'unknown')}){same} that is still running; its "
                         "ranks write their logs there. Wait for it to end, or use another "
                         "log_dir.") from None


def _unlock(folder, fd):
    release_lock(os.path.join(folder, LOCK_NAME), fd)
