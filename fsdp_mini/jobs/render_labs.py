"""Executed HTML copies of the labs, for reading without a kernel (a browser, a wiki, a slide).

    fsdp-mini render-labs --out build/labs           # every lab, at this machine's size
    fsdp-mini render-labs --out build/labs --ci 03   # lab 03 only, at CI size

Each notebook runs top to bottom in a fresh kernel, in its own folder (so ``solutions/`` and
relative paths work), with the widgets' final state stored; the HTML holds every output,
the static figures the widgets leave behind included. Written atomically, one file per lab.
Exercises run with the reference solutions (``FSDP_MINI_SOLUTIONS=1``): a rendered lab shows
what a finished lab looks like.

Interrupted (Ctrl-C, SIGTERM), it stops the running lab's kernel and every process under it
(its ranks included), writes nothing for that lab and raises :class:`Interrupted`, which the
command reports in one line. The output folder is checked before any lab runs.

The course site's executed build (``FSDP_MINI_DOCS_EXECUTE=1``, ``docs/hooks.py``) runs the labs
through :func:`executing` too, without the widgets' state (a page without a widget manager then
shows each widget's static figure).
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

from ..launcher.keeper import alive, descendants, kill, parent_of

LABS_DIR = Path(__file__).resolve().parents[2] / "labs"


LAB_NAME = re.compile(r"\d\d_[a-z0-9]+")  # 06_fast; not a copy such as 06_fast-Copy1


def lab_notebooks(folder: Path = LABS_DIR) -> list[Path]:
    """The labs: ``NN_name.ipynb`` files, in order (the demo, checkpoints and Jupyter's
    ``-Copy1`` copies of a lab are not labs)."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if LAB_NAME.fullmatch(p.stem))


def execute(notebook: Path, ci: bool = False, timeout: float = 900, widget_state: bool = True):
    """Run ``notebook`` top to bottom in a fresh kernel, in its own folder, with the reference
    solutions; return the executed notebook (an ``nbformat`` node; the file is not changed).
    ``widget_state``: store the widgets' final state in its metadata (an HTML page with a widget
    manager draws them from it; without one, each widget's static figure is shown instead)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    env = {"FSDP_MINI_SOLUTIONS": "1", "CI": "true" if ci else ""}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # Note: the kernel inherits this process's environment
    try:
        _execute(NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                store_widget_state=widget_state,
                                resources={"metadata": {"path": str(notebook.parent)}}))
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return nb


def render(notebook: Path, out_dir: Path, ci: bool = False, timeout: float = 900) -> Path:
    """Execute ``notebook`` and write ``out_dir/<name>.html``; return its path."""
    return _write_html(notebook, execute(notebook, ci=ci, timeout=timeout), out_dir)


def _write_html(notebook: Path, nb, out_dir: Path) -> Path:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / (notebook.stem + ".html")
    tmp = target.with_suffix(".html.tmp")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, target)
    return target


def render_labs(out_dir: str, only: list[str] | None = None, ci: bool = False) -> list[Path]:
    """Render the labs (those whose name starts with one of ``only``, or all); print progress."""
    notebooks = [p for p in lab_notebooks()
                 if not only or any(p.stem.startswith(o) for o in only)]
    if not notebooks:
        known = ", ".join(p.stem for p in lab_notebooks())
        raise ValueError(f"no lab matches {only}; the labs are: {known}")
    check_writable(Path(out_dir))
    written = []
    with closing(executing(notebooks, ci=ci)) as runs:  # Note: closed, its signal handlers go
        for path, nb, seconds in runs:
            try:
                written.append(_write_html(path, nb, Path(out_dir)))
            except KeyboardInterrupt as e:  # while writing: no kernel runs, nothing is written
                raise Interrupted(getattr(e, "signal_name", "SIGINT"), path.stem) from None
            print(f"{path.stem}: {written[-1]} ({seconds:.0f} s)", flush=True)
    return written


def executing(notebooks: list[Path], ci: bool = False, widget_state: bool = True):
    """Execute each notebook in turn (:func:`execute`); yield ``(path, executed notebook,
    seconds)``. Interrupted (Ctrl-C, SIGTERM) while one runs, stop its kernel and every process
    under this one and raise :class:`Interrupted`."""
    with _terminate_as_interrupt():
        for path in notebooks:
            start = time.perf_counter()
            try:
                nb = execute(path, ci=ci, widget_state=widget_state)
            except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (below)
                _stop_everything_below()
                raise Interrupted(getattr(e, "signal_name", "SIGINT"), path.stem) from None
            yield path, nb, time.perf_counter() - start


def check_writable(out_dir: Path) -> None:
    """A clear error now, not after the first lab has run, if ``out_dir`` cannot be written."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file, not a folder; give a folder for the HTML "
                         f"copies")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=".fsdp-mini-check-")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise ValueError(f"--out {out_dir}: cannot write there ({err.strerror or err}); pick a "
                         f"writable folder") from None


# -- stopping cleanly when interrupted ---------------------------------------------------------

class Interrupted(Exception):
    """Rendering was interrupted by a signal; the running lab's kernel and ranks are stopped."""

    def __init__(self, signal_name: str, lab: str):
        super().__init__(f"{signal_name} while running {lab}")
        self.signal_name, self.lab = signal_name, lab


def _execute(client) -> None:
    """``client.execute()`` in a worker thread, so that a signal reaches this (main) thread as a
    KeyboardInterrupt (``render_labs`` then stops every process under this one).

    Note: nbclient's own signal handlers (installed only in the main thread) shut the kernel
    down but let the execution go on against a dead kernel, which ends in a traceback; from a
    worker thread it installs none.
    """
    outcome = {}

    def run():
        try:
            client.execute()
        except BaseException as e:  # noqa: BLE001  (handed to the main thread)
            outcome["error"] = e
    worker = threading.Thread(target=run, daemon=True, name="fsdp-mini-render")
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        import atexit
        atexit.unregister(client._cleanup_kernel)  # Note: the kernel will be gone
        raise
    if "error" in outcome:
        raise outcome["error"]


def _stop_everything_below(grace: float = 5.0) -> None:
    """Kill the kernels (this process's children); the ranks' keeper ends what they started
    once its kernel is gone; whatever is still alive after ``grace`` seconds is killed."""
    tree = descendants(os.getpid())
    for pid in tree:
        if parent_of(pid) == os.getpid():
            kill(pid)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in tree:
        kill(pid)


class _terminate_as_interrupt:
    """Within the block, SIGTERM (and SIGHUP) interrupt the main thread like Ctrl-C does."""

    def __enter__(self):
        def interrupt(signum, frame):
            error = KeyboardInterrupt()
            error.signal_name = signal.Signals(signum).name
            raise error
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self.saved[sig] = signal.signal(sig, interrupt)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
