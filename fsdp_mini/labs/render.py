"""Executed HTML copies of the labs, for reading without a kernel (a browser, a wiki, a slide).

    fsdp-mini render-labs --out build/labs           # every lab, at this machine's size
    fsdp-mini render-labs --out build/labs --ci 03   # lab 03 only, at CI size

Each notebook runs top to bottom in a fresh kernel, in its own folder (so ``solutions/`` and
relative paths work), with the widgets' final state stored; the HTML holds every output,
the static figures the widgets leave behind included. Written atomically, one file per lab.
Exercises run with the reference solutions (``FSDP_MINI_SOLUTIONS=1``): a rendered lab shows
what a finished lab looks like.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

LABS_DIR = Path(__file__).resolve().parents[2] / "labs"


LAB_NAME = re.compile(r"\d\d_[a-z0-9]+")  # 06_fast; not a copy such as 06_fast-Copy1


def lab_notebooks(folder: Path = LABS_DIR) -> list[Path]:
    """The labs: ``NN_name.ipynb`` files, in order (the demo, checkpoints and Jupyter's
    ``-Copy1`` copies of a lab are not labs)."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if LAB_NAME.fullmatch(p.stem))


def render(notebook: Path, out_dir: Path, ci: bool = False, timeout: float = 900) -> Path:
    """Execute ``notebook`` and write ``out_dir/<name>.html``; return its path."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook, as_version=4)
    env = {"FSDP_MINI_SOLUTIONS": "1", "CI": "true" if ci else ""}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # Note: the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                       resources={"metadata": {"path": str(notebook.parent)}}).execute()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
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
    written = []
    for nb in notebooks:
        start = time.perf_counter()
        written.append(render(nb, Path(out_dir), ci=ci))
        print(f"{nb.stem}: {written[-1]} ({time.perf_counter() - start:.0f} s)", flush=True)
    return written
