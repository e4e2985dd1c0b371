"""The checkers' verdicts as a learner sees them in JupyterLab: a wrong answer gets a ✘ that names
what differs, on screen, in the check cell's output.

Each test copies a lab with the exercise cell's body replaced by a mistake a learner makes from
the notebook's words, and its configuration cell at the size the notebook itself suggests
("smaller and quicker": ``labs.lab_config(world_size=2, model="tiny")``), opens it in headless
Chromium, runs it from the "Run" menu and reads the check cell's output:

- lab 01: ``predict_peak`` without the optimizer state (params 4 + grads 4 bytes per parameter,
  whatever the optimizer). "Run All Cells": the later cells fall back to the reference
  (``labs.yours_or_reference``), and cells appended to the copy show what an instructor shows,
  ``%env FSDP_MINI_SOLUTIONS=1`` and the same two cells again: the reference gets a ✔.
- lab 03: a DDP hook that divides the summed gradient by a hard-coded 2 (the lab runs 2 ranks).
  "Run All Above Selected Cell" on the check cell, then the check cell itself: the later cells
  train and compare strategies, which this test does not need.

The kernel does not run in CI mode: in CI a failed check raises instead of showing its ✘ lines.
``browser_helpers.running_lab`` gives the server ``CI=true`` (the size the other browser tests
run at), so the kernel gets ``CI=false`` from its kernel spec's ``env``, in a ``JUPYTER_PATH``
folder of the test's own; every rank the kernel launches inherits it. Screenshots of the check
cells are kept (``FSDP_MINI_SCREENSHOTS`` or the test's tmp dir) and copied to /tmp.

    python -m pytest -m browser tests/test_browser_checkers.py -p no:cacheprovider -s
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import sys
import time

import pytest
from browser_notebook import (READ_PAGE, assert_nothing_left, assert_ran_cleanly, describe,
                              dismiss_prompts, executed, open_notebook, run_to_the_end,
                              wait_until)

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAB01 = ROOT / "labs" / "01_memory.ipynb"
LAB03 = ROOT / "labs" / "03_ddp.ipynb"
TIMEOUT = 300.0  # each lab's run, on two shared CPU cores
CONFIG = "cfg = labs.lab_config()"
SMALL = 'cfg = labs.lab_config(world_size=2, model="tiny")'  # the notebooks' own "smaller and quicker"

# -- the learner's mistakes, as they would write them from the notebooks' words ------------------

LAB01_WRONG = '''\
@labs.exercise("01_predict_peak")
def predict_peak(n_params, activation_bytes, optimizer="adam"):
    """An upper bound of the peak bytes of one fp32 training step: model state + activations."""
    # 4 bytes per parameter for the weights, 4 for their gradients, and the activations on top
    return 4 * n_params + 4 * n_params + activation_bytes
'''

LAB03_WRONG = '''\
@labs.exercise("03_ddp_hooks")            # in CI the reference solution replaces it
def average_gradient(param, comm):
    """Called by autograd once param.grad holds this rank's gradient: make param.grad the
    average over the ranks."""
    comm.all_reduce(param.grad, label="grad")   # the sum over the ranks, in place
    param.grad.div_(2)                          # my two ranks: the average


@labs.exercise("03_ddp_hooks")
def wrap_ddp(module, comm):
    """Called once, by parallelize: every rank starts from rank 0's weights, and every parameter
    calls average_gradient(param, comm) once its gradient is ready."""
    for param in module.parameters():
        comm.broadcast(param.data, label="sync", src=0)
        param.register_post_accumulate_grad_hook(lambda p: average_gradient(p, comm))
'''

# What an instructor appends to lab 01 to show the reference: the learner's exercise cell and the
# check cell again, the reference standing in for the learner's code.
INSTRUCTOR = "%env FSDP_MINI_SOLUTIONS=1"


# -- the copy of a lab and the kernel it runs in -------------------------------------------------

def _code(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": source}


def _learner_copy(notebook: pathlib.Path, folder: pathlib.Path, exercise: str, answer: str,
                  append: list[dict] = ()) -> pathlib.Path:
    """``notebook`` as the learner has it: the config cell at the small size, the code cell that
    contains ``exercise`` replaced by ``answer``, ``append`` at the end; the labs' solutions
    beside it, as in labs/."""
    content = json.loads(notebook.read_text())
    cells = content["cells"]
    config = [c for c in cells if c["cell_type"] == "code" and CONFIG in "".join(c["source"])]
    target = [c for c in cells if c["cell_type"] == "code" and exercise in "".join(c["source"])]
    assert len(config) == 1 and len(target) == 1, (len(config), len(target))
    config[0]["source"] = "".join(config[0]["source"]).replace(CONFIG, SMALL)
    target[0]["source"] = answer
    cells.extend(append)
    for cell in cells:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    folder.mkdir()
    shutil.copytree(notebook.parent / "solutions", folder / "solutions")
    copy = folder / notebook.name
    copy.write_text(json.dumps(content, indent=1, ensure_ascii=False))
    return copy


@pytest.fixture
def kernel_not_in_ci(tmp_path, monkeypatch):
    """The notebook's kernel ("python3") gets CI=false and no progress file from a kernel spec
    found first on ``JUPYTER_PATH``: the server itself is started with CI=true."""
    spec = tmp_path / "jupyter-path" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python",
        "env": {"CI": "false", "FSDP_MINI_PROGRESS": "0"}}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter-path"))
    monkeypatch.setenv("FSDP_MINI_PROGRESS", "0")


# -- running and reading ------------------------------------------------------------------------

def _is_error(stderr: str) -> bool:
    return "Traceback" in stderr or "Error" in stderr


def _menu(page, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def _run_through(nb, index: int, timeout: float):
    """What a learner does to run the notebook as far as one cell: select it, "Run All Above
    Selected Cell", then "Run Selected Cell and Do not Advance"; poll until the kernel is idle
    with every code cell up to ``index`` executed. Returns the page state and the seconds."""
    page = nb.page
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputPrompt").click()
    _menu(page, "Run All Above Selected Cell")
    cell.locator(".jp-InputPrompt").click()  # still the active cell: said again, to be sure
    _menu(page, "Run Selected Cell and Do not Advance")
    wanted = [i for i in nb.code if i <= index]
    started, idle_since = time.monotonic(), None
    while True:
        state = page.evaluate(READ_PAGE)
        nb.lab.record_processes()  # the kernel and, while they run, the checker's ranks
        dismiss_prompts(page, state)
        if state["status"] == "idle" and all(executed(state["cells"][i]["prompt"])
                                             for i in wanted):
            return state, time.monotonic() - started
        if any(_is_error(s) for i in wanted for s in state["cells"][i]["stderr"]):
            return state, time.monotonic() - started
        idle_since = (idle_since or time.monotonic()) if state["status"] == "idle" else None
        assert idle_since is None or time.monotonic() - idle_since < 10, \
            f"the kernel is idle but cells did not run:\n{describe(state)}"
        assert time.monotonic() - started < timeout, \
            f"not done in {timeout:.0f} s:\n{describe(state)}"
        time.sleep(0.1)


def _verdict(nb, index: int) -> str:
    """The check cell's output as the page shows it, line by line (the result's HTML)."""
    cell = nb.page.locator(".jp-Notebook .jp-Cell").nth(index)
    # Note: JupyterLab's default windowing (content-visibility) leaves a cell off screen
    # unrendered, and its innerText empty: bring it on screen first, as a learner scrolls to it
    cell.evaluate("e => e.scrollIntoView({block: 'center'})")
    # Note: the output's own text, not its prompt ("[5]:"), which sits in the same area
    output, seen = cell.locator(".jp-OutputArea-output"), []
    drawn = wait_until(lambda: seen.append("\n".join(
        t.strip() for t in output.all_inner_texts()).strip()) or seen[-1], 10)
    assert drawn, f"the check cell's output was not drawn: {output.text_content()!r}"
    return seen[-1]


def _screenshot(nb, index: int, name: str, copy_to: str) -> pathlib.Path:
    """The check cell, its source and its verdict, as on screen; copied to ``copy_to``."""
    cell = nb.page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.evaluate("e => e.scrollIntoView({block: 'center'})")
    nb.page.wait_for_timeout(300)
    shot = nb.shots / name
    cell.screenshot(path=str(shot))
    shutil.copy(shot, copy_to)
    return shot


def _not_ci(state, config_index: int) -> None:
    """The config cell printed the size the learner asked for, not CI's."""
    said = state["cells"][config_index]["output"]
    assert "lab config: 2 ranks" in said and "tiny GPT" in said, said
    assert "CI=true" not in said and "changed by you: world_size, model" in said, said


# -- lab 01 ----------------------------------------------------------------------------------------

def test_lab01_a_bound_without_the_optimizer_state_gets_a_cross_that_says_so(
        tmp_path, kernel_not_in_ci):
    t0 = time.monotonic()
    check = "labs.check_peak_predictor(predict_peak"
    source = json.loads(LAB01.read_text())["cells"]
    check_src = "".join(next(c["source"] for c in source
                             if c["cell_type"] == "code" and check in "".join(c["source"])))
    instructor = [{"cell_type": "markdown", "metadata": {},
                   "source": "The instructor shows the reference solution:"},
                  _code(INSTRUCTOR), _code(LAB01_WRONG), _code(check_src)]
    copy = _learner_copy(LAB01, tmp_path / "learner", '@labs.exercise("01_predict_peak")',
                         LAB01_WRONG, append=instructor)
    with open_notebook(copy, tmp_path) as nb:
        config_i, _ = nb.cell(SMALL)
        check_i, _ = nb.cell(check)
        fallback_i, _ = nb.cell("labs.yours_or_reference(check")
        ref_exercise_i, ref_check_i = nb.code[-2], nb.code[-1]
        assert ref_check_i > check_i and nb.notebook["cells"][ref_check_i]["source"] == check_src
        # Note: only errors stop the run (a warning on stderr would not stop a learner either)
        state, took = run_to_the_end(nb, TIMEOUT, stops=_is_error)
        assert_ran_cleanly(state, nb.code, stderr_fails=_is_error)
        shot = _screenshot(nb, check_i, "lab01_check.png", "/tmp/browser_checker_lab01.png")
        wrong = _verdict(nb, check_i)
        ref_shot = _screenshot(nb, ref_check_i, "lab01_reference.png",
                               "/tmp/browser_checker_lab01_reference.png")
        right = _verdict(nb, ref_check_i)
    total = time.monotonic() - t0
    print(f"\nlab 01: run all cells took {took:.1f} s, the whole test {total:.1f} s\n"
          f"--- the learner's check cell:\n{wrong}\n--- the reference's:\n{right}\n"
          f"screenshots: {shot} (copied to /tmp/browser_checker_lab01.png), {ref_shot} (copied "
          f"to /tmp/browser_checker_lab01_reference.png)")
    _not_ci(state, config_i)

    # -- the learner's answer: a ✘ at the smallest configuration, with the bytes per parameter
    lines = wrong.splitlines()
    assert lines[0] == "✘ your upper bound of the peak memory: not yet right", wrong
    assert "✔" not in wrong and "all checks passed" not in wrong, wrong
    first = next(line for line in lines[1:] if line.lstrip().startswith("✘"))
    assert "at n params 1, activation bytes 0, optimizer 'momentum'" in first, first
    assert "yours 8, the reference 12" in first, first
    assert "right with optimizer 'sgd', wrong with 'adam', 'momentum'" in first, first
    hint = next(line for line in lines if line.lstrip().startswith("hint:"))
    assert "right with sgd, 4 B short with momentum, 8 B short with adam" in hint, hint

    # -- the rest of the lab ran on the reference, and said so
    assert "Yours does not pass its check yet" in state["cells"][fallback_i]["output"]

    # -- the instructor's cells: the reference in place of the learner's code gets a ✔
    assert "the reference solution of '01_predict_peak' runs in place of yours" in \
        state["cells"][ref_exercise_i]["output"], state["cells"][ref_exercise_i]["output"]
    assert right.startswith("✔ your upper bound of the peak memory: all checks passed"), right
    assert "✘" not in right and "48 configurations" in right, right
    assert "above the measured peak" in right, right
    assert_nothing_left(nb)


# -- lab 03 ----------------------------------------------------------------------------------------

def test_lab03_a_hook_that_divides_by_two_gets_a_cross_at_the_world_sizes_where_it_differs(
        tmp_path, kernel_not_in_ci):
    t0 = time.monotonic()
    copy = _learner_copy(LAB03, tmp_path / "learner", '@labs.exercise("03_ddp_hooks")',
                         LAB03_WRONG)
    with open_notebook(copy, tmp_path) as nb:
        config_i, _ = nb.cell(SMALL)
        check_i, _ = nb.cell("labs.check_ddp(wrap_ddp, average_gradient")
        state, took = _run_through(nb, check_i, TIMEOUT)
        assert_ran_cleanly(state, [i for i in nb.code if i <= check_i], stderr_fails=_is_error)
        assert not any(executed(state["cells"][i]["prompt"]) for i in nb.code if i > check_i)
        shot = _screenshot(nb, check_i, "lab03_check.png", "/tmp/browser_checker_lab03.png")
        wrong = _verdict(nb, check_i)
    total = time.monotonic() - t0
    print(f"\nlab 03: the cells up to the check took {took:.1f} s, the whole test {total:.1f} s\n"
          f"--- the learner's check cell:\n{wrong}\n"
          f"screenshot: {shot} (copied to /tmp/browser_checker_lab03.png)")
    _not_ci(state, config_i)

    lines = wrong.splitlines()
    assert lines[0] == "✘ your DDP (wrap_ddp + average_gradient): not yet right", wrong
    assert "✔" not in wrong and "all checks passed" not in wrong, wrong
    first = next(line for line in lines[1:] if line.lstrip().startswith("✘"))
    # at one rank the sum is the gradient itself: divided by 2 it is half the reference's
    assert first.lstrip().startswith("✘ at world size 1,"), first
    assert "rank 0's gradient in step 1" in first and "(0.5x)" in first, first
    assert "right with world size 2, wrong with 1, 3, 4" in first, first
    hint = next(line for line in lines if line.lstrip().startswith("hint:"))
    assert "divided by 2 whatever the world size" in hint and "comm.world_size" in hint, hint
    assert_nothing_left(nb, "fsdp_mini.launcher.rank_entry")
