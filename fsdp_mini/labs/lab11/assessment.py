"""The assessment (lab 11): an unseen job taken to a configuration that fits, trains like one
process and sends the bytes it should. Four tasks, each graded by its checker, and the report an
instructor collects::

    print(labs.JOB)                                   # the model, the GPUs, the link, the stand-in
    report = labs.grade_assessment({"1": check_1, "2": check_2, "3": check_3, "4": check_4},
                                   attendee="Ada")
    report.total, report.passed                       # (100, True)
    report.json_path                                  # .../assessment_report_Ada.json (and .md)

A task scores its points when its check passes, none otherwise; ``PASS_MARK`` of 100 passes.
The checkers are in ``fit.py`` (task 1), ``link.py`` (2), ``train.py`` (3) and ``bytes.py``
(4); the runs on the ranks in ``runs.py``. The report is written next to the notebook (the kernel's
folder), each file atomically. When the reference solutions ran in place of the attendee's
(``CI=true``, ``FSDP_MINI_SOLUTIONS=1``) the report says so and goes to a temporary folder: it is
nobody's work.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ...comm.link import Link
from ...models import GPTConfig, make_model
from ..common.exercise import use_solutions
from .bytes import *  # noqa: F401,F403
from .bytes import __all__ as _BYTES
from .fit import *  # noqa: F401,F403
from .fit import JOB_BUDGET, FitBudget
from .fit import __all__ as _FIT
from .link import *  # noqa: F401,F403
from .link import JOB_LINK
from .link import __all__ as _LINK
from .runs import *  # noqa: F401,F403
from .runs import JOB_GPT
from .runs import __all__ as _RUNS
from .train import *  # noqa: F401,F403
from .train import __all__ as _TRAIN

PASS_MARK = 75


@dataclass(frozen=True)
class Task:
    number: str
    title: str
    exercise: str
    points: int


TASKS = (Task("1", "a configuration that fits, with headroom", "11_choose_config", 25),
         Task("2", "faster on the slow link: DDP or FSDP", "11_faster_on_link", 25),
         Task("3", "the training function trains like one process", "11_fix_training", 25),
         Task("4", "the bytes per step the configuration sends", "11_bytes_per_step", 25))


@dataclass(frozen=True)
class Job:
    """The job the labs never used: a model and its GPUs (task 1), a slow link (task 2), the
    stand-in trained on this machine's ranks (tasks 2 and 4)."""

    budget: FitBudget
    link: Link
    stand_in: GPTConfig

    def __getattr__(self, name):  # Note: job.shape, job.gpus, job.headroom... read the budget
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.budget, name)

    def __str__(self) -> str:
        s, g = self.budget.shape, self.stand_in
        return "\n".join([
            f"the model: {self.budget.model}, {s.n_layer} layers of width {s.d_model}, {s.n_head} "
            f"heads, MLP {s.ffn_size}, vocabulary {s.vocab}, {s.seq} tokens a sequence "
            f"({s.style} style): Ψ = {s.params() / 1e9:.2f} B parameters",
            f"the GPUs: {self.budget.gpus} of {self.budget.gpu_mem_gb:g} GB, micro-batch "
            f"{self.budget.micro_batch}, {self.budget.headroom:.0%} of the memory kept free",
            f"the link: {self.link.describe()} a message",
            f"the stand-in on your ranks: a GPT of {g.n_layer} blocks of width {g.n_embd}, "
            f"vocabulary {g.vocab_size}, {g.block_size} tokens: Ψ = "
            f"{make_model(g).num_params():,} parameters",
            "the training function: the team's train_job (task 3)"])


JOB = Job(JOB_BUDGET, JOB_LINK, JOB_GPT)


@dataclass
class TaskScore:
    number: str
    title: str
    points: int
    max_points: int
    passed: bool
    message: str                 # one sentence: what is right, or the mistake named
    lines: list = field(default_factory=list)  # every line of the check: ok, message, hint


@dataclass
class AssessmentReport:
    attendee: str
    date: str
    tasks: list
    total: int
    max_total: int
    pass_mark: int
    passed: bool
    reference_solutions: bool
    json_path: str = ""
    md_path: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    def markdown(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        out = [f"# Assessment report: {self.attendee}", "",
               f"- date: {self.date}", "- notebook: labs/11_assessment.ipynb",
               f"- result: **{verdict}**, {self.total} of {self.max_total} points (pass mark "
               f"{self.pass_mark})"]
        if self.reference_solutions:
            out.append("- the reference solutions ran in place of the attendee's (CI=true or "
                       "FSDP_MINI_SOLUTIONS=1): this is not an attendee's work")
        out += ["", "| task | points | result | what the checker said |", "|---|---|---|---|"]
        for t in self.tasks:
            said = t.message.replace("|", "\\|")
            out.append(f"| {t.number} · {t.title} | {t.points} / {t.max_points} | "
                       f"{'✔' if t.passed else '✘'} | {said} |")
        return "\n".join(out) + "\n"

    def __str__(self) -> str:
        rows = [f"{'✔' if t.passed else '✘'} task {t.number} ({t.points:2d}/{t.max_points}) "
                f"{t.title}: {t.message}" for t in self.tasks]
        head = (f"{self.attendee}: {'PASS' if self.passed else 'FAIL'}, {self.total} of "
                f"{self.max_total} points (pass mark {self.pass_mark})")
        where = f"report: {self.json_path} and {Path(self.md_path).name}" if self.json_path else ""
        return "\n".join([head, *rows] + ([where] if where else []))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#2a7d2a" if self.passed else "#b3261e"
        rows = "".join(
            f"<tr><td>{'✔' if t.passed else '✘'} {t.number}</td><td>{html.escape(t.title)}</td>"
            f"<td>{t.points} / {t.max_points}</td><td>{html.escape(t.message)}</td></tr>"
            for t in self.tasks)
        return (f'<div style="font-family:system-ui,sans-serif"><b style="color:{color}">'
                f'{html.escape(self.attendee)}: {"PASS" if self.passed else "FAIL"}, '
                f'{self.total} of {self.max_total} points (pass mark {self.pass_mark})</b>'
                f'<table>{rows}</table><div>report: {html.escape(self.json_path)}</div></div>')


def _score(task: Task, check) -> TaskScore:
    if check is None:
        return TaskScore(task.number, task.title, 0, task.points, False,
                         "not checked: run the task's check cell, then grade again")
    wrong = [msg for ok, msg, _ in check.lines if not ok]
    said = check.facts.get("verdict") or (wrong[0] if wrong else "all checks passed")
    lines = [{"ok": ok, "message": msg, "hint": hint} for ok, msg, hint in check.lines]
    return TaskScore(task.number, task.title, task.points if check.passed else 0, task.points,
                     check.passed, said, lines)


def attendee_name(attendee: str | None = None) -> str:
    """``attendee`` if given, else ``$USER`` (or ``$USERNAME``), else "attendee"."""
    for name in (attendee, os.environ.get("USER"), os.environ.get("USERNAME")):
        if name and name.strip():
            return name.strip()
    return "attendee"


def report_stem(attendee: str) -> str:
    """The files' name: ``assessment_report_<name>``, the name kept to letters, digits, ``.-_``.

    >>> report_stem("Ada Lovelace")
    'assessment_report_Ada_Lovelace'
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", attendee).strip("._") or "attendee"
    return f"assessment_report_{safe}"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half:
    a temporary file in the same folder, flushed to disk, then renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # Note: mkstemp's 0600 would hide the report from an instructor
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def grade_assessment(checks: dict, attendee: str | None = None, folder=None) -> AssessmentReport:
    """Score each task's check (``{"1": CheckResult, ...}``), write the report (JSON and
    Markdown) into ``folder`` (default: next to the notebook; a temporary folder when the
    reference solutions ran), and return it."""
    unknown = set(checks) - {t.number for t in TASKS}
    if unknown:
        raise ValueError(f"no task {sorted(unknown)}: the tasks are {[t.number for t in TASKS]}")
    reference = use_solutions()
    tasks = [_score(t, checks.get(t.number)) for t in TASKS]
    total = sum(t.points for t in tasks)
    report = AssessmentReport(attendee_name(attendee), datetime.now(timezone.utc).isoformat(
        timespec="seconds"), tasks, total, sum(t.points for t in TASKS), PASS_MARK,
        total >= PASS_MARK, reference)
    if folder is None:
        folder = (Path(tempfile.gettempdir()) / "fsdp-mini-assessment" if reference
                  else Path.cwd())
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / report_stem(report.attendee)
    report.json_path, report.md_path = str(stem) + ".json", str(stem) + ".md"
    write_atomically(Path(report.json_path), json.dumps(report.as_dict(), indent=2,
                                                        ensure_ascii=False) + "\n")
    write_atomically(Path(report.md_path), report.markdown())
    return report


__all__ = (["JOB", "Job", "PASS_MARK", "TASKS", "AssessmentReport", "TaskScore", "Task",
            "attendee_name", "grade_assessment", "report_stem", "write_atomically"]
           + _FIT + _LINK + _TRAIN + _BYTES + _RUNS)
