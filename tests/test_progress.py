"""The instructor's view of the day: every check a learner runs is kept beside the notebook, and
``fsdp-mini progress`` shows each team's passes and where it is stuck, from two stand-in teams
whose checks really ran."""

import json
import subprocess
import sys

import pytest

from fsdp_mini import labs
from fsdp_mini.jobs.progress import progress_html, progress_text, read_progress
from fsdp_mini.labs.common.progress import PROGRESS_FILE


def right(n_params, activation_bytes, optimizer="adam"):
    return {"sgd": 8, "momentum": 12, "adam": 16}[optimizer] * n_params + activation_bytes


def no_state(n_params, activation_bytes, optimizer="adam"):
    return 8 * n_params + activation_bytes


@pytest.fixture
def kernel(monkeypatch):
    """As a learner's kernel: not CI, no reference solutions, progress on."""
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("FSDP_MINI_SOLUTIONS", raising=False)
    monkeypatch.setenv("FSDP_MINI_PROGRESS", "1")
    monkeypatch.setenv("USER", "ada")


def run_in(folder, monkeypatch, *answers):
    monkeypatch.chdir(folder)
    return [labs.check_peak_predictor(a) for a in answers]


def test_each_check_appends_its_verdict_beside_the_notebook(kernel, monkeypatch, tmp_path):
    first, second = run_in(tmp_path, monkeypatch, no_state, right)
    lines = [json.loads(s) for s in (tmp_path / PROGRESS_FILE).read_text().splitlines()]
    assert [(e["lab"], e["check"], e["passed"], e["user"]) for e in lines] == [
        ("01", "check_peak_predictor", False, "ada"), ("01", "check_peak_predictor", True, "ada")]
    assert lines[0]["said"] == [m for ok, m, _ in first.lines if not ok][0][:300]
    assert lines[0]["answer"] == first.answer != lines[1]["answer"] == second.answer
    assert "def no_state" not in (tmp_path / PROGRESS_FILE).read_text()   # a digest, not code


@pytest.mark.parametrize("setting", [("CI", "true"), ("FSDP_MINI_SOLUTIONS", "1"),
                                     ("FSDP_MINI_PROGRESS", "0")])
def test_no_progress_is_kept_for_ci_the_solutions_or_when_turned_off(kernel, monkeypatch,
                                                                       tmp_path, setting):
    monkeypatch.setenv(*setting)
    monkeypatch.chdir(tmp_path)
    try:
        labs.check_peak_predictor(no_state)
    except labs.CheckFailed:
        pass
    assert not (tmp_path / PROGRESS_FILE).exists()


def test_a_folder_that_cannot_be_written_leaves_the_check_alone(kernel, monkeypatch, tmp_path):
    monkeypatch.setenv("FSDP_MINI_PROGRESS_DIR", str(tmp_path / "no" / "such" / "folder"))
    assert labs.check_peak_predictor(right).passed


def test_two_teams_one_page(kernel, monkeypatch, tmp_path):
    one, two = tmp_path / "team1", tmp_path / "team2"
    one.mkdir(), two.mkdir()
    run_in(one, monkeypatch, no_state, right)           # stuck, then fixed
    run_in(two, monkeypatch, no_state)                  # still stuck
    with open(two / PROGRESS_FILE, "a") as f:
        f.write("not json\n")                           # a damaged line is skipped
    teams = {"team1": read_progress(one), "team2": read_progress(two)}
    text = progress_text(teams)
    assert "team1: 1 check(s) passed, 0 stuck" in text
    assert "team2: 0 check(s) passed, 1 stuck" in text
    assert "✘ lab 01 check_peak_predictor (ada)" in text and "yours 8, the reference 12" in text
    page = progress_html(teams)
    assert page.count('class="stuck"') == 1 and "team2" in page
    done = subprocess.run([sys.executable, "-m", "fsdp_mini.jobs.cli", "progress", str(one),
                           str(two), "--html", str(tmp_path / "page.html")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "team2: 0 check(s) passed, 1 stuck" in done.stdout
    assert (tmp_path / "page.html").read_text() .count('class="stuck"') == 1


def test_a_team_without_progress_is_named(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fsdp_mini.jobs.cli", "progress",
                           str(tmp_path / "team3")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "team3: no .fsdp-mini-progress.jsonl there" in done.stderr
