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
    for placeholder in ("<team>", "<address>", "<token>", "<gpus>", "<repository>"):
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
    assert "--gpus <gpus>" in command, "the box's GPU count, filled in by workshop.sh handout"


def flat() -> str:
    return " ".join(text().split())


def test_it_says_the_box_of_the_day_before_is_gone_by_the_day():
    """The boxes are deleted overnight and come back with a new address and host key."""
    said = flat()
    assert "the day before, and on the day" not in said
    assert "deleted every night" in said and "nothing done there is kept" in said
    assert "on the day you get a new page" in said and "host key" in said
    assert "ssh-keygen -R <address>" in said


def test_it_says_what_each_doctor_line_means_and_what_proves_the_tunnel():
    said = flat()
    doctor = (ROOT / "fsdp_mini" / "jobs" / "doctor_checks.py").read_text()
    assert 'OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"' in doctor
    for status in ("`ok`", "`skip`", "`warn`", "`FAIL`"):
        assert status in said, status
    assert "Every line must start `ok`" not in said
    assert "`warn`: the labs run, but something is worth knowing" in said
    assert "not your tunnel" in said and "JupyterLab opening there proves that your key, the " \
        "tunnel and the token work" in said


def test_the_take_home_labs_say_where_from_how_to_install_and_how_to_keep_the_work():
    said = flat()
    with open(ROOT / "slides" / "decks.toml", "rb") as f:
        decks = tomllib.load(f)
    in_deck = {s["lab"][:2] for s in decks["workshop-3h"]["sections"] if s.get("lab")}
    home = sorted({n for n, _ in re.findall(r"\| (\d\d) \| `(\d\d_\w+)` \|", text())} - in_deck)
    assert re.search(r"## \d\. Take it home \(" + " and ".join(home) + " in the 3-hour workshop", text()), home
    assert "git clone <repository> fsdp-mini && cd fsdp-mini" in text()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = re.search(r'^(pip install "torch==[^"]+" -e "\.\[dev\]")', readme, re.M)[1]
    cpu = re.search(r'`(pip install "torch==[^"]+" --index-url https://download\.pytorch\.org/whl/cpu)`',
                    readme)[1]
    assert quick in text() and cpu in text(), (quick, cpu)
    assert "jupyter lab labs/" in text()
    assert "download your work" in said and "Download" in said and "Before the box is deleted" in said


def test_the_download_line_packs_the_work_folder(tmp_path):
    import subprocess
    import tarfile
    line = re.search(r"`(cd ~/work && tar -czf [^`]+)`", text())[1]
    work = tmp_path / "work"
    work.mkdir()
    (work / "05_fsdp.ipynb").write_text("{}")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with tarfile.open(work / "my-work.tar.gz") as tar:
        assert "./05_fsdp.ipynb" in tar.getnames()


def test_the_labs_are_all_there_in_order_and_each_decks_hands_on_labs_named():
    labs = sorted(p.stem for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
    listed = re.findall(r"\| (\d\d) \| `(\d\d_\w+)` \|", text())
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


def test_it_says_how_to_make_a_key_and_use_it_on_every_laptop():
    """An attendee with no SSH key makes one, sends only its public half, and passes it to ssh
    (a key of another name than id_* is not tried by ssh); macOS and Windows skip the Linux-only
    CPU-torch line."""
    said = text()
    made = re.search(r"ssh-keygen -t ed25519 -f\s+(~/\.ssh/\w+)", said)
    assert made, "no ssh-keygen line"
    key = made[1]
    assert f"{key}.pub" in said and f"-i {key}" in said
    assert "PowerShell" in said and "never the private key" in said
    assert re.search(r"whl/cpu\s+# Linux only", said) and "macOS, Windows: skip" in said
