"""The README's quick start is what CI runs: the same commands, character for character."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _quick_start_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", readme, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines()
            if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_commands():
    commands = _quick_start_commands()
    assert len(commands) == 2, commands  # install + main job, tests
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci, f"{command!r} is in the README but not in .ci/run"


def test_install_uses_the_cpu_torch_and_the_dev_extra():
    install = _quick_start_commands()[0]
    assert 'pip install "torch==2.13.0" -e ".[dev]"' in install
