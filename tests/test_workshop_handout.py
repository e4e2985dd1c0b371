"""The attendees' one-page handout (slides/handout.md; issue 28, item 6): the line that connects
is the one the attendee login allows, the check is the kit's doctor, the labs are in order with
the hands-on ones of each deck named, and the formulas are the kit's own."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANDOUT = ROOT / "slides" / "handout.md"


def text() -> str:
    return HANDOUT.read_text(encoding="utf-8")


def test_it_fits_on_one_page_and_has_the_placeholders_workshop_sh_fills():
    lines = text().splitlines()
    assert len(lines) <= 80, len(lines)
    for placeholder in ("<team>", "<address>", "<token>"):
        assert placeholder in text(), placeholder
    assert "sed -e \"s|<team>|" in (ROOT / "docker" / "workshop.sh").read_text()


def test_the_connect_line_is_what_the_attendee_login_allows():
    assert "ssh -N -L 8888:localhost:8888 attendee@<address>" in text()
    assert "http://localhost:8888/?token=<token>" in text()
    assert 'permitopen="localhost:%s"' in (ROOT / "docker" / "box_setup.sh").read_text()


def test_the_check_is_fsdp_mini_doctor_with_flags_it_has():
    (command,) = re.findall(r"^fsdp-mini doctor.*$", text(), re.M)
    doctor = (ROOT / "fsdp_mini" / "jobs" / "doctor.py").read_text()
    for flag in re.findall(r"--[\w-]+", command):
        assert f'"{flag}"' in doctor, flag


def test_the_labs_are_all_there_in_order_and_each_decks_hands_on_labs_named():
    labs = sorted(p.stem for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
    listed = re.findall(r"^\| (\d\d) \| `(\d\d_\w+)` \|", text(), re.M)
    assert [name for _, name in listed] == labs
    with open(ROOT / "slides" / "decks.toml", "rb") as f:
        decks = tomllib.load(f)
    hands_on = sorted({s["lab"][:2] for s in decks["workshop-3h"]["sections"] if s.get("hands_on")})
    said = re.search(r"The 3-hour workshop does ([\d, and]+) hands-on", text())
    assert said and re.findall(r"\d\d", said[1]) == hands_on, (said and said[1], hands_on)
    full = sorted({s["lab"][:2] for s in decks["full-day"]["sections"] if s.get("hands_on")})
    assert f"the full day does {full[0]} to {full[-1]}" in text()


def test_the_formulas_are_the_kits():
    theory = (ROOT / "fsdp_mini" / "theory.py").read_text()
    for formula in ("16Ψ", "8Ψ + 8Ψ/N", "4Ψ + 12Ψ/N", "16Ψ/N"):
        assert formula in theory and formula in text(), formula
    assert "2(N-1)/N x 4Ψ" in theory and "2(N-1)/N × 4Ψ" in text()
    assert "3(N-1)/N x 4Ψ" in theory and "3(N-1)/N × 4Ψ" in text()
