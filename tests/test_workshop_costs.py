"""What the workshop costs (issue 28, item 2): the cheapest 4-GPU box that runs every lab comes
first in docker/sky.yaml, and the guide's per-team prices are its own price table times the
hours its plan keeps a box up, each with its source and date."""

from __future__ import annotations

import json
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


TIMING_IN_LAB = re.compile(r"(\d+)\s*min[^,.\n]*?teaching[^,]*?,\s*(\d+)\s*min", re.I | re.S)
NUMBER = re.compile(r"\d+(\.\d+)?")


def deck_hours() -> list[Decimal]:
    """The three workshops the guide prices: the 3-hour deck, the full day, the full day with
    the assessment (lab 11's own timing, from its first cell, after the deck: section 1)."""
    with open(ROOT / "slides" / "decks.toml", "rb") as f:
        decks = tomllib.load(f)
    minutes = [sum(s.get("minutes", 0) + s.get("hands_on", 0) for s in decks[d]["sections"])
               for d in ("workshop-3h", "full-day")]
    first = json.loads((ROOT / "labs" / "11_assessment.ipynb").read_text(encoding="utf-8"))["cells"][0]
    teaching, exercises = map(int, TIMING_IN_LAB.search("".join(first["source"])).groups())
    minutes.append(minutes[1] + teaching + exercises)
    return [Decimal(m) / 60 for m in minutes]


def plan_rows() -> list[list[str]]:
    return table_after(GUIDE.read_text(), "box-hours")


def box_hours() -> list[Decimal]:
    """The guide's plan, step by step (its box-hours table), with the workshop's own length."""
    rows = plan_rows()
    fixed = sum(Decimal(r[2]) for r in rows if NUMBER.fullmatch(r[2]))
    (workshop,) = [r for r in rows if not NUMBER.fullmatch(r[2])]
    said = [Decimal(x) for x in workshop[2].split(" / ")]
    assert said == deck_hours(), (workshop, deck_hours())
    return [fixed + h for h in said]


def test_the_plans_box_hours_count_every_step_of_section_4():
    """Every step of the day before that needs the box (launch, build, check, gpu-check, keys
    and handouts, the demo box's recording and rendering, the attendees' own hour), the relaunch
    on the day, the workshop and the teardown: the "1 h the day before" it had was not enough."""
    guide = GUIDE.read_text()
    rows = plan_rows()
    before = " ".join(r[1] for r in rows if r[0] == "the day before")
    for step in ("launch", "build", "`check`", "`gpu-check`", "keys", "handouts", "recorded run",
                 "labs rendered", "attendees' own check"):
        assert step in before, step
    (hour,) = [r for r in rows if "attendees' own check" in r[1]]
    assert hour[2] == "1" and "Announce an hour for it" in guide, "step 9's hour, for the attendees"
    day = " ".join(r[1] for r in rows if r[0] == "on the day")
    for step in ("launch", "build", "`check`", "`gpu-check`", "handouts"):
        assert step in day, step
    assert any(r[0] == "after" and "collect" in r[1] for r in rows)
    before_hours = sum(Decimal(r[2]) for r in rows if r[0] == "the day before")
    assert before_hours >= 2, before_hours


def test_the_per_team_prices_are_the_price_table_times_the_plans_hours():
    guide = GUIDE.read_text()
    three, day, assessed = box_hours()
    assert (three, day, assessed) == (Decimal("6.5"), Decimal("12.25"), Decimal("13")), \
        (three, day, assessed)
    def said(d: Decimal) -> str:
        return format(d.normalize(), "f")
    assert f"3-hour workshop, {said(three)} h" in guide and f"full day, {said(day)} h" in guide
    assert f"full day and the assessment, {said(assessed)} h" in guide
    for hours, what in ((three, "the 3-hour workshop"), (day, "the full day"),
                        (assessed, "the full day with the assessment")):
        assert f" = **{said(hours)} box-hours for {what}**" in " ".join(guide.split()), what
    rows = table_after(guide, "costs per team")
    by_instance = {(r[0], r[1], r[2]): r for r in four_gpu_rows()}
    assert len(rows) == len(by_instance) >= 5
    cent = Decimal("0.01")
    for row in rows:
        source = by_instance[(row[0], row[1], row[2])]
        assert row[3] == source[4], (row, source)
        per_hour = money(row[3])
        for cell, hours in zip(row[4:7], (three, day, assessed)):
            assert money(cell) == (per_hour * hours).quantize(cent, ROUND_HALF_UP), (row, hours)
        assert DATE.match(row[7]) and row[7] == source[6], row
        assert row[8].startswith("https://") and source[7].startswith(row[8]), row


def test_the_bill_counts_the_spare_and_the_instructors_demo_box():
    """Sections 1 and 8 demonstrate and present on the instructor's own box: it is launched,
    checked and deleted with the others, and paid for."""
    guide = GUIDE.read_text()
    for command in ("up --hours 5", "check", "gpu-check", "down --no-collect", "down"):
        assert f"docker/workshop.sh {command} team1 team2 team3 spare demo" in guide, command
    assert "T + 2 boxes" in guide and "the spare, your demo box" in guide
    assert "ssh demo " in guide and "scp demo:" in guide, "steps 6 and 7 run on the demo box"


def test_the_guide_says_how_a_box_stops_billing():
    guide = GUIDE.read_text()
    assert "docker/workshop.sh down team1 team2 team3 spare demo" in guide
    assert "powers itself off" in guide
    sky = (ROOT / "docker" / "sky.yaml").read_text()
    assert "BOX_HOURS" in sky and "box_setup.sh setup" in sky
    assert "shutdown -h" in (ROOT / "docker" / "box_setup.sh").read_text()
