"""``fsdp-mini progress``: every team's checks on one page, for the instructor on the day.

    docker/workshop.sh progress team1 team2         # copies them from the boxes, then runs this
    fsdp-mini progress team1/ team2/                # a table: who passed what, who is stuck where
    fsdp-mini progress team*/ --html progress.html  # the same page for a browser (refresh it)
    fsdp-mini progress collected/team1-work.tar     # a team's collected work, read in place

Each argument is a team's folder (every ``.fsdp-mini-progress.jsonl`` in it and its subfolders:
what the labs' checkers wrote beside the notebooks, :mod:`fsdp_mini.labs.common.progress`), one
such file, or a tar of the team's work (``docker/workshop.sh collect``). An argument with no
progress file in it, or a file that holds no verdict, is named on stderr and the exit status is 2
(the other teams are still shown). ``docker/workshop.sh progress`` copies the files from the boxes
into a folder per team (slides/INSTRUCTOR.md, section 4b, "Watching the teams"). A team's latest
verdict per (user, check) counts; "stuck" is a check that failed last and has not passed since,
with the checker's own words. The user is the attendee's name where they set
``FSDP_MINI_ATTENDEE``, else the login (``learner`` for everyone in the workshop's container)
with the notebook the check ran in.
"""

from __future__ import annotations

import html
import json
import re
import tarfile
from datetime import datetime, timezone
from pathlib import Path

PROGRESS_FILE = ".fsdp-mini-progress.jsonl"  # as fsdp_mini.labs.common.progress writes it


def _texts(where) -> list[tuple[str, str]]:
    """(name, text) of every progress file in ``where``: a folder (and its subfolders), a tar of
    a team's work, or a progress file itself."""
    path = Path(where)
    if path.is_dir():
        found = sorted(path.rglob(PROGRESS_FILE))
        if not found:
            raise FileNotFoundError(f"{where}: no {PROGRESS_FILE} there, nor in its subfolders "
                                    "(copy the team's files first: docker/workshop.sh progress "
                                    "TEAM, or name the file itself)")
        return [(str(p), p.read_text(encoding="utf-8", errors="replace")) for p in found
                if p.is_file()]
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no {PROGRESS_FILE} there (copy the team's work folder "
                                f"first, or name the file itself)")
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers()
                       if m.isfile() and m.name.rsplit("/", 1)[-1] == PROGRESS_FILE]
            if not members:
                raise FileNotFoundError(f"{where}: a tar with no {PROGRESS_FILE} in it (no check "
                                        "ran in that work, or it is not the team's work)")
            return [(f"{where}:{m.name}", tar.extractfile(m).read().decode("utf-8", "replace"))
                    for m in members]
    return [(str(where), path.read_text(encoding="utf-8", errors="replace"))]


def read_progress(where) -> list[dict]:
    """The verdicts in a team's folder, tar or file, oldest first; damaged lines are skipped. An
    empty file is a team that has run no check yet; a file with lines but no verdict is an
    error (not a progress file)."""
    out = []
    for name, text in _texts(where):
        entries = []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and {"time", "check", "passed"} <= set(entry):
                entries.append(entry)
        if text.strip() and not entries:
            raise ValueError(f"{name}: no check's verdict in it: not a {PROGRESS_FILE}")
        out += entries
    return sorted(out, key=lambda e: str(e["time"]))


def team_name(where) -> str:
    """The name a team is shown under: its folder's, or its tar's without -work and the date."""
    name = Path(where).name or str(where)
    if name.endswith(".tar"):
        name = re.sub(r"-work(-\d{8}T\d{6}Z(-\d+)?)?$", "", name[: -len(".tar")])
    return name


def standing(entries: list[dict]) -> dict:
    """A team's latest verdict per (user, check), its passes, where it is stuck and when it last
    ran a check."""
    latest = {}
    for e in entries:
        latest[(e.get("user", ""), e["check"])] = e
    stuck = [e for e in latest.values() if not e["passed"]]
    return {"latest": latest, "passed": sorted({e["check"] for e in latest.values() if e["passed"]}),
            "stuck": sorted(stuck, key=lambda e: str(e["time"])),
            "last": entries[-1]["time"] if entries else ""}


def progress_text(teams: dict[str, list[dict]], now: datetime | None = None) -> str:
    """One block per team: what passed, what is stuck (with the checker's words), how long ago."""
    now = now or datetime.now(timezone.utc)
    lines = []
    for team, entries in teams.items():
        s = standing(entries)
        lines.append(f"{team}: {len(s['passed'])} check(s) passed, {len(s['stuck'])} stuck, "
                     f"last check {_ago(s['last'], now)}")
        for e in s["stuck"]:
            who = f" ({e['user']})" if e.get("user") else ""
            lines.append(f"  ✘ lab {e.get('lab', '?')} {e['check']}{who}, {_ago(e['time'], now)}: "
                         f"{e.get('said', '')}")
        if s["passed"]:
            lines.append(f"  ✔ {', '.join(s['passed'])}")
    return "\n".join(lines)


def progress_html(teams: dict[str, list[dict]], now: datetime | None = None) -> str:
    """The same as a page: a row per team, red where it is stuck."""
    now = now or datetime.now(timezone.utc)
    rows = []
    for team, entries in teams.items():
        s = standing(entries)
        stuck = "".join(f"<div>✘ lab {html.escape(str(e.get('lab', '?')))} "
                        f"{html.escape(e['check'])}: {html.escape(e.get('said', ''))}</div>"
                        for e in s["stuck"])
        rows.append(f"<tr class=\"{'stuck' if s['stuck'] else 'fine'}\"><td>{html.escape(team)}"
                    f"</td><td>{len(s['passed'])}</td><td>{stuck or '—'}</td>"
                    f"<td>{html.escape(_ago(s['last'], now))}</td></tr>")
    return ("<!doctype html><meta charset=utf-8><title>fsdp-mini: the teams' progress</title>"
            "<style>body{font:16px system-ui}td{padding:4px 12px;vertical-align:top}"
            "tr.stuck{background:#fde8e6}</style><h1>The teams' progress</h1>"
            f"<p>as of {now.isoformat(timespec='seconds')}</p><table><tr><th>team</th>"
            "<th>passed</th><th>stuck on</th><th>last check</th></tr>" + "".join(rows)
            + "</table>\n")


def _ago(when: str, now: datetime) -> str:
    try:
        seconds = (now - datetime.fromisoformat(when)).total_seconds()
    except (TypeError, ValueError):
        return "never" if not when else when
    return f"{seconds / 60:.0f} min ago" if seconds < 5400 else f"{seconds / 3600:.1f} h ago"


def add_progress_parser(sub) -> None:
    p = sub.add_parser("progress", help="every team's checks on one page (the instructor's view)")
    p.add_argument("teams", nargs="+", help="each team's folder (its progress files, subfolders "
                   "too), a progress file, or the tar of its work (docker/workshop.sh collect)")
    p.add_argument("--html", metavar="PAGE", help="also write the page to PAGE")


def progress_command(args) -> int:
    import sys
    teams, bad = {}, []
    for where in args.teams:
        name = team_name(where)
        try:
            teams[where if name in teams else name] = read_progress(where)
        except (OSError, ValueError, tarfile.TarError) as err:
            bad.append(where)
            print(f"fsdp-mini progress: error: {err}", file=sys.stderr)
    if teams:
        print(progress_text(teams))
        if args.html:
            Path(args.html).write_text(progress_html(teams), encoding="utf-8")
    if bad:
        print(f"fsdp-mini progress: no progress read from {', '.join(map(str, bad))}",
              file=sys.stderr)
        return 2
    return 0
