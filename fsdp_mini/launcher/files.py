"""The folder of one launch: the ranks' inputs, logs and results, and the lock that keeps it to one.

A launch writes `config.json` and `payload.pkl` there; rank r writes `rank{r}.log` and either
`rank{r}.result` or `rank{r}.error` (and, with a monitor, `events/events_rank{r}.jsonl`). Without
`log_dir` the folder is temporary: removed after a success, kept after a failure (the error names
it), removed if no rank was ever started.

A `log_dir` is the user's folder, so the kit touches there only what it wrote itself. It keeps a
list of its files, `.launch.files` (JSON with a mark of the kit, replaced atomically), naming each
with its (device, inode) and, once the launch is over, its size and mtime. The next launch removes
exactly the files that list identifies (whatever their names), and refuses to start when the folder
holds a file it would write over that the list does not identify: the user's own `config.json` or
`rank0.log` (or a log of the kit edited since) is never deleted nor overwritten.

Note: every file of a launch is created by the caller, with O_EXCL, before any rank starts, so its
inode is known and listed before anything is written to it: the ranks write into those very files
(a rank's `rank{r}.result.tmp`, renamed into place, keeps its inode), and a launch that was killed
leaves files the next one still recognises.
"""
import json
import os
import secrets
import shutil
import stat
import tempfile

from ..file_lock import LockHeld, release_lock, take_lock

LOCK_NAME = ".launch.lock"
MANIFEST = ".launch.files"
_MARK = "fsdp_mini launch files"
EVENTS = "events"


def _rank_names(rank):
    """The files rank `rank` may leave, as names in the launch folder."""
    names = [f"rank{rank}.log"]
    for kind in ("result", "error"):
        names += [f"rank{rank}.{kind}.tmp", f"rank{rank}.{kind}"]
    return names


class LaunchDir:
    """A fresh temporary folder, or the user's `log_dir`, locked for this launch.

    Note: two launches sharing a log_dir would delete and overwrite each other's files, so a
    log_dir is locked while a launch uses it, and a second launch is refused with a clear error.
    """

    def __init__(self, log_dir, world_size, *, events=False):
        self.keep, self._lock_fd, self.world_size = log_dir is not None, None, world_size
        self._owned = {}  # name -> identity of each file or folder of the kit's in the folder
        if log_dir is None:
            self.path = tempfile.mkdtemp(prefix="fsdp_mini_launch_")
        else:
            os.makedirs(log_dir, exist_ok=True)
            self.path = log_dir
            self._lock_fd = _lock(log_dir)
        self.events_dir = os.path.join(self.path, EVENTS) if events else None
        try:
            # Note: only once locked: never another launch's files. Nothing is removed before
            # every check passed, so a refused launch leaves the folder as it found it.
            earlier = _read_manifest(self.path)
            ours = {name: entry for name, entry in earlier.items()
                    if _matches(os.path.join(self.path, name), entry)}
            names = self._names()
            for name in names:
                path = os.path.join(self.path, name)
                if name == EVENTS and name in ours:
                    continue  # Note: the kit's own events folder, reused (emptied of its files)
                if os.path.lexists(path) and name not in ours:
                    raise ValueError(
                        f"log_dir {self.path} holds {name}, which this launch would write over, "
                        f"and fsdp_mini did not write it (or it changed since: {MANIFEST}, the "
                        f"kit's list of its own files there, does not name it as it is now). "
                        f"The kit never deletes or overwrites a file of yours: move {name} "
                        f"elsewhere, or choose another log_dir.")
            self._remove(ours, keep_dirs={EVENTS} if EVENTS in names else set())
            self._create(names)
        except BaseException:
            self.close(ranks_started=False, ok=False)
            raise

    def _names(self):
        names = ["config.json", "payload.pkl"]
        for rank in range(self.world_size):
            names += _rank_names(rank)
        if self.events_dir is not None:
            names += [EVENTS] + [f"{EVENTS}/events_rank{r}.jsonl" for r in range(self.world_size)]
        return names

    def _remove(self, ours, keep_dirs=()):
        """Remove the kit's earlier files (folders last, and only when empty)."""
        for name in sorted(ours, key=lambda n: (ours[n]["kind"] == "dir", -n.count("/"))):
            path = os.path.join(self.path, name)
            try:
                if ours[name]["kind"] == "dir":
                    if name in keep_dirs:
                        self._owned[name] = ours[name]
                        continue
                    os.rmdir(path)
                else:
                    os.remove(path)
            except FileNotFoundError:
                pass
            except OSError:  # Note: a folder of the kit's that now holds files of the user's
                self._owned[name] = ours[name]

    def _create(self, names):
        """Create every file of this launch (empty), list them, then write the list."""
        for name in names:
            if name in self._owned:
                continue
            path = os.path.join(self.path, name)
            if name == EVENTS:
                os.mkdir(path)
            elif name.endswith((".result", ".error")):
                continue  # Note: its .tmp, renamed into place by the rank, is this file
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
            self._owned[name] = _identity(path, final=False)
            if name.endswith((".result.tmp", ".error.tmp")):
                self._owned[name[:-len(".tmp")]] = self._owned[name]
        _write_manifest(self.path, self._owned)

    def write_inputs(self, payload, config):
        # Note: into the files created (and listed) for them: same inode, opened without O_CREAT
        with open(os.path.join(self.path, "payload.pkl"), "r+b") as f:
            f.truncate()
            f.write(payload)
        with open(os.path.join(self.path, "config.json"), "r+") as f:
            f.truncate()
            json.dump(config, f)

    def close(self, *, ranks_started, ok, world_size=0):
        """Tidy up after the launch and unlock. A failed launch keeps its logs for the error."""
        try:
            if not self.keep and (ok or not ranks_started):
                shutil.rmtree(self.path, ignore_errors=True)
            elif self._owned:
                self._tidy(ranks_started, ok)
        finally:
            if self._lock_fd is not None:
                _unlock(self.path, self._lock_fd)
                self._lock_fd = None

    def _tidy(self, ranks_started, ok):
        """Remove what is of no use any more (all of it if no rank started), and list the rest
        with its final size and mtime."""
        def useless(name):
            if not ranks_started:
                return True
            if name.endswith(".tmp"):
                return True  # Note: unused, or half written by a rank that was killed
            return ok and (name == "payload.pkl" or name.endswith(".result"))
        for name, entry in list(self._owned.items()):
            path = os.path.join(self.path, name)
            if not _matches(path, entry):
                del self._owned[name]  # Note: not there, or not ours any more: hands off
            elif useless(name) and entry["kind"] == "file":
                os.remove(path)
                del self._owned[name]
            else:
                self._owned[name] = _identity(path, final=True)
        if not ranks_started and EVENTS in self._owned:
            try:
                os.rmdir(os.path.join(self.path, EVENTS))
                del self._owned[EVENTS]
            except OSError:  # Note: it holds a file not ours
                pass
        if self._owned:
            _write_manifest(self.path, self._owned)
        else:  # Note: the list is the kit's (read with its mark, or written by this launch)
            try:
                os.remove(os.path.join(self.path, MANIFEST))
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------- the kit's list of its files
def _identity(path, *, final):
    """What identifies a file as the one the kit made: (device, inode), and once the launch is
    over, its size and mtime (so that a log edited since, or a file of the user's that got the
    inode of one of the kit's deleted files, is not taken for the kit's)."""
    st = os.lstat(path)
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
    entry = {"kind": kind, "dev": st.st_dev, "ino": st.st_ino}
    if final and kind == "file":
        entry.update(size=st.st_size, mtime_ns=st.st_mtime_ns)
    return entry


def _matches(path, entry):
    """Whether path is (still) the file that entry describes."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None
    if kind != entry["kind"] or (st.st_dev, st.st_ino) != (entry["dev"], entry["ino"]):
        return False
    if "size" in entry and (st.st_size, st.st_mtime_ns) != (entry["size"], entry["mtime_ns"]):
        return False
    return True


def _valid_name(name):
    """A name inside the folder: relative, no '..', at most one level down (events/...)."""
    parts = name.split("/")
    return (isinstance(name, str) and 1 <= len(parts) <= 2 and "\x00" not in name
            and all(p not in ("", ".", "..") and os.sep not in p for p in parts))


def _read_manifest(folder):
    """{name: identity} from the kit's list of its files in folder ({} if there is none);
    ValueError if a file of that name is there that the kit did not write."""
    path = os.path.join(folder, MANIFEST)
    foreign = ValueError(f"log_dir {folder} holds {MANIFEST}, which is not fsdp_mini's list of "
                         "the files it wrote there, and the kit never overwrites a file of "
                         f"yours: move {MANIFEST} elsewhere, or choose another log_dir.")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {}
    if not stat.S_ISREG(st.st_mode):
        raise foreign
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 22).decode())
    except (OSError, ValueError):
        raise foreign from None
    if not (isinstance(data, dict) and data.get("mark") == _MARK
            and isinstance(data.get("files"), dict)):
        raise foreign
    files = {}
    for name, entry in data["files"].items():
        if (_valid_name(name) and isinstance(entry, dict) and entry.get("kind") in ("file", "dir")
                and all(isinstance(entry.get(k), int) for k in ("dev", "ino"))
                and ("size" not in entry or all(isinstance(entry.get(k), int)
                                                for k in ("size", "mtime_ns")))):
            files[name] = entry  # Note: an entry the kit did not write is ignored, not obeyed
    return files


def _write_manifest(folder, owned):
    """Replace the list atomically (a fresh temporary file of a name nobody uses, renamed)."""
    path = os.path.join(folder, MANIFEST)
    data = (json.dumps({"mark": _MARK, "pid": os.getpid(), "files": owned}, indent=1) + "\n").encode()
    while True:
        tmp = os.path.join(folder, f"{MANIFEST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------- the lock
def _lock(folder):
    """Lock folder for this launch (:mod:`fsdp_mini.file_lock`); return the lock's descriptor,
    or raise ValueError naming the launch that holds it."""
    try:
        return take_lock(os.path.join(folder, LOCK_NAME), "launch")
    except LockHeld as held:
        if held.foreign:
            raise ValueError(f"log_dir {folder} holds a file {LOCK_NAME} that is not a lock of "
                             "fsdp_mini; move it elsewhere, or use another log_dir") from None
        same = (" (this very process: another thread or notebook cell)"
                if held.same_process else "")
        raise ValueError(f"log_dir {folder} is in use by another launch (pid "
                         f"{held.owner.get('pid', 'unknown')}){same} that is still running; its "
                         "ranks write their logs there. Wait for it to end, or use another "
                         "log_dir.") from None


def _unlock(folder, fd):
    release_lock(os.path.join(folder, LOCK_NAME), fd)
