"""Build the workshop decks: self-contained reveal.js HTML, a notebook for RISE, and a PDF.

    python slides/build.py                          # laptop-size run of the kit, then every deck
    python slides/build.py --compare-json gpu.json  # the main job's numbers from a GPU box
    python slides/build.py --size ci --no-pdf       # small and quick (what the tests run)

Writes ``build/slides/<deck>.html`` (open it in a browser: nothing is fetched, press S for the
speaker notes and each slide's timing), ``<deck>.ipynb`` (open it in JupyterLab and present it
with RISE, running cells on stage) and ``<deck>.pdf``, printed by Chromium: the system's
(Debian's ``chromium`` on the PATH) or Playwright's own; where there is none, the build says so
loudly and names what to install. The figures and every number on the slides come from the
run the build makes (``slides/kit_run.py``); the decks, their agendas, "your turn" and break
slides and timings are ``slides/decks.toml``; the slides are ``slides/sections/*.md``. A deck
whose plan starts a lab's exercises before the labs they build on is refused.

reveal.js comes from npm (``slides/package.json``): the first build runs ``npm ci`` in
``slides/`` when ``slides/node_modules`` is missing; later builds need no network.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABS = HERE.parent / "labs"
sys.path.insert(0, str(HERE))  # Note: kit_run and deck sit beside this file

import deck  # noqa: E402
import kit_run  # noqa: E402
import nbformat  # noqa: E402

REVEAL = HERE / "node_modules" / "reveal.js"
AGENDA = "AGENDA-TABLE-HERE"   # what {{ deck.agenda }} becomes until the agenda's pages go in
AGENDA_ROWS = 12               # rows of the agenda on one slide (it reads at TABLE_PX then)
# The lab's own timing, as its first cell says it (the instructor guide's test reads it so too)
TIMING_IN_LAB = re.compile(r"(\d+)\s*min[^,.\n]*?teaching[^,]*?,\s*(\d+)\s*min", re.I | re.S)


def decks() -> dict:
    with open(HERE / "decks.toml", "rb") as f:
        return tomllib.load(f)


def clock(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def schedule(spec: dict) -> list[dict]:
    """Each part of the deck with its start (minutes from the start), talk and hands-on."""
    parts, at = [], 0
    for part in spec["sections"]:
        talk, hands_on = part.get("minutes", 0), part.get("hands_on", 0)
        parts.append({**part, "start": at, "talk": talk, "hands_on": hands_on,
                      "name": part.get("pause") or part["title"]})
        at += talk + hands_on
    return parts


def agenda_rows(spec: dict) -> list[str]:
    rows = [f"| {clock(p['start'])} | {p['name']} | {p.get('lab', '')} | {p['talk']} min | "
            f"{str(p['hands_on']) + ' min' if p['hands_on'] else ''} |" for p in schedule(spec)]
    end = sum(p["talk"] + p["hands_on"] for p in schedule(spec))
    return rows + [f"| {clock(end)} | end | | | |"]


def agenda(spec: dict) -> str:
    """The deck's agenda as one Markdown table: start, section, lab, minutes (talk + hands-on)."""
    return "\n".join(["| start | | lab | talk | hands-on |", "|---|---|---|---|---|"]
                     + agenda_rows(spec))


def agenda_pages(spec: dict, rows: int = AGENDA_ROWS) -> list[str]:
    """The agenda cut into tables of at most ``rows`` rows (the end row rides on the last)."""
    body = agenda_rows(spec)
    parts, end = body[:-1], body[-1]
    count = max(1, -(-len(parts) // rows))
    size = -(-len(parts) // count)  # Note: pages of even length, not 12 + 1
    pages = [parts[i:i + size] for i in range(0, len(parts), size)]
    pages[-1] = pages[-1] + [end]
    return ["\n".join(["| start | | lab | talk | hands-on |", "|---|---|---|---|---|"] + page)
            for page in pages]


# -- what the labs say of themselves ------------------------------------------------------------

def lab_cells(lab: str) -> list[str]:
    cells = json.loads((LABS / f"{lab}.ipynb").read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells]


def lab_timing(lab: str) -> tuple[int, int] | None:
    """(teaching, exercises) minutes, as the lab's first cell states them."""
    found = TIMING_IN_LAB.search(lab_cells(lab)[0])
    return (int(found[1]), int(found[2])) if found else None


def lab_title(lab: str) -> str:
    first = lab_cells(lab)[0].splitlines()[0].lstrip("# ").strip()
    return first.split("·", 1)[-1].strip()


def lab_prerequisites(lab: str) -> dict[str, str]:
    """The labs named on the lab's **Prerequisites:** line: {lab id: what it says of it}."""
    found = re.search(r"\*\*Prerequisites:\*\*(.*?)(?:\n\n|\n\*\*|$)", lab_cells(lab)[0], re.S)
    if not found:
        return {}
    text = " ".join(found.group(1).split())
    ids = {p.stem[:2]: p.stem for p in LABS.glob("[0-9][0-9]_*.ipynb")}
    out = {}
    for match in re.finditer(r"\blab (\d\d)\b(\s*\((?:[^()]|\([^()]*\))*\))?", text):
        if match.group(1) in ids and ids[match.group(1)] != lab:
            out[ids[match.group(1)]] = (match.group(2) or "").strip()
    return out


def lab_exercises(lab: str) -> list[str]:
    """The exercises of ``lab``: its reference solutions' names (``labs/solutions/NN_*.py``)."""
    return sorted(p.stem for p in (LABS / "solutions").glob(f"{lab[:2]}_*.py"))


def check_plan(name: str, spec: dict) -> None:
    """A deck may start a lab's exercises only after every lab the lab lists as a prerequisite
    had its own exercises earlier in the deck, or had its talk earlier and the section says the
    talk covers it (``talk_covers``): attendees cannot use a scaffold they only saw."""
    done, talked, problems = {}, {}, []
    for part in schedule(spec):
        lab = part.get("lab")
        if lab:
            talked.setdefault(lab, part["start"])
        if not (lab and part["hands_on"]):
            continue
        covers = part.get("talk_covers", [])
        for needed, what in lab_prerequisites(lab).items():
            if needed in done:
                continue
            if needed in covers and needed in talked:
                continue
            why = ("its talk comes earlier, but the section does not say the talk covers it "
                   "(talk_covers)" if needed in talked else "it is not in the deck before them")
            problems.append(f"{lab}'s exercises start at {clock(part['start'] + part['talk'])}, "
                            f"but they build on {needed} {what}, which has no hands-on before "
                            f"them: {why}")
        done[lab] = part["start"]
    if problems:
        raise deck.DeckError(f"decks.toml [{name}]: " + "; ".join(problems) + ". Give those labs "
                             "hands-on time earlier, or list in talk_covers the ones the talk "
                             "really covers")


# -- the slides the build makes from decks.toml ------------------------------------------------

def agenda_notes(name: str, spec: dict) -> str:
    """The agenda's speaker notes, this deck's own: its minutes, and where they differ from the
    labs' own timings."""
    parts = schedule(spec)
    talk = sum(p["talk"] for p in parts if "pause" not in p)
    hands = sum(p["hands_on"] for p in parts)
    pauses = sum(p["talk"] for p in parts if "pause" in p)
    lines = [f"This deck ({name}): {talk} min of slides, {hands} min of hands-on, {pauses} min "
             f"of breaks, {talk + hands + pauses} min in all."]
    hands_on = [f"{p['lab']} {p['hands_on']} min (the lab's own exercises: "
                f"{lab_timing(p['lab'])[1]} min)" for p in parts
                if p["hands_on"] and p.get("lab") and lab_timing(p["lab"])]
    lines.append("Hands-on in this deck: " + "; ".join(hands_on) + ".")
    by_lab: dict[str, int] = {}
    for p in parts:
        if p.get("lab"):
            by_lab[p["lab"]] = by_lab.get(p["lab"], 0) + p["talk"]
    shorter = [f"{lab} {minutes} min (its own teaching: {lab_timing(lab)[0]} min)"
               for lab, minutes in by_lab.items()
               if lab_timing(lab) and minutes != lab_timing(lab)[0]]
    if shorter:
        lines.append("Talk where this deck differs from the lab's own teaching time: "
                     + "; ".join(shorter) + ". The slides carry the teaching; attendees read "
                     "the rest of the lab's prose while they work.")
    demonstrated = [lab for lab in by_lab if lab not in {p.get("lab") for p in parts
                                                         if p["hands_on"]}]
    if demonstrated:
        lines.append("Demonstrated, not hands-on: " + ", ".join(demonstrated) + ".")
    return "\n\n".join(lines)


def your_turn(part: dict, following: dict | None, covered: dict[str, str]) -> deck.Slide:
    lab, minutes = part["lab"], part["hands_on"]
    exercises = lab_exercises(lab)
    ends = clock(part['start'] + part['talk'] + minutes)
    back = ("Then we close." if following is None else
            f"Then the {following['pause'].lower()}, at {ends}." if "pause" in following else
            f"Back together at {ends}: {following['name']}.")
    builds_on = [f"lab {needed[:2]} ({how})" for needed, how in covered.items()]
    body = "\n".join([
        f"## Your turn: lab {lab[:2]}, {minutes} min", "",
        f"Open `labs/{lab}.ipynb` ({lab_title(lab)}) and do its exercises: "
        + ", ".join(f"`{e}`" for e in exercises) + ".", "",
        "- Run each exercise's checker cell and read what it says.",
        f"- Stuck? `labs.show_solution(\"{exercises[0]}\")`; the lab goes on with the reference "
        f"solution and says so." if exercises else "- Ask: the solutions are in `labs/solutions/`.",
        *([f"- It builds on {', '.join(builds_on)}."] if builds_on else []),
        f"- {back}"])
    timing = lab_timing(lab)
    own = (f"The lab's own timing gives its exercises {timing[1]} min; this deck gives them "
           f"{minutes} min." if timing else f"This deck gives the exercises {minutes} min.")
    notes = (f"{own} Walk the room: a team whose checker is still red halfway through gets the "
             f"hint of the checker's message, then the solution. Call time five minutes before "
             f"the end so that every team runs the lab's last cells.")
    return deck.Slide(body, notes, f"decks.toml: your turn, {lab}", minutes * 60, "your-turn")


def pause(part: dict, following: dict | None) -> deck.Slide:
    back = (f"Back at {clock(part['start'] + part['talk'])}: {following['name']}."
            if following else "")
    body = f"## {part['pause']}, {part['talk']} min\n\n{back}"
    after = following["name"] if following else "the wrap-up"
    notes = (f"{part['pause']} of {part['talk']} min. Before it, ask every team whether its last "
             f"lab ran to the end; after it, start on time with {after}.")
    return deck.Slide(body, notes, f"decks.toml: {part['pause']}", part["talk"] * 60, "break")


def deck_slides(name: str, spec: dict, numbers: dict[str, str]) -> list[deck.Slide]:
    """Every slide of a deck in order: the sections' slides (the agenda in pages), a "your turn"
    slide after each section with hands-on time and a slide for each break, each slide with
    its share of its section's minutes (``timing``, seconds)."""
    check_plan(name, spec)
    numbers = {**numbers, "deck.title": spec["title"], "deck.agenda": AGENDA,
               "deck.agenda_notes": agenda_notes(name, spec)}
    parts, slides, done = schedule(spec), [], {}
    for i, part in enumerate(parts):
        following = parts[i + 1] if i + 1 < len(parts) else None
        if "pause" in part:
            slides.append(pause(part, following))
            continue
        own = []
        for slide in deck.parse(HERE / "sections" / part["file"], numbers):
            own.extend(_agenda_pages(slide, spec) if AGENDA in slide.body else [slide])
        seconds = part["talk"] * 60
        for k, slide in enumerate(own):
            slide.timing = seconds // len(own) + (1 if k < seconds % len(own) else 0)
        slides.extend(own)
        lab = part.get("lab")
        if part["hands_on"]:
            covered = {}
            for needed in lab_prerequisites(lab):
                if needed in done:
                    covered[needed] = f"your hands-on at {clock(done[needed])}"
                elif needed in part.get("talk_covers", []):
                    covered[needed] = "the talk"
            slides.append(your_turn(part, following, covered))
            done[lab] = part["start"] + part["talk"]
    return slides


def _agenda_pages(slide: deck.Slide, spec: dict) -> list[deck.Slide]:
    pages = agenda_pages(spec)
    out = []
    for k, table in enumerate(pages, 1):
        body = slide.body.replace(AGENDA, table)
        if len(pages) > 1:
            first, _, rest = body.partition("\n")
            body = f"{first} ({k} of {len(pages)})\n{rest}"
        out.append(deck.Slide(body, slide.notes, slide.where, kind="agenda"))
    return out


def ensure_reveal() -> Path:
    if not (REVEAL / "dist" / "reveal.js").is_file():
        print("slides: reveal.js missing, installing it from npm (once): npm ci", flush=True)
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True)
    return REVEAL


def no_pdf(why: str) -> str:
    """The warning a build without a PDF prints, on stderr: what is missing and what to do."""
    bar = "!" * 78
    return (f"{bar}\nslides: NO PDF WAS MADE: {why}.\nslides: the HTML decks and notebooks are "
            f"written; for the PDF, {deck.INSTALL_CHROMIUM},\nslides: then build again "
            f"(or pass --no-pdf to skip the PDF on purpose).\n{bar}")


def build(out: Path, size: str = "laptop", compare_json: str | None = None,
          only: list[str] | None = None, make_pdf: bool = True):
    """Measure once, then write every deck; returns ({deck: {"slides": n, "files": [...],
    "pdf": None or why there is no PDF}}, the measurement)."""
    specs = {k: v for k, v in decks().items() if not only or k in only}
    if not specs:
        raise ValueError(f"no deck named {only}; the decks: {', '.join(decks())}")
    for name, spec in specs.items():  # Note: a plan that cannot work costs no run either
        check_plan(name, spec)
    # Note: the report is read and checked first, before npm or a run: a bad file costs nothing
    report = kit_run.read_report(compare_json) if compare_json is not None else None
    if compare_json is not None:
        print(f"slides: the main job's numbers from {compare_json}", flush=True)
    reveal = ensure_reveal()
    executable, where = deck.find_chromium() if make_pdf else (None, "--no-pdf")
    if make_pdf and executable is None:
        print(no_pdf(where), file=sys.stderr, flush=True)
    elif make_pdf:
        print(f"slides: the PDF is printed by {where} ({executable})", flush=True)
    started = time.perf_counter()
    measured = kit_run.measure(size, compare_json, report)
    print(f"slides: measured in {time.perf_counter() - started:.0f} s "
          f"({measured.numbers['main_job.source']})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    smallest = {name: min(t["px"] for t in texts) for name, texts in measured.texts.items()
                if texts}
    written = {}
    for name, spec in specs.items():
        slides = deck_slides(name, spec, measured.numbers)
        files = [_write(out / f"{name}.html", deck.reveal_html(
            spec["title"], slides, measured.figures, measured.sources, reveal, smallest))]
        files.append(_write(out / f"{name}.ipynb", nbformat.writes(
            deck.rise_notebook(spec["title"], slides, measured.figures))))
        missing = None if make_pdf else "--no-pdf"
        if make_pdf and executable is None:
            missing = where
        elif make_pdf:
            try:
                files.append(deck.pdf(files[0], out / f"{name}.pdf", executable))
            except Exception as err:  # noqa: BLE001 (said loudly, the decks are still written)
                missing = f"{where} failed to print {name}: {type(err).__name__}: {err}"
                print(no_pdf(missing), file=sys.stderr, flush=True)
        written[name] = {"slides": len(slides), "files": files, "pdf": missing,
                         "minutes": sum(s.timing or 0 for s in slides) / 60}
        print(f"slides: {name}: {len(slides)} slides, {written[name]['minutes']:.0f} min -> "
              f"{', '.join(f.name for f in files)}", flush=True)
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
    parser.add_argument("--require-pdf", action="store_true",
                        help="exit with status 3 when no PDF could be made (default: a loud "
                             "warning, status 0)")
    parser.add_argument("decks", nargs="*", help="only these decks (default: all)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        written, _ = build(Path(args.out), args.size, args.compare_json, args.decks,
                           not args.no_pdf)
    except (deck.DeckError, ValueError, OSError) as err:
        print(f"slides: error: {err}", file=sys.stderr)
        return 2
    missing = sorted(name for name, info in written.items()
                     if info["pdf"] and info["pdf"] != "--no-pdf")
    seconds = time.perf_counter() - started
    if missing:
        print(f"slides: built in {seconds:.0f} s, WITHOUT the PDF of {', '.join(missing)} "
              f"(see above)", file=sys.stderr, flush=True)
        return 3 if args.require_pdf else 0
    print(f"slides: built in {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
