"""environment.yml (conda) makes the environment pyproject.toml describes: the same torch range,
the kit with its dev extra (so every dependency of pyproject comes through it), nothing else,
and a Python pyproject accepts."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_environment_yml_names_the_dependencies_of_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    python = next(d for d in conda if d.startswith("python"))
    minimum = tuple(int(x) for x in re.search(r">=\s*([\d.]+)", project["requires-python"])
                    .group(1).split("."))
    assert tuple(int(x) for x in python.split("=")[1].split(".")) >= minimum
    torch_pyproject = next(d for d in project["dependencies"] if d.startswith("torch"))
    packages = [p for p in pip if not p.startswith("--")]
    assert packages == [torch_pyproject, "-e .[dev]"], packages
    extras = project["optional-dependencies"]
    assert "fsdp_mini[labs]" in extras["dev"]  # dev includes what the notebooks need
