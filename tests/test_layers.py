"""The package's layout, as fsdp_mini/__init__.py draws it. Imports point from the plumbing (the
launcher, telemetry, plots, widgets, jobs, the lab kit) to the algorithm, never back; no strategy
imports another; nothing but the command line imports the lab kit; a lab imports only the kit's
common/ and the engine; nothing imports in a circle; and the map names what the folder holds.

Each rule is a function of the import edges; each is also run on a copy of the package with one
import that breaks it, and must then fail (the tests at the end)."""

import ast
import re
import shutil
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fsdp_mini"
PLUMBING = ("models", "launcher", "telemetry", "plots", "debug", "widgets", "labs",  # bottom up
            "jobs")
STRATEGY_FAMILIES = ("ddp", "zero", "fsdp")   # fsdp/ is one family: algorithm, group, hsdp, ...
COMMAND_LINE = "jobs.cli"                     # the top of the house: `fsdp-mini render-labs`
# The warm-start helper imports, ahead of the fork, what the ranks will use; it calls none of it.
PRELOADS = {("launcher.zygote", "telemetry")}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(package: Path = PACKAGE) -> set[tuple[str, str]]:
    """(importer, imported) between modules of the package ('' is the package itself)."""
    found, edges = modules(package), set()
    for name, path in found.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name.removeprefix("fsdp_mini").lstrip(".") for a in node.names
                           if a.name.split(".")[0] == "fsdp_mini"]
                names = []
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".") if pkg else []
                base = base[:len(base) - node.level + 1]
                targets = [".".join(base + ([node.module] if node.module else []))]
                names = [a.name for a in node.names]
            elif (isinstance(node, ast.ImportFrom) and node.module
                  and node.module.split(".")[0] == "fsdp_mini"):
                targets = [node.module.removeprefix("fsdp_mini").lstrip(".")]
                names = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                for candidate in [target] + [f"{target}.{n}".lstrip(".") for n in names]:
                    if candidate in found and candidate != name:
                        edges.add((name, candidate))
    return edges


def _top(name: str) -> str:
    return name.split(".")[0]


def _is_package_face(name: str, package: Path) -> bool:
    """A folder's __init__ that only hands its modules' names on: its edges are not a layer."""
    return name == "" or (package / name.replace(".", "/") / "__init__.py").exists()


# -- the rules: each returns the edges that break it ---------------------------------------------

def algorithm_importing_plumbing(edges) -> list:
    return sorted((a, b) for a, b in edges
                  if a and _top(a) not in PLUMBING and _top(b) in PLUMBING)


def strategies_importing_one_another(edges) -> list:
    return sorted((a, b) for a, b in edges if _top(a) in STRATEGY_FAMILIES
                  and _top(b) in STRATEGY_FAMILIES and _top(a) != _top(b))


def lab_kit_imported_from_outside(edges) -> list:
    return sorted((a, b) for a, b in edges
                  if a and _top(a) != "labs" and _top(b) == "labs" and a != COMMAND_LINE)


def labs_importing_other_labs(edges) -> list:
    """labs.labNN.* may import labs.common.* and the engine; labs.common.* imports no lab."""
    def lab(name):
        parts = name.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "labs" and parts[1] != "common" else None
    return sorted((a, b) for a, b in edges
                  if a.startswith("labs.") and lab(b) and lab(a) != lab(b))


def plumbing_importing_upward(edges) -> list:
    """The plumbing is in floors too (PLUMBING, bottom up): launcher and telemetry side by side
    under plots and the debug tools (side by side), widgets, the lab kit and the jobs, as each
    folder's docstring says."""
    floor = {"models": 0, "launcher": 1, "telemetry": 1, "plots": 2, "debug": 2, "widgets": 3,
             "labs": 4, "jobs": 5}
    return sorted((a, b) for a, b in edges - PRELOADS if a and _top(a) in floor
                  and _top(b) in floor and _top(a) != _top(b) and floor[_top(a)] <= floor[_top(b)])


def cycles(edges, package: Path = PACKAGE) -> list:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        if not _is_package_face(a, package):
            graph.setdefault(a, set()).add(b)
    state, found = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


RULES = [algorithm_importing_plumbing, strategies_importing_one_another,
         lab_kit_imported_from_outside, labs_importing_other_labs, plumbing_importing_upward,
         cycles]


# -- the house as it is ---------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_house_keeps_the_rule(rule):
    assert not rule(imports()), f"{rule.__name__}: {rule(imports())}"


def test_the_finder_sees_the_imports_it_should():
    """The rules are only as good as the import finder: it must see these edges."""
    edges = imports()
    assert ("fsdp.algorithm", "comm.collectives") in edges and ("jobs.compare", "api") in edges
    assert ("telemetry.recorder", "comm.ledger") in edges and ("api", "registry") in edges
    assert ("fsdp.hsdp", "fsdp.algorithm") in edges and ("jobs.cli", "jobs.render_labs") in edges
    assert ("labs.lab11.fit", "labs.common.configurations") in edges


def test_every_folder_says_what_it_holds_and_what_it_may_import():
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent.relative_to(PACKAGE.parent)
        doc = " ".join((ast.get_docstring(ast.parse(init.read_text())) or "").split())
        assert len(doc.split()) >= 12, f"{folder}/__init__.py: no docstring saying what it holds"
        assert "May import" in doc or init.parent == PACKAGE, (
            f"{folder}/__init__.py: say what the folder may import ('May import: ...')")


def test_the_map_names_every_room_and_no_room_that_is_gone():
    """fsdp_mini/__init__.py's map names each file and folder of the package, and only those."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    rooms = {p.stem if p.is_file() else p.name + "/" for p in PACKAGE.iterdir()
             if p.name != "__init__.py" and not p.name.startswith(("_", "."))
             and (p.suffix == ".py" or (p / "__init__.py").exists())}
    named = set(re.findall(r"^ {4}(\w[\w, /.]*?)\s{2,}", doc, re.M))
    named = {n.strip() for group in named for n in group.split(",")}
    named = {n.removesuffix(".py") for n in named}
    assert rooms - named == set(), f"rooms the map does not name: {sorted(rooms - named)}"
    assert named - rooms == set(), f"the map names rooms that are gone: {sorted(named - rooms)}"
    first = re.search(r"Start with ``([\w/.]+)``", doc)
    assert first and (PACKAGE / first.group(1)).is_file(), "the map says which file to read first"


# -- each rule fails when it is broken -------------------------------------------------------------

BREAKS = {
    "algorithm_importing_plumbing": ("fsdp/algorithm.py", "from ..telemetry import events"),
    "strategies_importing_one_another": ("zero.py", "from .fsdp import group"),
    "lab_kit_imported_from_outside": ("widgets/planner.py", "from ..labs.lab07 import checks"),
    "labs_importing_other_labs": ("labs/lab06/checks.py", "from ..lab05 import scaffold"),
    "plumbing_importing_upward": ("telemetry/recorder.py", "from ..launcher import core"),
    "cycles": ("comm/ledger.py", "from . import collectives"),
}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_rule_fails_on_a_house_that_breaks_it(rule, tmp_path):
    copy = tmp_path / "fsdp_mini"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path, line = BREAKS[rule.__name__]
    (copy / path).write_text((copy / path).read_text() + f"\n{line}\n")
    edges = imports(copy)
    broken = rule(edges, copy) if rule is cycles else rule(edges)
    assert broken, f"{rule.__name__} did not see `{line}` added to {path}"
