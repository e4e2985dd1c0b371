"""The demo notebook in a real browser: JupyterLab on localhost, headless Chromium, "Run All Cells".

Checks what a learner sees: the FSDP dashboard draws per-rank memory bars and traffic figures
while the launch cell is still running, every cell finishes without an error, and the
comparison shows ddp, zero1, zero2 and fsdp. Saves screenshots (``FSDP_MINI_SCREENSHOTS`` or the
test's tmp dir). Needs Debian's ``chromium`` and the ``playwright`` package (no browser download).

    python -m pytest -m browser tests/test_browser.py -s
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import time
import urllib.error

import pytest

from browser_helpers import children, cmdline, processes_matching, running_lab

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
except ImportError:  # the test skips
    sync_playwright, PlaywrightError = None, Exception

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "labs" / "demo_dashboard.ipynb"
CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
RANKS = range(4)  # CI=true: the notebook's config cell runs 4 ranks, tiny GPT (25 steps here)
RUN_TIMEOUT = 240.0
SIZE = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)")

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

# Inside one cell's output: the dashboard's memory rows and traffic rows, rank by rank, and
# the widths the browser actually laid out for the coloured bar segments.
READ_DASHBOARD = r"""(cell) => {
  const text = e => (e ? e.textContent : "");
  const trackIn = e => [...e.querySelectorAll("div")].find(d => d.style.position === "relative");
  const segments = track => [...track.children].filter(d => d.style.background)
    .map(d => d.getBoundingClientRect().width);
  const memoryBox = [...cell.querySelectorAll(".widget-vbox")]
    .find(b => b.firstElementChild && text(b.firstElementChild).startsWith("Memory per rank"));
  const memory = memoryBox ? [...memoryBox.children[1].querySelectorAll(".widget-html-content")]
    .map(row => {
      const track = trackIn(row);
      return {label: text(row.querySelector("b")), text: text(row),
              track: track ? track.getBoundingClientRect().width : 0,
              segments: track ? segments(track) : []};
    }) : [];
  const trafficTable = [...cell.querySelectorAll(".widget-html-content")]
    .find(h => text(h).startsWith("Bytes sent per rank"));
  const traffic = trafficTable ? [...trafficTable.querySelectorAll("tr")].slice(1).map(tr => {
      const tds = [...tr.querySelectorAll("td")];
      const track = trackIn(tr);
      return {cells: tds.map(text), segments: track ? segments(track) : []};
    }) : [];
  const header = cell.querySelector(".widget-vbox .widget-html-content");
  return {header: text(header), memory, traffic};
}"""

READ_COMPARISON = r"""(cell) => {
  const text = e => (e ? e.textContent : "");
  const table = cell.querySelector(".widget-vbox table");
  const header = cell.querySelector(".widget-vbox .widget-html-content");
  return {header: text(header),
          rows: table ? [...table.querySelectorAll("tr")].slice(1)
            .map(tr => [...tr.querySelectorAll("td")].map(text)) : []};
}"""


def _requirements() -> None:
    if CHROMIUM is None:
        pytest.skip("no `chromium` on PATH (Debian: apt-get install chromium)")
    if sync_playwright is None:
        pytest.skip("playwright is not installed (pip install playwright; its browser download "
                    "is not needed: the test uses the system chromium)")


def _wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _executed(prompt: str) -> bool:
    return re.fullmatch(r"\[\d+\]:", prompt) is not None


def _has_bars(view) -> bool:
    """Every rank's memory row has coloured segments and a size: data came in."""
    return all(sum(m["segments"]) > 0 and SIZE.search(m["text"]) for m in view["memory"])


def _cell_index(notebook, needle: str) -> int:
    """The first code cell whose source contains ``needle`` (from the file: editors load late)."""
    found = [i for i, c in enumerate(notebook["cells"])
             if c["cell_type"] == "code" and needle in "".join(c["source"])]
    assert found, f"no code cell containing {needle!r}"
    return found[0]


def _describe(state) -> str:
    return "\n".join(f"{c['prompt']:>6} {c['source'][:60]!r} -> {c['output'][-300:]!r}"
                     for c in state["cells"] if c["code"])


def _dismiss_prompts(page, state) -> None:
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


def _wait_for_notebook(page, lab, n_cells, timeout=90.0):
    """All cells rendered, prompts dismissed, and a kernel that is idle with this page connected."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = page.evaluate(READ_PAGE)
        _dismiss_prompts(page, state)
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


def _run_all_cells(page) -> None:
    """What a learner does: the "Run" menu, then "Run All Cells"."""
    page.locator(".jp-Notebook .jp-Cell").first.click()  # the notebook has the focus
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def _screenshots(page, dash_cell, out_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The whole notebook (the viewport stretched to its last cell) and the first dashboard."""
    full, focused = out_dir / "demo_dashboard.png", out_dir / "demo_dashboard_fsdp.png"
    viewport = page.viewport_size
    scroller = ".jp-NotebookPanel .jp-WindowedPanel-outer"
    height = page.evaluate(f"""() => {{
      const s = document.querySelector("{scroller}");
      s.scrollTop = 0;
      return s.scrollHeight; }}""")
    page.set_viewport_size({"width": viewport["width"], "height": min(height + 300, 16000)})
    page.wait_for_timeout(500)
    bottom = page.evaluate(f"""() => {{
      const s = document.querySelector("{scroller}");
      s.scrollTop = 0;
      const cells = s.querySelectorAll(".jp-Cell");
      return cells[cells.length - 1].getBoundingClientRect().bottom; }}""")
    page.set_viewport_size({"width": viewport["width"],
                            "height": max(viewport["height"], min(int(bottom) + 60, 16000))})
    page.wait_for_timeout(500)
    page.screenshot(path=str(full), full_page=True)
    page.set_viewport_size(viewport)
    page.wait_for_timeout(300)
    dash_cell.locator(".jp-OutputArea").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    page.screenshot(path=str(focused))
    return full, focused


def test_demo_notebook_runs_live_in_jupyterlab(tmp_path):
    _requirements()
    served = tmp_path / "lab"
    served.mkdir()
    shutil.copy(NOTEBOOK, served / NOTEBOOK.name)
    notebook = json.loads(NOTEBOOK.read_text())
    shots = pathlib.Path(os.environ.get("FSDP_MINI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    children_before = children(os.getpid())
    t0 = time.monotonic()
    live, final = [], None  # dashboard states seen while its cell still showed [*]
    live_shot = shots / "demo_dashboard_live.png"

    with running_lab(served, tmp_path / "jupyterlab.log", tmp_path / "jupyter-state") as lab:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(lab.url(f"lab/tree/{NOTEBOOK.name}"), timeout=60_000)
                state = _wait_for_notebook(page, lab, len(notebook["cells"]))
                code = [i for i, c in enumerate(state["cells"]) if c["code"]]
                assert code == [i for i, c in enumerate(notebook["cells"])
                                if c["cell_type"] == "code"], state["cells"]
                dash_i = _cell_index(notebook, "Dashboard()")
                cmp_i = _cell_index(notebook, "Comparison()")
                cells = page.locator(".jp-Notebook .jp-Cell")
                dash_cell, cmp_cell = cells.nth(dash_i), cells.nth(cmp_i)
                t_ready = time.monotonic()
                _run_all_cells(page)

                deadline, idle_since = time.monotonic() + RUN_TIMEOUT, None
                while True:
                    state = page.evaluate(READ_PAGE)
                    lab.record_processes()  # the kernel and, while they run, its ranks
                    _dismiss_prompts(page, state)
                    if state["cells"][dash_i]["prompt"] == "[*]:":
                        seen = dash_cell.evaluate(READ_DASHBOARD)
                        labels = [m["label"] for m in seen["memory"]]
                        # Note: a view read while the widget re-renders its rows is skipped
                        if labels == [f"rank {r}" for r in RANKS] and "running" in seen["header"]:
                            live.append(seen)
                            if _has_bars(seen) and not live_shot.exists():
                                dash_cell.locator(".jp-OutputArea").evaluate(
                                    "e => e.scrollIntoView({block: 'start'})")
                                page.screenshot(path=str(live_shot))
                    prompts = [state["cells"][i]["prompt"] for i in code]
                    done = all(_executed(p) for p in prompts)
                    if state["status"] == "idle" and done:
                        break
                    if any(s for i in code for s in state["cells"][i]["stderr"]):
                        break  # an error: Run All stops there; the assertions below say which
                    # idle with cells left unrun (Run All stopped): give it 10 s to be sure
                    idle_since = (idle_since or time.monotonic()) if state["status"] == "idle" \
                        else None
                    assert idle_since is None or time.monotonic() - idle_since < 10, \
                        f"the kernel is idle but cells did not run:\n{_describe(state)}"
                    assert time.monotonic() < deadline, \
                        f"not done in {RUN_TIMEOUT:.0f} s:\n{_describe(state)}"
                    time.sleep(0.1)
                t_run = time.monotonic() - t_ready

                errors = [(state["cells"][i]["source"][:60], s) for i in code
                          for s in state["cells"][i]["stderr"]]
                assert not errors, f"error output in cells: {errors}"
                for i in code:
                    out = state["cells"][i]["output"]
                    assert not re.search(r"Traceback|\w*Error\b", out), (i, out[-2000:])
                assert all(_executed(state["cells"][i]["prompt"]) for i in code), _describe(state)
                page.wait_for_timeout(500)  # the last widget messages after the kernel is idle
                final = dash_cell.evaluate(READ_DASHBOARD)
                comparison = cmp_cell.evaluate(READ_COMPARISON)
                full, focused = _screenshots(page, dash_cell, shots)
            finally:
                browser.close()
        lab.record_processes()
    shutil.copy(full, "/tmp/browser_demo.png")
    shutil.copy(focused, "/tmp/browser_demo_fsdp.png")

    # -- the dashboard, live: drawn while the launch cell still ran -----------------------------
    drawn = [v for v in live if _has_bars(v)]
    views = {(v["header"], tuple(m["text"] for m in v["memory"])) for v in live}
    steps = sorted({m.group(0) for v in drawn for m in [re.search(r"step \d+", v["header"])] if m})
    print(f"\nscreenshots: {full} {focused} (copied to /tmp/browser_demo.png, "
          f"/tmp/browser_demo_fsdp.png); run all cells took {t_run:.1f} s, "
          f"the whole test {time.monotonic() - t0:.1f} s; {len(live)} live views of the "
          f"dashboard while its cell ran ({len(drawn)} with bars, {len(views)} different, "
          f"showing {', '.join(steps) or 'no step'})")

    assert live, "the dashboard never showed ranks 0-3 while its cell was running"
    assert drawn, f"no memory bars were drawn while the cell ran: {live[-1]}"
    assert len(views) >= 2, f"the dashboard did not change while the cell ran: {views}"

    # -- the dashboard, final: memory bars per rank ---------------------------------------------
    assert "finished" in final["header"] and "4 ranks" in final["header"], final["header"]
    assert [m["label"] for m in final["memory"]] == [f"rank {r}" for r in RANKS], final["memory"]
    for row in final["memory"]:
        assert row["track"] > 50, row  # the bar's track is laid out, not collapsed
        assert sum(row["segments"]) > 1, row  # coloured segments with real width
        assert "peak" in row["text"] and SIZE.search(row["text"]), row["text"]

    # -- traffic: bytes per rank, measured beside the formula -----------------------------------
    assert [t["cells"][0] for t in final["traffic"]] == [f"rank {r}" for r in RANKS], final
    for t in final["traffic"]:
        _, _, this_step, formula, whole_run = t["cells"]
        assert SIZE.fullmatch(this_step) and SIZE.fullmatch(whole_run), t
        assert this_step == formula, t  # FSDP sends exactly what the formula says
        assert sum(t["segments"]) > 1, t

    # -- the static figure rides in the widget's own output (for nbconvert and GitHub; see
    # tests/test_demo_notebook.py): JupyterLab renders the live widget instead, once
    assert state["cells"][dash_i]["images"] == 0, "JupyterLab should show the widget, not its PNG"
    assert state["cells"][cmp_i]["images"] == 0, "JupyterLab should show the widget, not its PNG"

    # -- the comparison: every strategy, with sizes ---------------------------------------------
    assert "finished" in comparison["header"], comparison["header"]
    names = [row[0] for row in comparison["rows"]]
    assert {"ddp", "zero1", "zero2", "fsdp"} <= set(names), names
    for row in comparison["rows"]:
        assert sum(bool(SIZE.fullmatch(c)) for c in row) >= 4, row

    # -- nothing left running ---------------------------------------------------------------------
    assert not lab.leaked, f"processes outlived JupyterLab: {lab.leaked}"
    assert not lab.ours(), [cmdline(p) for p in lab.ours()]
    commands = [cmd for _, cmd in lab.seen.values()]
    assert any("ipykernel" in cmd for cmd in commands), commands  # the bookkeeping saw them
    assert any("fsdp_mini.launcher.rank_entry" in cmd for cmd in commands), commands
    # like `pgrep -f fsdp_mini.launcher.rank_entry`, but only ours: other test runs may share the machine
    assert not {p for p in processes_matching("fsdp_mini.launcher.rank_entry") if p in lab.seen}
    assert _wait_until(lambda: children(os.getpid()) <= children_before, 5), \
        [cmdline(p) for p in children(os.getpid()) - children_before]


LAB05 = ROOT / "labs" / "05_fsdp.ipynb"


def test_lab05_runs_to_the_end_in_jupyterlab(tmp_path):
    """Lab 05 as a learner runs it: "Run All Cells" in JupyterLab, the dashboard visible, the
    interactive ranks started and stopped; a screenshot of the dashboard is kept."""
    _requirements()
    served = tmp_path / "lab"
    shutil.copytree(ROOT / "labs", served, ignore=shutil.ignore_patterns("*.pyc", "__pycache__"))
    notebook = json.loads(LAB05.read_text())
    shots = pathlib.Path(os.environ.get("FSDP_MINI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    children_before = children(os.getpid())
    with running_lab(served, tmp_path / "jupyterlab.log", tmp_path / "jupyter-state") as lab:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(lab.url(f"lab/tree/{LAB05.name}"), timeout=60_000)
                state = _wait_for_notebook(page, lab, len(notebook["cells"]))
                code = [i for i, c in enumerate(state["cells"]) if c["code"]]
                dash_i = _cell_index(notebook, "Dashboard()")
                dash_cell = page.locator(".jp-Notebook .jp-Cell").nth(dash_i)
                started = time.monotonic()
                _run_all_cells(page)
                while True:
                    state = page.evaluate(READ_PAGE)
                    lab.record_processes()
                    _dismiss_prompts(page, state)
                    if state["status"] == "idle" and all(
                            _executed(state["cells"][i]["prompt"]) for i in code):
                        break
                    if any(s for i in code for s in state["cells"][i]["stderr"]
                           if "Traceback" in s or "Error" in s):
                        break
                    assert time.monotonic() - started < RUN_TIMEOUT, _describe(state)
                    time.sleep(0.2)
                took = time.monotonic() - started
                for i in code:
                    out = state["cells"][i]["output"]
                    assert not re.search(r"Traceback|\w+Error:", out), (i, out[-2000:])
                page.wait_for_timeout(500)
                final = dash_cell.evaluate(READ_DASHBOARD)
                dash_cell.locator(".jp-OutputArea").evaluate(
                    "e => e.scrollIntoView({block: 'start'})")
                page.wait_for_timeout(300)
                shot = shots / "lab05_dashboard.png"
                page.screenshot(path=str(shot))
            finally:
                browser.close()
        lab.record_processes()
    shutil.copy(shot, "/tmp/browser_lab05.png")
    print(f"\nlab 05: run all cells took {took:.1f} s; screenshot {shot} "
          f"(copied to /tmp/browser_lab05.png)")
    ranks = [m["label"] for m in final["memory"]]
    assert "finished" in final["header"] and ranks and ranks[0] == "rank 0", final
    for row in final["memory"]:
        assert sum(row["segments"]) > 1 and "peak" in row["text"], row
    assert not lab.leaked, f"processes outlived JupyterLab: {lab.leaked}"
    commands = [cmd for _, cmd in lab.seen.values()]
    assert any("ipyparallel" in cmd for cmd in commands), "the interactive ranks were not seen"
    assert _wait_until(lambda: children(os.getpid()) <= children_before, 5)
