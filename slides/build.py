"""Build the workshop decks: self-contained reveal.js HTML, a notebook for RISE, and a PDF.

    python slides/build.py                          # laptop-size run of the kit, then every deck
    python slides/build.py --compare-json gpu.json  # the main job's numbers from a GPU box
    python slides/build.py --size ci --no-pdf       # small and quick (what the tests run)

Writes ``build/slides/<deck>.html`` (open it in a browser: nothing is fetched, press S for the
speaker notes), ``<deck>.ipynb`` (open it in JupyterLab and present it with RISE, running cells
on stage) and ``<deck>.pdf`` where Chromium is installed. The figures and every number on the
slides come from the run the build makes (``slides/kit_run.py``); the decks and their agendas
are ``slides/decks.toml``; the slides are ``slides/sections/*.md``.

reveal.js comes from npm (``slides/package.json``): the first build runs ``npm ci`` in
``slides/`` when ``slides/node_modules`` is missing; later builds need no network.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # Note: kit_run and deck sit beside this file

import deck  # noqa: E402
import kit_run  # noqa: E402
import nbformat  # noqa: E402

REVEAL = HERE / "node_modules" / "reveal.js"


def decks() -> dict:
    with open(HERE / "decks.toml", "rb") as f:
        return tomllib.load(f)


def agenda(spec: dict) -> str:
    """The deck's agenda as a Markdown table: start, section, lab, minutes (talk + hands-on)."""
    rows, clock = ["| start | | lab | talk | hands-on |", "|---|---|---|---|---|"], 0
    for part in spec["sections"]:
        talk, hands_on = part.get("minutes", 0), part.get("hands_on", 0)
        name = part.get("pause") or part["title"]
        rows.append(f"| {clock // 60}:{clock % 60:02d} | {name} | {part.get('lab', '')} | "
                    f"{talk} min | {f'{hands_on} min' if hands_on else ''} |")
        clock += talk + hands_on
    rows.append(f"| {clock // 60}:{clock % 60:02d} | end | | | |")
    return "\n".join(rows)


def ensure_reveal() -> Path:
    if not (REVEAL / "dist" / "reveal.js").is_file():
        print("slides: reveal.js missing, installing it from npm (once): npm ci", flush=True)
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True)
    return REVEAL


def build(out: Path, size: str = "laptop", compare_json: str | None = None,
          only: list[str] | None = None, make_pdf: bool = True):
    """Measure once, then write every deck; returns ({deck: {"slides": n, "files": [...]}},
    the measurement)."""
    specs = {k: v for k, v in decks().items() if not only or k in only}
    if not specs:
        raise ValueError(f"no deck named {only}; the decks: {', '.join(decks())}")
    # Note: the report is read and checked first, before npm or a run: a bad file costs nothing
    report = kit_run.read_report(compare_json) if compare_json is not None else None
    reveal = ensure_reveal()
    started = time.perf_counter()
    measured = kit_run.measure(size, compare_json, report)
    print(f"slides: measured in {time.perf_counter() - started:.0f} s "
          f"({measured.numbers['main_job.source']})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, spec in specs.items():
        numbers = {**measured.numbers, "deck.title": spec["title"], "deck.agenda": agenda(spec)}
        slides = [s for part in spec["sections"] if "file" in part
                  for s in deck.parse(HERE / "sections" / part["file"], numbers)]
        files = [_write(out / f"{name}.html", deck.reveal_html(
            spec["title"], slides, measured.figures, measured.sources, reveal))]
        files.append(_write(out / f"{name}.ipynb", nbformat.writes(
            deck.rise_notebook(spec["title"], slides, measured.figures))))
        if make_pdf and deck.pdf(files[0], out / f"{name}.pdf"):
            files.append(out / f"{name}.pdf")
        written[name] = {"slides": len(slides), "files": files}
        print(f"slides: {name}: {len(slides)} slides -> {', '.join(f.name for f in files)}",
              flush=True)
    return written, measured


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # Note: a deck on disk is whole or absent
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python slides/build.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/slides", help="folder for the decks")
    parser.add_argument("--size", choices=tuple(kit_run.SIZES), default="laptop",
                        help="the run behind the figures: laptop (4 ranks, default GPT) or ci")
    parser.add_argument("--compare-json", metavar="PATH",
                        help="take the main job's numbers from this `fsdp-mini compare --json` "
                             "file (e.g. recorded on a GPU box) instead of running it; a file "
                             "that is not such a report is refused (one line, exit status 2)")
    parser.add_argument("--no-pdf", action="store_true", help="skip the PDF")
    parser.add_argument("decks", nargs="*", help="only these decks (default: all)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        build(Path(args.out), args.size, args.compare_json, args.decks, not args.no_pdf)
    except (deck.DeckError, ValueError, OSError) as err:
        print(f"slides: error: {err}", file=sys.stderr)
        return 2
    print(f"slides: built in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
