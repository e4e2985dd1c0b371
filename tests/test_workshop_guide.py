"""What the instructor guide (slides/INSTRUCTOR.md) says about the workshop's scripts and files,
checked against those files: the GPU check's last step, the README's lab run times, the plan's
`--hours` and its order on the day, SkyPilot's cancel, the safety claims and where the progress
of the teams is watched. Text only, no command is run (tests/test_workshop_commands.py runs them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "slides" / "INSTRUCTOR.md"
DOCKER_README = ROOT / "docker" / "README.md"
SKY = ROOT / "docker" / "sky.yaml"
BOX_SETUP = ROOT / "docker" / "box_setup.sh"


@pytest.fixture(scope="module")
def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def spans(text: str) -> list[str]:
    """Inline code and the lines of shell blocks."""
    found = re.findall(r"`([^`\n]+)`", text)
    for block in re.findall(r"^ *```(?:bash|sh|console)\n(.*?)^ *```", text, re.S | re.M):
        found += [line.strip() for line in block.splitlines() if line.strip()]
    return found


def step(guide: str, number: int) -> str:
    """Section 4's step ``number``, from its number to the next step's."""
    start = re.search(rf"^ ?{number}\. \*\*", guide, re.M).start()
    end = re.search(rf"^ ?{number + 1}\. \*\*|^## ", guide[start + 1:], re.M)
    return guide[start:start + 1 + end.start()] if end else guide[start:]


def test_the_gpu_checks_last_step_is_the_one_the_guide_names(guide):
    steps = re.findall(r"^step (?:python )?(\S+)", (ROOT / "benchmarks" / "gpu_check.sh").read_text(), re.M)
    last = steps[-1]
    named = re.findall(r"`(benchmarks/\w+\.py)`[^`]{0,40}the last step of `benchmarks/gpu_check\.sh`",
                       guide)
    named += re.findall(r"its last step,\s+`(benchmarks/\w+\.py)`", guide)
    assert named and set(named) == {last}, (named, last)
    assert "`benchmarks/gpu_memory.py` (the last step" not in guide


def test_the_lab_run_times_it_adds_up_are_the_readmes(guide):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    times = dict(re.findall(r"^\| `(\d\d)_\w+` \|.*\| (\d+) s \|$", readme, re.M))
    assert {f"{n:02d}" for n in range(11)} <= set(times), times
    m = re.search(r"README's run times of\s+labs 00–10 add up to (\d+) s", guide)
    assert m, "the guide no longer quotes the sum"
    assert int(m[1]) == sum(int(times[f"{n:02d}"]) for n in range(11)), (m[1], times)


def test_every_up_carries_the_plans_hours(guide):
    """Without --hours a box powers itself off after 12 h, not the plan's 5 (or 11)."""
    for path, text in ((GUIDE, guide), (DOCKER_README, DOCKER_README.read_text()),
                       (SKY, SKY.read_text())):
        ups = [s for s in spans(text) if re.search(r"workshop\.sh up\b", s)]
        ups += re.findall(r"^#\s+(docker/workshop\.sh up .*)$", text, re.M)
        assert ups, path.name
        for up in ups:
            assert "--hours" in up, f"{path.name}: {up!r}"
    checklist = guide[guide.index("### The per-team checklist"):guide.index("### Watching the teams")]
    shorthand = [s for s in spans(checklist) if re.match(r"(docker/workshop\.sh )?up .*team", s)]
    assert len(shorthand) == 2 and all("--hours 5" in s for s in shorthand), shorthand


def test_the_day_has_the_same_order_in_step_10_and_in_the_checklist(guide):
    day = step(guide, 10).split("On the day", 1)[1]
    in_step = re.findall(r"`docker/workshop\.sh ([a-z-]+)", day)
    (row,) = [line for line in guide.splitlines() if line.startswith("| an hour before |")]
    in_checklist = re.findall(r"`(?:docker/workshop\.sh )?([a-z-]+) ", row.split("|")[3])
    assert in_step == in_checklist == ["up", "check", "gpu-check", "handout"], (in_step, in_checklist)


@pytest.mark.parametrize("path", [GUIDE, DOCKER_README, SKY], ids=lambda p: p.name)
def test_sky_cancel_is_given_a_job_or_all_and_sky_exec_the_token(path):
    """`sky cancel team1` alone is refused by SkyPilot ("requires either a job id ... or the
    --all flag"); the relaunch needs the team's token and the workshop's SkyPilot config."""
    text = path.read_text(encoding="utf-8")
    for span in spans(text):
        for m in re.finditer(r"sky cancel((?: [^`;&|]+)?)", span):
            args = m[1].split()
            names = [a for a in args if not a.startswith("-")]
            assert {"--all", "-a"} & set(args) or len(names) >= 2, f"{path.name}: {span!r}"
        if re.search(r"\bsky exec\b", span):
            assert "JUPYTER_TOKEN" in span and "-d " in span, f"{path.name}: {span!r}"
            if path == GUIDE:
                assert "SKYPILOT_PROJECT_CONFIG=docker/sky-config.yaml" in span, span


def test_the_safety_it_claims_is_what_box_setup_does(guide):
    setup = BOX_SETUP.read_text()
    # No remote forward: the option the guide names is the one written on each key.
    assert 'permitlisten="%s"' in setup and 'LISTEN_NONE="127.0.0.1:1"' in setup
    assert 'permitlisten="127.0.0.1:1"' in guide
    assert "permitlisten=\"none\"" not in setup.split("\n# Note:")[0], "sshd refuses such a key"
    # The containers off the box's own ports and the metadata service, on IPv4 and IPv6.
    firewall = (BOX_SETUP.parent / "box_firewall.sh").read_text()
    assert ". \"$here/box_firewall.sh\"" in setup, "box_setup.sh sources its firewall"
    assert "INPUT -i" in firewall and "ESTABLISHED,RELATED" in firewall
    assert "ip6tables -C DOCKER-USER -d \"$METADATA_V6\"" in firewall.split("\ncheck_firewall() {")[1], \
        "check reads the IPv6 metadata rule back"
    assert "check_firewall" in setup.split("\ncheck() {")[1]
    for said in ("the box's own ports", "6380", "10001", "IPv4 and IPv6", "private networks",
                 "fsdp-mini-box.service"):
        assert said in guide, said
    assert "was not tried on a cloud box" in guide, "what the tests did not prove, said"
    # The home is closed for what it still holds, not for the key it no longer holds.
    for path in (GUIDE, BOX_SETUP, SKY, DOCKER_README):
        text = " ".join(path.read_text().split())
        assert "holds SkyPilot's key for all your clusters" not in text, path.name
        assert "holds SkyPilot's private key for all your clusters" not in text, path.name


def test_it_says_how_to_watch_the_teams(guide):
    assert "### Watching the teams" in guide
    assert "docker/workshop.sh progress team1 team2 team3" in guide
    assert "fsdp-mini progress" in guide and "FSDP_MINI_ATTENDEE" in guide
    progress = (ROOT / "fsdp_mini" / "jobs" / "progress.py").read_text()
    assert '"Watching the teams"' in progress and "section 4b" in progress


def test_step_7s_pages_reach_the_laptop_before_the_box_goes(guide):
    seven, ten = step(guide, 7), step(guide, 10)
    assert "down --no-collect" in ten, "the boxes are deleted for the night"
    (copy,) = [s for s in spans(seven) if "build/labs" in s and "| tar -x" in s]
    assert copy.startswith("ssh demo "), copy
    assert "delete the folder before the attendees arrive" not in seven
