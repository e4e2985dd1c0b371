"""The package's layering, as fsdp_mini/__init__.py draws it: imports point from the plumbing
(folders) to the algorithm (the top of the package), never back, never sideways between
strategies, and never in a circle."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fsdp_mini"
PLUMBING = ("launcher", "telemetry", "widgets", "jobs", "labs", "plots", "models")
STRATEGIES = {"ddp", "zero", "fsdp"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports() -> set[tuple[str, str]]:
    """(importer, imported) between modules of the package ('' is the package itself)."""
    modules, edges = _modules(), set()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("fsdp_mini"):
                target = node.module.removeprefix("fsdp_mini").lstrip(".")
            else:
                continue
            for candidate in [target] + [f"{target}.{a.name}".lstrip(".") for a in node.names]:
                if candidate in modules and candidate != name:
                    edges.add((name, candidate))
    return edges


def _layer(name: str) -> str:
    return "plumbing" if name.split(".")[0] in PLUMBING else "algorithm"


def test_the_algorithm_never_imports_the_plumbing():
    bad = sorted((a, b) for a, b in _imports()
                 if a and _layer(a) == "algorithm" and _layer(b) == "plumbing")
    assert not bad, f"algorithm modules importing plumbing: {bad}"


def test_strategies_do_not_import_one_another():
    bad = sorted((a, b) for a, b in _imports() if a in STRATEGIES and b in STRATEGIES)
    assert not bad, bad


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for a, b in _imports():
        if a:  # the package's __init__ re-exports everything: not a layer
            graph.setdefault(a, set()).add(b)
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in list(graph):
        if node not in state:
            visit(node, [node])


def test_the_finder_sees_the_imports_it_should():
    """The checks above are only as good as the import finder: it must see these edges."""
    edges = _imports()
    assert ("fsdp", "comm") in edges and ("jobs.compare", "api") in edges
    assert ("telemetry.recorder", "ledger") in edges and ("api", "registry") in edges
