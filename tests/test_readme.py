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


def test_the_japanese_overview_is_linked_and_gives_the_same_two_commands():
    readme, ja = (ROOT / "README.md").read_text(), (ROOT / "README.ja.md").read_text()
    assert "(README.ja.md)" in readme and "(README.md)" in ja
    block = re.search(r"## クイックスタート.*?```bash\n(.*?)```", ja, re.S).group(1)
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == _quick_start_commands()
    labs = sorted(p.stem for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
    missing = [name for name in labs if f"`{name}`" not in ja]
    assert not missing, f"labs the Japanese overview does not list: {missing}"
    for notebook in ("labs/project_lead.ja.ipynb", "labs/project_lead.ipynb"):
        assert notebook in ja and (ROOT / notebook).is_file()
    assert all(word in ja for word in ("シャーディング", "通信オーバーヘッド", "DDP", "ZeRO"))


def test_the_readmes_are_a_front_door_of_at_most_200_lines():
    """The README says what the kit is, how to run it and where the rest is: the course site."""
    for name in ("README.md", "README.ja.md"):
        lines = (ROOT / name).read_text().splitlines()
        assert len(lines) <= 200, f"{name} has {len(lines)} lines; move text to a page of docs/"


def test_the_readmes_link_to_files_that_exist_and_build_the_site_alike():
    for name in ("README.md", "README.ja.md"):
        text = (ROOT / name).read_text()
        links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        local = [link for link in links if not re.match(r"[a-z]+:", link)]
        assert any(link.startswith("docs/") for link in local), name
        missing = [link for link in local if not (ROOT / link).exists()]
        assert not missing, f"{name} links to files that do not exist: {missing}"
    sites = [re.search(r"## (?:The course site|コースサイト).*?```bash\n(.*?)```", (ROOT / n).read_text(),
                       re.S).group(1) for n in ("README.md", "README.ja.md")]
    assert sites[0] == sites[1] and "python -m mkdocs build -d build/site" in sites[0]
