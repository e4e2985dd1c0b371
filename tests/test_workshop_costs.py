"""What the workshop costs (issue 28, item 2): the cheapest 4-GPU box that runs every lab comes
first in docker/sky.yaml, and the guide's per-team prices are its own price table times the
hours its plan keeps a box up, each with its source and date."""

from __future__ import annotations

import re
import tomllib
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "slides" / "INSTRUCTOR.md"
DATE = re.compile(r"^20\d\d-\d\d-\d\d$")


def table_after(text: str, marker: str) -> list[list[str]]:
    start = text.index(f"<!-- {marker} -->")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[2:]


def money(cell: str) -> Decimal:
    m = re.fullmatch(r"\$(\d+\.\d\d)", cell)
    assert m, cell
    return Decimal(m[1])


def four_gpu_rows() -> list[list[str]]:
    return [r for r in table_after(GUIDE.read_text(), "costs") if r[2].startswith("4 × ")]


def test_the_first_box_sky_yaml_asks_for_is_the_cheapest_4_gpu_box_priced():
    task = yaml.safe_load((ROOT / "docker" / "sky.yaml").read_text())
    choices = [c["accelerators"] for c in task["resources"]["ordered"]]
    assert all(c.endswith(":4") for c in choices), ("every lab at GPU size needs 4 GPUs "
                                                    f"(lab 08's resume, lab 10's HSDP): {choices}")
    assert not any(c.startswith("T4") for c in choices), "no bf16 in hardware (lab 07)"
    cheapest = min(four_gpu_rows(), key=lambda r: money(r[4]))
    gpu_class = cheapest[2].split("× ")[1].split()[0]
    assert choices[0] == f"{gpu_class}:4", (choices[0], cheapest)


def box_hours(deck: str) -> Decimal:
    """The guide's plan: 1 h the day before, 1 h before the start, the deck, 0.5 h after."""
    with open(ROOT / "slides" / "decks.toml", "rb") as f:
        sections = tomllib.load(f)[deck]["sections"]
    minutes = sum(s.get("minutes", 0) + s.get("hands_on", 0) for s in sections)
    return Decimal(1) + Decimal(1) + Decimal(minutes) / 60 + Decimal("0.5")


def test_the_per_team_prices_are_the_price_table_times_the_plans_hours():
    guide = GUIDE.read_text()
    three, day = box_hours("workshop-3h"), box_hours("full-day")
    assert (three, day) == (Decimal("5.5"), Decimal("11.25"))
    assert f"3-hour workshop, {three} h" in guide and f"full day, {day} h" in guide
    rows = table_after(guide, "costs per team")
    by_instance = {(r[0], r[1], r[2]): r for r in four_gpu_rows()}
    assert len(rows) == len(by_instance) >= 5
    cent = Decimal("0.01")
    for row in rows:
        source = by_instance[(row[0], row[1], row[2])]
        assert row[3] == source[4], (row, source)
        per_hour = money(row[3])
        assert money(row[4]) == (per_hour * three).quantize(cent, ROUND_HALF_UP), row
        assert money(row[5]) == (per_hour * day).quantize(cent, ROUND_HALF_UP), row
        assert DATE.match(row[6]) and row[6] == source[6], row
        assert row[7].startswith("https://") and source[7].startswith(row[7]), row


def test_the_guide_says_how_a_box_stops_billing():
    guide = GUIDE.read_text()
    assert "docker/workshop.sh down team1 team2 team3 spare" in guide
    assert "powers itself off" in guide
    sky = (ROOT / "docker" / "sky.yaml").read_text()
    assert "BOX_HOURS" in sky and "box_setup.sh setup" in sky
    assert "shutdown -h" in (ROOT / "docker" / "box_setup.sh").read_text()
