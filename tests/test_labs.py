"""The labs as a whole: all twelve there (eleven labs and the assessment), every notebook in
labs/ run by CI, stored clean, listed in labs/README.md, and rendered to HTML by one command."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from fsdp_mini import labs
from fsdp_mini.jobs.render_labs import LABS_DIR, lab_notebooks

ROOT = LABS_DIR.parent
EXPECTED = ["00_setup", "01_memory", "02_collectives", "03_ddp", "04_zero", "05_fsdp", "06_fast", "07_bigger", "08_checkpoints", "09_debugging", "10_production",
            "11_assessment"]


def test_the_labs_are_there():
    assert [p.stem for p in lab_notebooks()] == EXPECTED


def test_every_notebook_in_labs_is_run_by_ci():
    """pytest collects labs/ with nbval (pyproject's testpaths) and skips none of them."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", str(LABS_DIR)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    collected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    notebooks = {str(p.relative_to(ROOT)) for p in LABS_DIR.glob("*.ipynb")}
    assert notebooks, "no notebook in labs/"
    missing = notebooks - collected
    assert not missing, f"notebooks CI does not run: {sorted(missing)}\n{proc.stdout[-2000:]}"


@pytest.mark.parametrize("path", sorted(LABS_DIR.glob("*.ipynb")), ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", sorted(LABS_DIR.glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_cell_has_an_id(path):
    """nbformat 4.5 gives each cell an id (JupyterLab and nbval key on it); a cell added by hand
    without one warns today and is an error in later nbformat versions."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    missing = [i for i, c in enumerate(raw["cells"]) if not c.get("id")]
    assert not missing, f"{path.name}: cells {missing} have no id; give each a short unique one"


@pytest.mark.parametrize("path", lab_notebooks(), ids=lambda p: p.stem)
def test_lab_opens_with_objectives_and_ends_with_key_points(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0].source.lower()
    assert "objective" in first and re.search(r"\d+\s*min", first), \
        f"{path.name}: the first cell must state the objectives and the time"
    text = "\n".join(c.source for c in nb.cells).lower()
    assert "key points" in text, f"{path.name}: no key points"


@pytest.mark.parametrize("path", lab_notebooks(), ids=lambda p: p.stem)
def test_lab_is_listed_in_the_labs_readme(path):
    readme = (LABS_DIR / "README.md").read_text()
    assert path.name in readme, f"{path.name} is not in labs/README.md"


def test_every_solution_is_used_by_a_lab():
    names = {p.stem for p in (LABS_DIR / "solutions").glob("*.py")}
    text = "\n".join(c.source for p in lab_notebooks()
                     for c in nbformat.read(p, as_version=4).cells)
    unused = sorted(n for n in names if f'"{n}"' not in text)
    assert not unused, f"solutions no lab uses: {unused}"


def _exercise_names(tree):
    """Names defined under an ``@labs.exercise(...)`` decorator."""
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and any(isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "exercise"
                    for d in node.decorator_list)}


def _assigned_names(tree):
    return {t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for t in ast.walk(target) if isinstance(t, ast.Name)}


@pytest.mark.parametrize("path", lab_notebooks(), ids=lambda p: p.stem)
def test_no_cell_rebinds_the_learners_function(path):
    """A fallback to the reference goes to a new name: re-running the check cell after a fix
    must check the learner's code, not the reference that stood in for it."""
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    trees = [ast.parse("\n".join(line for line in src.splitlines()
                                  if not line.lstrip().startswith(("%", "!"))))
             for src in cells]
    exercises = set().union(*(_exercise_names(t) for t in trees))
    rebound = exercises & set().union(*(_assigned_names(t) for t in trees))
    assert not rebound, f"{path.name} assigns to the learner's own {sorted(rebound)}"


def test_a_learners_copy_of_a_lab_is_not_a_lab(tmp_path):
    for name in ("07_bigger", "07_bigger-Copy1", "demo_dashboard", "10_production"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    assert [p.stem for p in lab_notebooks(tmp_path)] == ["07_bigger", "10_production"]


def test_yours_or_reference_keeps_yours_when_it_passes_and_names_the_fallback(capsys):
    def predict_peak(n_params, activation_bytes, optimizer):
        return 0
    passed = labs.CheckResult("peak").ok("right")
    failed = labs.CheckResult("peak").wrong("too small")
    assert labs.yours_or_reference(passed, "01_predict_peak", predict_peak) is predict_peak
    assert capsys.readouterr().out == ""
    reference = labs.yours_or_reference(failed, "01_predict_peak", predict_peak)
    assert reference is not predict_peak and reference.__name__ == "predict_peak"
    assert reference(1, 0, "adam") > 0
    said = capsys.readouterr().out
    assert "reference solution of '01_predict_peak'" in said
    assert "run its check cell, this cell and the cells below again" in said
    pair = labs.yours_or_reference(failed, "03_ddp_hooks", _named("average_gradient"),
                                   _named("wrap_ddp"))
    assert [f.__name__ for f in pair] == ["average_gradient", "wrap_ddp"]
    with pytest.raises(ValueError, match="defines no 'nothing_like_it'"):
        labs.yours_or_reference(failed, "01_predict_peak", _named("nothing_like_it"))


def _named(name):
    def f():
        pass
    f.__name__ = name
    return f


@pytest.mark.slow
def test_render_writes_an_executed_html_copy(tmp_path):
    env = {**os.environ, "CI": ""}
    exe = Path(sys.executable).parent / "fsdp-mini"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fsdp_mini.jobs.cli"]
    proc = subprocess.run(cmd + ["render-labs", "--ci", "--out", str(tmp_path), "00"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (tmp_path / "00_setup.html").read_text()
    assert "lab config:" in html  # an output of the run, not only the source
    # (a cell ending in an error would have stopped the run: the command exits 0 only if none did)


@pytest.mark.parametrize("path", lab_notebooks(), ids=lambda p: p.stem)
def test_the_times_a_lab_states_are_the_readmes(path):
    """An instructor plans with the READMEs' tables: they must say what the lab itself says."""
    first = nbformat.read(path, as_version=4).cells[0].source
    teach, practise = re.search(r"(\d+) min[^\n]*?(\d+) min", first).groups()
    for readme in (ROOT / "README.md", LABS_DIR / "README.md"):
        row = next(line for line in readme.read_text().splitlines()
                   if line.startswith(f"| `{path.stem}"))
        assert f"{teach} + {practise} min" in row, (readme.name, row)
