"""``fsdp-mini progress``: every team's checks on one page, for the instructor on the day.

    fsdp-mini progress team1/ team2/                # a table: who passed what, who is stuck where
    fsdp-mini progress team*/ --html progress.html  # the same page for a browser (refresh it)

Each argument is a team's folder (or the file itself) holding ``.fsdp-mini-progress.jsonl``, what
the labs' checkers wrote beside the notebooks (:mod:`fsdp_mini.labs.common.progress`); copy them
from the boxes first (slides/INSTRUCTOR.md says how). A team's latest verdict per check counts;
"stuck" is a check that failed last and has not passed since, with the checker's own words.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path

PROGRESS_FILE = ".fsdp-mini-progress.jsonl"  # as fsdp_mini.labs.common.progress writes it


def read_progress(where) -> list[dict]:
    """The verdicts in a team's folder (or file), oldest first; damaged lines are skipped."""
    path = Path(where)
    path = path / PROGRESS_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no {PROGRESS_FILE} there (copy the team's work folder "
                                f"first, or name the file itself)")
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and {"time", "check", "passed"} <= set(entry):
            out.append(entry)
    return sorted(out, key=lambda e: str(e["time"]))


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
    p.add_argument("teams", nargs="+", help="each team's work folder (or its progress file)")
    p.add_argument("--html", metavar="PAGE", help="also write the page to PAGE")


def progress_command(args) -> int:
    import sys
    teams = {}
    for where in args.teams:
        name = Path(where).name or where
        try:
            teams[where if name in teams else name] = read_progress(where)
        except (FileNotFoundError, OSError) as err:
            print(f"fsdp-mini progress: error: {err}", file=sys.stderr)
            return 2
    print(progress_text(teams))
    if args.html:
        Path(args.html).write_text(progress_html(teams), encoding="utf-8")
    return 0
