"""A notebook in headless Chromium, for tests/test_browser.py: open it in JupyterLab, "Run All
Cells", wait until every cell ran, check no error and no process is left.

    with open_notebook(ROOT / "labs" / "05_fsdp.ipynb", tmp_path) as nb:
        state, seconds = run_to_the_end(nb, timeout=240)
        assert_ran_cleanly(state, nb.code)
    assert_nothing_left(nb, "ipyparallel")

Needs Debian's ``chromium`` and the ``playwright`` package (no browser download); the tests skip
without them. The server and process bookkeeping are in ``browser_helpers``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from browser_helpers import Lab, children, cmdline, processes_matching, running_lab

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
except ImportError:  # the browser tests skip
    sync_playwright, PlaywrightError = None, Exception


CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

# The page, read in one go: every cell (kind, prompt, source, output text, stderr outputs), the
# kernel status, and the dialogs and toasts on screen.
READ_PAGE = r"""() => {
  const text = e => (e ? e.textContent : "");
  const cells = [...document.querySelectorAll(".jp-Notebook .jp-Cell")].map(c => ({
    code: c.classList.contains("jp-CodeCell"),
    prompt: text(c.querySelector(".jp-InputArea-prompt")).trim(),
    source: text(c.querySelector(".jp-InputArea-editor .cm-content")),
    output: text(c.querySelector(".jp-OutputArea")),
    stderr: [...c.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')].map(text),
    images: c.querySelectorAll(".jp-OutputArea .jp-RenderedImage img").length,
  }));
  const indicator = document.querySelector(".jp-Notebook-ExecutionIndicator");
  return {
    cells,
    status: indicator ? indicator.getAttribute("data-status") : null,
    dialogs: [...document.querySelectorAll(".jp-Dialog")].map(text),
    toasts: [...document.querySelectorAll(".jp-Notification-Toast, .Toastify__toast")].map(text),
  };
}"""


def requirements() -> None:
    if CHROMIUM is None:
        pytest.skip("no `chromium` on PATH (Debian: apt-get install chromium)")
    if sync_playwright is None:
        pytest.skip("playwright is not installed (pip install playwright; its browser download "
                    "is not needed: the test uses the system chromium)")


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def executed(prompt: str) -> bool:
    return re.fullmatch(r"\[\d+\]:", prompt) is not None


def cell_index(notebook, needle: str) -> int:
    """The first code cell whose source contains ``needle`` (from the file: editors load late)."""
    found = [i for i, c in enumerate(notebook["cells"])
             if c["cell_type"] == "code" and needle in "".join(c["source"])]
    assert found, f"no code cell containing {needle!r}"
    return found[0]


def describe(state) -> str:
    return "\n".join(f"{c['prompt']:>6} {c['source'][:60]!r} -> {c['output'][-300:]!r}"
                     for c in state["cells"] if c["code"])


def dismiss_prompts(page, state) -> None:
    """The kernel-choice dialog (accept it) and the "Jupyter news?" toast (say no). Either may be
    fading out already, so a click that finds nothing to click is fine."""
    targets = []
    if state["dialogs"]:
        targets.append(page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept"))
    if state["toasts"]:
        toasts = page.locator(".jp-Notification-Toast, .Toastify__toast")
        targets += [toasts.get_by_role("button", name="No", exact=True),
                    toasts.locator(".jp-Notification-Toast-Close")]
    for target in targets:
        target = target.first
        try:
            if target.is_visible():
                target.click(timeout=2000)
                return
        except PlaywrightError:
            pass


def wait_for_notebook(page, lab, n_cells, timeout=90.0):
    """All cells rendered, prompts dismissed, and a kernel that is idle with this page connected."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = page.evaluate(READ_PAGE)
        dismiss_prompts(page, state)
        try:
            kernels = lab.api("api/kernels")
        except urllib.error.HTTPError:  # the server answers 500 while a kernel is starting
            kernels = None
        if (len(state["cells"]) == n_cells and not state["dialogs"]
                and state["status"] == "idle" and kernels
                and all(k["execution_state"] == "idle" and k["connections"] >= 1
                        for k in kernels)):
            return state
        time.sleep(0.3)
    raise AssertionError(f"the notebook did not get ready in {timeout:.0f} s: {state} {kernels}")


@dataclass
class OpenNotebook:
    """A notebook open in JupyterLab in headless Chromium, its kernel idle: see ``open_notebook``."""
    lab: Lab
    page: object                 # playwright's Page
    notebook: dict               # the .ipynb file, as JSON
    code: list[int]              # indices of the code cells
    shots: pathlib.Path          # where screenshots go
    children_before: set[int]    # this process's children before the server started

    def cell(self, needle: str):
        """(index, locator) of the first code cell whose source contains ``needle``."""
        i = cell_index(self.notebook, needle)
        return i, self.page.locator(".jp-Notebook .jp-Cell").nth(i)


@contextlib.contextmanager
def open_notebook(notebook: pathlib.Path, tmp_path: pathlib.Path):
    """``notebook``'s folder copied to ``tmp_path``, JupyterLab serving it (``running_lab``), the
    notebook open in headless Chromium with every cell rendered and the kernel idle: what a
    learner has before "Run All Cells". Screenshots go to ``FSDP_MINI_SCREENSHOTS`` or the tmp dir.

        with open_notebook(ROOT / "labs" / "05_fsdp.ipynb", tmp_path) as nb:
            state, seconds = run_to_the_end(nb, timeout=240)
        assert_nothing_left(nb, "ipyparallel")

    On exit the browser closes and the server stops; ``nb.lab.seen`` lists what it started."""
    requirements()
    served = tmp_path / "lab"
    shutil.copytree(notebook.parent, served, ignore=shutil.ignore_patterns("*.pyc", "__pycache__"))
    content = json.loads(notebook.read_text())
    shots = pathlib.Path(os.environ.get("FSDP_MINI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    children_before = children(os.getpid())
    with running_lab(served, tmp_path / "jupyterlab.log", tmp_path / "jupyter-state") as lab:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(lab.url(f"lab/tree/{notebook.name}"), timeout=60_000)
                state = wait_for_notebook(page, lab, len(content["cells"]))
                code = [i for i, c in enumerate(state["cells"]) if c["code"]]
                assert code == [i for i, c in enumerate(content["cells"])
                                if c["cell_type"] == "code"], state["cells"]
                yield OpenNotebook(lab, page, content, code, shots, children_before)
            finally:
                browser.close()
        lab.record_processes()


def run_to_the_end(nb: OpenNotebook, timeout: float, stops: Callable[[str], bool] = bool,
                   on_poll: Callable[[dict], None] | None = None):
    """What a learner does: the "Run" menu, "Run All Cells"; then poll the page until the kernel
    is idle with every code cell executed. ``on_poll(state)`` sees each poll (to watch a widget
    while its cell runs). Stops at the first stderr output ``stops`` flags (Run All stops there
    too: ``assert_ran_cleanly`` says which); fails when the kernel sits idle with cells unrun for
    10 s, or after ``timeout`` s. Returns the last page state and the seconds the run took."""
    page = nb.page
    page.locator(".jp-Notebook .jp-Cell").first.click()  # the notebook has the focus
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    started, idle_since = time.monotonic(), None
    while True:
        state = page.evaluate(READ_PAGE)
        nb.lab.record_processes()  # the kernel and, while they run, its ranks
        dismiss_prompts(page, state)
        if on_poll is not None:
            on_poll(state)
        if state["status"] == "idle" and all(executed(state["cells"][i]["prompt"])
                                             for i in nb.code):
            return state, time.monotonic() - started
        if any(stops(s) for i in nb.code for s in state["cells"][i]["stderr"]):
            return state, time.monotonic() - started
        # idle with cells left unrun (Run All stopped): give it 10 s to be sure
        idle_since = (idle_since or time.monotonic()) if state["status"] == "idle" else None
        assert idle_since is None or time.monotonic() - idle_since < 10, \
            f"the kernel is idle but cells did not run:\n{describe(state)}"
        assert time.monotonic() - started < timeout, \
            f"not done in {timeout:.0f} s:\n{describe(state)}"
        time.sleep(0.1)


def assert_ran_cleanly(state, code, stderr_fails: Callable[[str], bool] = bool,
                       error=re.compile(r"Traceback|\w*Error\b")) -> None:
    """No stderr output ``stderr_fails`` flags, no output text matching ``error``, every code cell
    executed."""
    errors = [(state["cells"][i]["source"][:60], s) for i in code
              for s in state["cells"][i]["stderr"] if stderr_fails(s)]
    assert not errors, f"error output in cells: {errors}"
    for i in code:
        out = state["cells"][i]["output"]
        assert not error.search(out), (i, out[-2000:])
    assert all(executed(state["cells"][i]["prompt"]) for i in code), describe(state)


def assert_nothing_left(nb: OpenNotebook, *started: str) -> None:
    """After ``open_notebook`` closed: no process of the server's outlived it, the bookkeeping saw
    the kernel and each of ``started`` (command-line fragments), and no child of ours is left."""
    lab = nb.lab
    assert not lab.leaked, f"processes outlived JupyterLab: {lab.leaked}"
    assert not lab.ours(), [cmdline(p) for p in lab.ours()]
    commands = [cmd for _, cmd in lab.seen.values()]
    for fragment in ("ipykernel", *started):
        assert any(fragment in cmd for cmd in commands), (fragment, commands)
    # like `pgrep -f fsdp_mini.launcher.rank_entry`, but only ours: other test runs may share the
    # machine
    assert not {p for p in processes_matching("fsdp_mini.launcher.rank_entry") if p in lab.seen}
    assert wait_until(lambda: children(os.getpid()) <= nb.children_before, 5), \
        [cmdline(p) for p in children(os.getpid()) - nb.children_before]
