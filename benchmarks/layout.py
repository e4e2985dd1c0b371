"""The package's layout in figures: entries in fsdp_mini/, files and lines per folder, the largest
file, the lab kit's lines. For the working tree, or for any commit of the repository.

    python benchmarks/layout.py               # the working tree
    python benchmarks/layout.py --rev bf996da # as it was at a commit (read with git, nothing checked out)

Lines are physical lines of the .py files (blank lines, comments and docstrings included).
"""

from __future__ import annotations

import argparse
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_files(rev: str | None) -> dict[str, int]:
    """{path under the repository: lines} of every .py file below fsdp_mini/."""
    if rev is None:
        return {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
                for p in sorted((ROOT / "fsdp_mini").rglob("*.py"))
                if "__pycache__" not in p.parts}
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "fsdp_mini"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return {n: len(subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, capture_output=True,
                                  text=True, check=True).stdout.splitlines())
            for n in names if n.endswith(".py")}


def folder_of(path: str) -> str:
    """The room a file is in: fsdp_mini/ for the top, else its folder (labs/labNN as one)."""
    parts = Path(path).parts[1:-1]
    return "fsdp_mini/" + "/".join(parts[:2]) + ("/" if parts else "")


def report(files: dict[str, int]) -> str:
    top = {Path(p).parts[1] for p in files}
    entries = len({t.removesuffix(".py") if t.endswith(".py") else t + "/" for t in top})
    lines, count = Counter(), Counter()
    for path, n in files.items():
        lines[folder_of(path)] += n
        count[folder_of(path)] += 1
    largest = max(files, key=files.get)
    labs = sum(n for p, n in files.items() if p.startswith("fsdp_mini/labs/"))
    labs_files = sum(1 for p in files if p.startswith("fsdp_mini/labs/"))
    out = [f"entries in fsdp_mini/: {entries} ({sum(1 for t in top if t.endswith('.py'))} files, "
           f"{sum(1 for t in top if not t.endswith('.py'))} folders)",
           f"all: {len(files)} files, {sum(files.values())} lines",
           f"largest file: {largest} ({files[largest]} lines)",
           f"lab kit (fsdp_mini/labs/): {labs_files} files, {labs} lines",
           "", f"{'folder':34s} {'files':>5s} {'lines':>6s}"]
    out += [f"{folder:34s} {count[folder]:5d} {lines[folder]:6d}" for folder in sorted(lines)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default=None, help="a commit (default: the working tree)")
    args = parser.parse_args()
    print(report(python_files(args.rev)))


if __name__ == "__main__":
    main()
