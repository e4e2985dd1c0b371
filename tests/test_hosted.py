"""Lab 00's first code cell, for Colab and Kaggle: there it clones the kit from pyproject's
Repository and installs the `labs` extra (never torch: the host's CUDA build stays), then moves to
the labs' folder; anywhere else it changes nothing and says what it would run."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
HOST_VARIABLES = ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "FSDP_MINI_REPO")


def hosted_cell() -> str:
    cells = json.loads((ROOT / "labs" / "00_setup.ipynb").read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "COLAB_RELEASE_TAG" in "".join(code[0]["source"]), "not lab 00's first code cell"
    return "".join(code[0]["source"])


def run_cell(monkeypatch, tmp_path, env: dict, clone_makes_folder=True):
    for name in HOST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    calls = []

    def fake_run(command, check=False):
        calls.append(command)
        if command[:2] == ["git", "clone"] and clone_makes_folder:
            (tmp_path / command[-1] / "labs").mkdir(parents=True)
        return subprocess.CompletedProcess(command, 0)
    monkeypatch.setattr(subprocess, "run", fake_run)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(hosted_cell(), "lab 00, cell 1", "exec"), {})
    cwd = os.getcwd()
    return out.getvalue(), calls, cwd


def repository() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def test_elsewhere_it_does_nothing_and_says_what_it_would_run(monkeypatch, tmp_path):
    out, calls, cwd = run_cell(monkeypatch, tmp_path, {})
    assert calls == [] and cwd == str(tmp_path) and list(tmp_path.iterdir()) == []
    assert out.startswith("not on Colab or Kaggle: nothing to install here; there this cell runs: "
                          f"git clone --depth 1 {repository()} fsdp-mini && ")
    assert "pip install -q -e ./fsdp-mini[labs]" in out


@pytest.mark.parametrize("host, variable", [("Colab", "COLAB_RELEASE_TAG"),
                                            ("Kaggle", "KAGGLE_KERNEL_RUN_TYPE")])
def test_on_colab_and_kaggle_it_installs_the_kit_and_keeps_torch(monkeypatch, tmp_path, host,
                                                                  variable):
    out, calls, cwd = run_cell(monkeypatch, tmp_path, {variable: "1"})
    assert calls[0] == ["git", "clone", "--depth", "1", repository(), "fsdp-mini"]
    assert calls[1][1:] == ["-m", "pip", "install", "-q", "-e", "./fsdp-mini[labs]"]
    assert not any("torch" in part for command in calls for part in command)
    assert cwd == str(tmp_path / "fsdp-mini" / "labs")
    assert f"{host}: the kit is installed; the labs are in {cwd}" in out
    labs_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["labs"]
    assert not any(dep.startswith(("torch", "ipykernel")) for dep in labs_extra)


def test_run_again_it_does_not_clone_twice(monkeypatch, tmp_path):
    (tmp_path / "fsdp-mini" / "labs").mkdir(parents=True)
    _, calls, _ = run_cell(monkeypatch, tmp_path, {"COLAB_RELEASE_TAG": "x"}, False)
    assert [c[:2] for c in calls] == [[sys.executable, "-m"]]
