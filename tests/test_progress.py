"""The instructor's view of the day: every check a learner runs is kept beside the notebook, and
``fsdp-mini progress`` shows each team's passes and where it is stuck, from two stand-in teams
whose checks really ran."""

import io
import json
import subprocess
import sys
import tarfile

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
    monkeypatch.delenv("FSDP_MINI_ATTENDEE", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)


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


@pytest.fixture
def cli(capsys):
    """fsdp-mini progress in this process (the subprocess is test_two_teams_one_page's)."""
    from fsdp_mini.jobs.cli import main

    def run(*args):
        capsys.readouterr()
        code = main(["progress", *map(str, args)])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)
    return run


def test_two_attendees_of_a_team_are_told_apart(kernel, monkeypatch, tmp_path):
    """In the workshop's container everyone is `learner`: the notebook JupyterLab names
    (JPY_SESSION_NAME) and the attendee's own FSDP_MINI_ATTENDEE tell them apart."""
    monkeypatch.setenv("USER", "learner")
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "01_memory.ipynb"))
    run_in(tmp_path, monkeypatch, no_state)
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "01_memory-Copy1.ipynb"))
    run_in(tmp_path, monkeypatch, right)
    monkeypatch.setenv("FSDP_MINI_ATTENDEE", "ada")
    monkeypatch.delenv("JPY_SESSION_NAME")
    run_in(tmp_path, monkeypatch, no_state)
    users = [json.loads(s)["user"] for s in (tmp_path / PROGRESS_FILE).read_text().splitlines()]
    assert users == ["learner (01_memory.ipynb)", "learner (01_memory-Copy1.ipynb)", "ada"]
    text = progress_text({"team1": read_progress(tmp_path)})
    assert "team1: 1 check(s) passed, 2 stuck" in text, text
    assert "(learner (01_memory.ipynb))" in text and "(ada)" in text


def _tar(path, files):
    with tarfile.open(path, "w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_the_collected_work_tar_is_read_in_place(kernel, monkeypatch, tmp_path, cli):
    work = tmp_path / "work"
    work.mkdir()
    run_in(work, monkeypatch, no_state, right)
    _tar(tmp_path / "team1-work.tar", {"./00_setup.ipynb": "{}",
                                       f"./{PROGRESS_FILE}": (work / PROGRESS_FILE).read_text()})
    assert len(read_progress(tmp_path / "team1-work.tar")) == 2
    done = cli(tmp_path / "team1-work.tar")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("team1: 1 check(s) passed, 0 stuck"), done.stdout


def test_a_folder_reads_its_subfolders_too(kernel, monkeypatch, tmp_path):
    (tmp_path / "team1" / "mine").mkdir(parents=True)
    run_in(tmp_path / "team1", monkeypatch, no_state)
    run_in(tmp_path / "team1" / "mine", monkeypatch, right)
    assert len(read_progress(tmp_path / "team1")) == 2


def test_no_progress_there_is_said_and_the_exit_status_is_not_zero(kernel, monkeypatch, tmp_path,
                                                                   cli):
    """A tar, a folder or a file without a verdict was "0 passed ... never" and exit status 0."""
    _tar(tmp_path / "team1-work.tar", {"./00_setup.ipynb": "{}"})
    (tmp_path / "team2").mkdir()
    (tmp_path / "team2" / "00_setup.ipynb").write_text("{}")
    (tmp_path / "notes.txt").write_text("not a progress file\n")
    (tmp_path / "tar-as-progress").mkdir()
    _tar(tmp_path / "tar-as-progress" / PROGRESS_FILE, {"./x": "y"})
    for where, says in ((tmp_path / "team1-work.tar", f"a tar with no {PROGRESS_FILE} in it"),
                        (tmp_path / "team2", f"no {PROGRESS_FILE} there, nor in its subfolders"),
                        (tmp_path / "notes.txt", "no check's verdict in it"),
                        (tmp_path / "tar-as-progress", "no check's verdict in it")):
        done = cli(where)
        assert done.returncode == 2 and says in done.stderr, (where, done.stderr)
        assert "never" not in done.stdout and "0 check(s) passed" not in done.stdout, done.stdout
    # One team without progress among others: the others are shown, the exit status says it.
    (tmp_path / "team3").mkdir()
    run_in(tmp_path / "team3", monkeypatch, right)
    done = cli(tmp_path / "team3", tmp_path / "team2")
    assert done.returncode == 2 and "team3: 1 check(s) passed" in done.stdout
    assert f"no progress read from {tmp_path / 'team2'}" in done.stderr


def test_an_empty_progress_file_is_a_team_that_has_not_checked_yet(tmp_path, cli):
    (tmp_path / "team4").mkdir()
    (tmp_path / "team4" / PROGRESS_FILE).write_text("")
    done = cli(tmp_path / "team4")
    assert done.returncode == 0 and "team4: 0 check(s) passed, 0 stuck, last check never" in done.stdout
