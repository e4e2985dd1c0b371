"""The instructor guide (slides/INSTRUCTOR.md) against the files it plans the day from.

- its agendas are slides/decks.toml's, section by section: title, start, talk and hands-on
  minutes, lab; every lab timing it quotes is the one in that lab's first cell;
- every cost figure carries the date it was read and its source (an address);
- every command it tells the instructor to run names files that exist in the repository, and
  the kit's commands and options it uses exist;
- its memory table is the planner's, recomputed; its solution names are files in labs/solutions.

Fast, no network: it reads text files and runs the planner's formulas (no rank is launched).
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "slides" / "INSTRUCTOR.md"
LABS = ROOT / "labs"
NONE = "—"  # an empty cell in the guide's tables

TIMING_IN_LAB = re.compile(r"(\d+)\s*min[^,.\n]*?teaching[^,]*?,\s*(\d+)\s*min", re.I | re.S)
TIMING_IN_GUIDE = re.compile(r"^(\d+) \+ (\d+) min$")
LAB_CELL = re.compile(r"^`(\d\d_[a-z0-9_]+)`$")
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")
ADDRESS = re.compile(r"https?://[^\s)|`]+")
MONEY = re.compile(r"\$\s?\d")
# A path in the repository, as a command names it (not the tail of a longer path: build/labs,
# ~/work/..., /opt/fsdp_mini/... are outputs or paths inside the container).
REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:docker|benchmarks|slides|labs|tests|fsdp_mini)/[\w./-]*)")
COMMANDS = ("docker", "bash", "python", "sky", "ssh", "scp", "fsdp-mini", "pip", "jupyter")
# The files the guide's checklist is built on: each must be named by a command in it.
NAMED_BY_A_COMMAND = ("docker/Dockerfile", "docker/Dockerfile.cpu", "docker/compose.yaml",
                      "docker/sky.yaml", "benchmarks/gpu_check.sh", "slides/build.py")


@pytest.fixture(scope="module")
def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def decks() -> dict:
    with open(ROOT / "slides" / "decks.toml", "rb") as f:
        return tomllib.load(f)


def lab_timing(lab: str) -> tuple[int, int]:
    """(teaching, exercises) minutes, as the lab's first cell states them."""
    cells = json.loads((LABS / f"{lab}.ipynb").read_text(encoding="utf-8"))["cells"]
    first = "".join(cells[0]["source"])
    found = TIMING_IN_LAB.search(first)
    assert found, f"labs/{lab}.ipynb: no 'N min teaching, M min exercises' in its first cell"
    return int(found[1]), int(found[2])


def lab_names() -> list[str]:
    return sorted(p.stem for p in LABS.glob("[0-9][0-9]_*.ipynb"))


def table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table after ``<!-- marker -->``, without
    its header and separator lines."""
    start = text.index(f"<!-- {marker} -->")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[2:]


def all_table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]


def clock(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def text_between(text: str, marker: str) -> str:
    """From the marker to the next heading: the table and the paragraphs about it."""
    start = text.index(f"<!-- {marker} -->")
    end = text.find("\n#", start)
    return text[start:end if end > 0 else None]


# ------------------------------------------------------------------------------- the agendas
@pytest.mark.parametrize("deck", list(decks()))
def test_each_agenda_is_the_decks_own(guide, deck):
    sections = decks()[deck]["sections"]
    rows = table_after(guide, f"agenda: {deck}")
    names = [part.get("pause") or part["title"] for part in sections]
    assert [row[1] for row in rows] == names, f"{deck}: the guide's sections differ from decks.toml"
    at = talk = hands = 0
    for row, part in zip(rows, sections):
        start, name, talk_cell, hands_cell, lab_cell, timing_cell = row[:6]
        minutes, hands_on, lab = part.get("minutes", 0), part.get("hands_on", 0), part.get("lab")
        where = f"{deck}, {name!r}"
        assert start == clock(at), f"{where}: starts at {start} in the guide, {clock(at)} in the deck"
        assert talk_cell == f"{minutes} min", f"{where}: talk {talk_cell!r}, decks.toml {minutes}"
        assert hands_cell == (f"{hands_on} min" if hands_on else NONE), \
            f"{where}: hands-on {hands_cell!r}, decks.toml {hands_on}"
        assert lab_cell == (f"`{lab}`" if lab else NONE), f"{where}: lab {lab_cell!r}, decks.toml {lab}"
        if lab:
            teaching, exercises = lab_timing(lab)
            assert timing_cell == f"{teaching} + {exercises} min", \
                f"{where}: the guide quotes {timing_cell!r}, labs/{lab}.ipynb says " \
                f"{teaching} + {exercises} min"
        else:
            assert timing_cell == NONE
        at += minutes + hands_on
        talk += 0 if "pause" in part else minutes
        hands += hands_on
    about = text_between(guide, f"agenda: {deck}")
    for said in (f"ends at {clock(at)}", f"{talk} min of talk", f"{hands} min hands-on"):
        assert said in about, f"{deck}: the guide should say {said!r} after its agenda"


def test_every_lab_timing_quoted_is_the_labs_own(guide):
    quoted = 0
    for row in all_table_rows(guide):
        labs = [m[1] for c in row if (m := LAB_CELL.match(c)) and (LABS / f"{m[1]}.ipynb").exists()]
        timings = [m for c in row if (m := TIMING_IN_GUIDE.match(c))]
        for lab in labs:
            for m in timings:
                assert (int(m[1]), int(m[2])) == lab_timing(lab), \
                    f"the guide quotes {m[0]!r} for {lab}; its first cell says {lab_timing(lab)}"
                quoted += 1
    for lab_number, teaching, exercises in re.findall(r"[Ll]ab (\d\d)'s own timing is (\d+) \+ (\d+) min",
                                                      guide):
        lab = next(n for n in lab_names() if n.startswith(lab_number))
        assert (int(teaching), int(exercises)) == lab_timing(lab), f"{lab}: quoted in prose"
        quoted += 1
    assert quoted >= len(lab_names())


def test_the_labs_table_lists_every_lab(guide):
    listed = {m[1] for row in all_table_rows(guide) for c in row if (m := LAB_CELL.match(c))}
    missing = [lab for lab in lab_names() if lab not in listed]
    assert not missing, f"labs the guide does not plan: {missing}"


def test_the_gpu_needs_it_states_are_the_notebooks(guide):
    """The guide's GPU counts come from these lines; if they change, the guide must too."""
    def code(lab):
        cells = json.loads((LABS / f"{lab}.ipynb").read_text(encoding="utf-8"))["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "M = 3 if N != 3 else 2" in code("08_checkpoints")
    assert "HN = max(N, 4)" in code("10_production") and "S = HN // 2" in code("10_production")
    assert "P = min(N, 4)" in code("09_debugging")
    config = (ROOT / "fsdp_mini" / "labs" / "common" / "config.py").read_text()
    assert 'LabConfig(gpus, "nccl", "default", 8, 4 * gpus' in config
    assert "resumes at M = 3" in guide and "max(N, 4)" in guide and "min(N, 4)" in guide


# ---------------------------------------------------------------------------------- the costs
def test_every_cost_figure_has_a_date_and_a_source(guide):
    lines = [line for line in guide.splitlines() if MONEY.search(line)]
    assert len(lines) >= 10
    for line in lines:
        dates = DATE.findall(line)
        assert dates, f"a cost figure without the date it was read: {line[:100]}"
        for d in dates:
            datetime.date.fromisoformat(d)
        assert ADDRESS.search(line), f"a cost figure without its source's address: {line[:100]}"


def test_the_cost_table_has_a_date_and_a_source_on_every_row(guide):
    rows = table_after(guide, "costs")
    assert len(rows) >= 10
    for row in rows:
        assert DATE.fullmatch(row[-2]), row
        assert ADDRESS.match(row[-1]), row


def test_the_guide_says_prices_change_and_the_kit_holds_none(guide):
    assert "Prices change" in guide and "the kit builds in no price" in guide


# ------------------------------------------------------------------------------- the commands
def commands(text: str) -> list[str]:
    """The lines of the guide's shell blocks, and inline code that starts with a command."""
    found = []
    for block in re.findall(r"^ *```(?:bash|sh|console)\n(.*?)^ *```", text, re.S | re.M):
        found += [line.strip() for line in block.splitlines() if line.strip()]
    for span in re.findall(r"`([^`\n]+)`", text):
        if span.split()[0] in COMMANDS:
            found.append(span)
    return found


def test_every_command_names_files_that_exist(guide):
    named = set()
    for command in commands(guide):
        for path in REPO_PATH.findall(command):
            path = path.rstrip("/.")
            assert (ROOT / path).exists(), f"the guide runs {command!r}: {path} is not in the repository"
            named.add(path)
    missing = [p for p in NAMED_BY_A_COMMAND if p not in named]
    assert not missing, f"no command of the guide names {missing}"


def test_the_kits_commands_and_options_exist(guide):
    cli = "\n".join(p.read_text() for p in (ROOT / "fsdp_mini" / "jobs").glob("*.py"))
    subcommands = set(re.findall(r'add_parser\(\s*"([\w-]+)"', cli))
    build = (ROOT / "slides" / "build.py").read_text()
    used = 0
    for command in commands(guide):
        for sub, rest in re.findall(r"fsdp-mini ([\w-]+)((?: [^;|&'`]*)?)", command):
            assert sub in subcommands, f"{command!r}: fsdp-mini has no command {sub!r}"
            for flag in re.findall(r"(?<!\S)(--[\w-]+)", rest):
                assert f'"{flag}"' in cli, f"{command!r}: fsdp-mini {sub} has no option {flag}"
            used += 1
        for rest in re.findall(r"python slides/build\.py((?: [^;|&'`]*)?)", command):
            for flag in re.findall(r"(?<!\S)(--[\w-]+)", rest):
                assert f'"{flag}"' in build, f"{command!r}: slides/build.py has no option {flag}"
    assert used >= 3


def test_the_container_it_names_is_the_one_sky_yaml_runs(guide):
    sky = (ROOT / "docker" / "sky.yaml").read_text()
    for what in ("--name fsdp-mini-lab", "fsdp-mini:gpu", "--gpus all", "--ipc=host",
                 "--ulimit memlock=-1", "fsdp-mini-work:/home/learner/work"):
        assert what in sky, f"docker/sky.yaml no longer has {what!r}"
    assert "docker exec fsdp-mini-lab" in guide and "fsdp-mini:gpu" in guide


# ------------------------------------------------------------------- figures and solutions
def test_the_memory_table_is_the_planners(guide):
    import fsdp_mini
    from fsdp_mini.models import GPTConfig
    from fsdp_mini.planner.shapes import ModelShape

    shape = ModelShape.from_gpt(GPTConfig())
    strategies = ("ddp", "zero1", "zero2", "fsdp")
    rows = table_after(guide, "planner: the default GPT, fp32, micro-batch 4")
    assert [r[0] for r in rows] == ["2", "4", "8"]
    for row in rows:
        plan = fsdp_mini.plan(model=shape, gpus=int(row[0]), precision="fp32", micro_batch=4,
                              strategies=strategies)
        want = [f"{plan.strategies[s].peak_bytes / 1e6:.2f} MB" for s in strategies]
        assert row[1:5] == want, f"{row[0]} GPUs: the guide says {row[1:5]}, the planner {want}"
    lab08 = fsdp_mini.plan(model=shape, gpus=3, precision="fp32", micro_batch=32,
                           strategies=("ddp", "fsdp"))
    for s in ("ddp", "fsdp"):
        assert f"{lab08.strategies[s].peak_bytes / 1e6:.2f} MB" in guide, f"lab 08's {s} peak"


def test_the_solutions_it_names_exist_and_it_names_them_all(guide):
    solutions = ROOT / "labs" / "solutions"
    named = set(re.findall(r'show_solution\("([\w]+)"\)', guide))
    named |= set(re.findall(r"solutions/(\d\d_\w+)\.py", guide))
    named |= set(re.findall(r"`(\d\d_\w+)\.py`", guide))
    for name in named:
        assert (solutions / f"{name}.py").is_file(), f"the guide names a solution {name!r} that is not there"
    missing = sorted(p.stem for p in solutions.glob("*.py") if p.stem not in named)
    assert not missing, f"solutions the guide does not list: {missing}"
