"""The labs in a real browser: JupyterLab on localhost, headless Chromium, "Run All Cells".

Checks what a learner sees: the FSDP dashboard of the demo notebook draws per-rank memory bars
and traffic figures while the launch cell is still running, and its comparison shows ddp, zero1,
zero2 and fsdp; lab 05 runs to the end with its dashboard; lab 07 runs to the end and its planner
widget is drawn and answers its controls. Every cell finishes without an error and no process is
left. Saves screenshots (``FSDP_MINI_SCREENSHOTS`` or the test's tmp dir). Needs Debian's
``chromium`` and the ``playwright`` package (no browser download); the helpers are in
``browser_notebook`` and ``browser_helpers``.

    python -m pytest -m browser tests/test_browser.py -s
"""

from __future__ import annotations

import pathlib
import re
import shutil
import time

import pytest
from browser_notebook import (assert_nothing_left, assert_ran_cleanly, open_notebook,
                              run_to_the_end, wait_until)

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "labs" / "demo_dashboard.ipynb"
RANKS = range(4)  # CI=true: the notebook's config cell runs 4 ranks, tiny GPT (25 steps here)
RUN_TIMEOUT = 240.0
SIZE = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)")

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


def _has_bars(view) -> bool:
    """Every rank's memory row has coloured segments and a size: data came in."""
    return all(sum(m["segments"]) > 0 and SIZE.search(m["text"]) for m in view["memory"])


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
    t0 = time.monotonic()
    live = []  # dashboard states seen while its cell still showed [*]
    with open_notebook(NOTEBOOK, tmp_path) as nb:
        live_shot = nb.shots / "demo_dashboard_live.png"
        dash_i, dash_cell = nb.cell("Dashboard()")
        cmp_i, cmp_cell = nb.cell("Comparison()")

        def watch(state):
            if state["cells"][dash_i]["prompt"] != "[*]:":
                return
            seen = dash_cell.evaluate(READ_DASHBOARD)
            labels = [m["label"] for m in seen["memory"]]
            # Note: a view read while the widget re-renders its rows is skipped
            if labels == [f"rank {r}" for r in RANKS] and "running" in seen["header"]:
                live.append(seen)
                if _has_bars(seen) and not live_shot.exists():
                    dash_cell.locator(".jp-OutputArea").evaluate(
                        "e => e.scrollIntoView({block: 'start'})")
                    nb.page.screenshot(path=str(live_shot))

        state, t_run = run_to_the_end(nb, RUN_TIMEOUT, on_poll=watch)
        assert_ran_cleanly(state, nb.code)
        nb.page.wait_for_timeout(500)  # the last widget messages after the kernel is idle
        final = dash_cell.evaluate(READ_DASHBOARD)
        comparison = cmp_cell.evaluate(READ_COMPARISON)
        full, focused = _screenshots(nb.page, dash_cell, nb.shots)
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
    assert_nothing_left(nb, "fsdp_mini.launcher.rank_entry")


def _is_error(stderr: str) -> bool:
    return "Traceback" in stderr or "Error" in stderr


def _output_screenshot(nb, cell, name: str) -> pathlib.Path:
    """A screenshot of the viewport with ``cell``'s output at its top."""
    cell.locator(".jp-OutputArea").evaluate("e => e.scrollIntoView({block: 'start'})")
    nb.page.wait_for_timeout(300)
    shot = nb.shots / name
    nb.page.screenshot(path=str(shot))
    return shot


LAB05 = ROOT / "labs" / "05_fsdp.ipynb"


def test_lab05_runs_to_the_end_in_jupyterlab(tmp_path):
    """Lab 05 as a learner runs it: "Run All Cells" in JupyterLab, the dashboard visible, the
    interactive ranks started and stopped; a screenshot of the dashboard is kept."""
    with open_notebook(LAB05, tmp_path) as nb:
        _, dash_cell = nb.cell("Dashboard()")
        # Note: the interactive ranks log to stderr as they start: only errors stop the run
        state, took = run_to_the_end(nb, RUN_TIMEOUT, stops=_is_error)
        assert_ran_cleanly(state, nb.code, stderr_fails=_is_error,
                           error=re.compile(r"Traceback|\w+Error:"))
        nb.page.wait_for_timeout(500)
        final = dash_cell.evaluate(READ_DASHBOARD)
        shot = _output_screenshot(nb, dash_cell, "lab05_dashboard.png")
    shutil.copy(shot, "/tmp/browser_lab05.png")
    print(f"\nlab 05: run all cells took {took:.1f} s; screenshot {shot} "
          f"(copied to /tmp/browser_lab05.png)")
    ranks = [m["label"] for m in final["memory"]]
    assert "finished" in final["header"] and ranks and ranks[0] == "rank 0", final
    for row in final["memory"]:
        assert sum(row["segments"]) > 1 and "peak" in row["text"], row
    assert_nothing_left(nb, "ipyparallel")


# -- lab 07: its last widget, the planner, drawn and live ---------------------------------------

LAB07 = ROOT / "labs" / "07_bigger.ipynb"
LAB07_TIMEOUT = 480.0  # six trainings (five on CPU) of the tiny GPT, on a loaded machine

# The Planner widget in one cell's output: its box, each control (label -> value as shown), the
# bars' image and the table.
READ_PLANNER = r"""(cell) => {
  const text = e => (e ? e.textContent : "");
  const size = e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const box = cell.querySelector(".jp-OutputArea .widget-vbox");
  if (!box) return null;
  const controls = {};
  for (const w of box.querySelectorAll(".widget-inline-hbox")) {
    const label = text(w.querySelector("label")).trim();
    const select = w.querySelector("select"), check = w.querySelector("input[type=checkbox]");
    const readout = w.querySelector(".widget-readout");
    if (label) controls[label] = select ? text(select.selectedOptions[0])
      : check ? check.checked : readout ? text(readout).trim() : null;
  }
  const img = box.querySelector("img.widget-image"), pre = box.querySelector("pre");
  return {size: size(box), controls, table: text(pre).trim(),
          image: img ? {src: img.src, natural: img.naturalWidth, size: size(img)} : null};
}"""
SHOWN = {"model", "GPUs", "GPU GB", "precision", "micro-batch", "nodes GB/s", "reduce in", "GPU", "tokens", "price"}


def _planner_table(controls) -> str:
    """The table the Planner shows for these values of its arguments, planned here."""
    from fsdp_mini.planner.table import format_plan
    from fsdp_mini.widgets.planner import Planner

    shown = Planner(model=controls["model"], gpus=int(controls["GPUs"]),
                    gpu_mem_gb=float(controls["GPU GB"]), precision=controls["precision"])
    return format_plan(shown.plan).strip()


def _control(cell, page, kind: str, label: str):
    return cell.locator(kind).filter(
        has=page.locator("label", has_text=re.compile(f"^{re.escape(label)}$")))


def _after(cell, before, change, timeout=60.0):
    """Make ``change`` in the browser; the planner as soon as its table and its image moved."""
    change()
    seen = []
    moved = wait_until(lambda: seen.append(cell.evaluate(READ_PLANNER)) or (
        seen[-1]["table"] != before["table"] and seen[-1]["image"]["src"] != before["image"]["src"]
        and seen[-1]["image"]["natural"] > 0), timeout)
    assert moved, f"the planner did not redraw in {timeout:.0f} s: {seen[-1]}"
    return seen[-1]


def _assert_drawn(view, controls: dict) -> None:
    """The planner is laid out with its controls, an image of its bars and the right table."""
    assert view["size"][0] > 300 and view["size"][1] > 300, view["size"]
    assert SHOWN <= set(view["controls"]), view["controls"]
    assert view["image"] and view["image"]["natural"] > 100, view["image"]
    assert min(view["image"]["size"]) > 100, view["image"]
    assert {k: view["controls"][k] for k in controls} == controls, view["controls"]
    assert view["table"] == _planner_table(view["controls"]), view["table"]
    assert re.search(r"^fsdp\s", view["table"], re.M), view["table"]


def test_lab07_runs_to_the_end_and_its_planner_answers(tmp_path):
    """Lab 07 as a learner runs it: "Run All Cells" in JupyterLab, then the planner of its last
    cell is drawn, and answers a new model and a new GPU count chosen in the browser."""
    with open_notebook(LAB07, tmp_path) as nb:
        _, cell = nb.cell("Planner(")
        state, took = run_to_the_end(nb, LAB07_TIMEOUT)
        assert_ran_cleanly(state, nb.code)
        nb.page.wait_for_timeout(500)
        first = cell.evaluate(READ_PLANNER)
        assert first is not None, f"no planner widget in the last cell: {state['cells'][-1]}"
        _assert_drawn(first, {})
        # -- live: the kernel is idle, so the browser's changes reach it and it redraws
        model = "7b" if first["controls"]["model"] != "7b" else "70b"
        select = _control(cell, nb.page, ".widget-dropdown", "model").locator("select")
        second = _after(cell, first, lambda: select.select_option(label=model))
        _assert_drawn(second, {"model": model, "GPUs": first["controls"]["GPUs"]})
        gpus = "8" if first["controls"]["GPUs"] != "8" else "16"
        readout = _control(cell, nb.page, ".widget-slider", "GPUs").locator(".widget-readout")
        third = _after(cell, second, lambda: (readout.fill(gpus), readout.press("Enter")))
        _assert_drawn(third, {"model": model, "GPUs": gpus})
        assert f"{gpus} GPUs of" in third["table"].splitlines()[0], third["table"]
        shot = nb.shots / "lab07_planner.png"
        cell.locator(".jp-OutputArea").screenshot(path=str(shot))
    shutil.copy(shot, "/tmp/browser_lab07.png")
    print(f"\nlab 07: run all cells took {took:.1f} s; the planner redrew for {model} and for "
          f"{gpus} GPUs; screenshot {shot} (copied to /tmp/browser_lab07.png)")
    assert_nothing_left(nb, "fsdp_mini.launcher.rank_entry")
