"""The assessment (lab 11): an unseen job taken to a configuration that fits, trains like one
process and sends the bytes it should. Four tasks, each graded by its checker, and the report an
instructor collects::

    print(labs.JOB)                                   # the model, the GPUs, the link, the stand-in
    report = labs.grade_assessment({"1": check_1, "2": check_2, "3": check_3, "4": check_4},
                                   attendee="Ada")
    report.total, report.passed                       # (100, True)
    report.json_path                                  # .../assessment_report_Ada-<8 hex>.json (and .md)

A task scores its points when its check passes, none otherwise; ``PASS_MARK`` of 100 passes.
The checkers are in ``fit.py`` (task 1), ``link.py`` (2), ``train.py`` (3) and ``bytes.py``
(4); the runs on the ranks in ``runs.py``. The report is written next to the notebook (the kernel's
folder), each file atomically. When the reference solutions ran in place of the attendee's
(``CI=true``, ``FSDP_MINI_SOLUTIONS=1``) the report says so and goes to a temporary folder: it is
nobody's work.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ...comm.link import Link
from ...models import GPTConfig, make_model
from ..common.exercise import use_solutions
from ..common.report import CheckResult
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
from .report_files import (_refuse_another_attendees, attendee_name, report_stem,
                           write_atomically)

PASS_MARK = 75


@dataclass(frozen=True)
class Task:
    number: str
    title: str
    exercise: str
    points: int
    checker: str   # the checker whose verdict scores it


TASKS = (Task("1", "a configuration that fits, with headroom", "11_choose_config", 25,
              "check_choose_config"),
         Task("2", "faster on the slow link: DDP or FSDP", "11_faster_on_link", 25,
              "check_faster_on_link"),
         Task("3", "the training function trains like one process", "11_fix_training", 25,
              "check_job_training"),
         Task("4", "the bytes per step the configuration sends", "11_bytes_per_step", 25,
              "check_bytes_per_step"))


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
    checker: str = ""            # the checker that gave the verdict
    answer: str = ""             # the digest of the answer it checked (answer_digest)


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
    seal: str = ""   # sha256 of the attendee, the date and the tasks (see seal_of)

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
                     check.passed, said, lines, check.checker, check.answer)


def _checked(checks) -> dict:
    """``checks`` as {task number: CheckResult}, each the verdict of that task's own checker on
    one answer; a clear error for anything else (a verdict is never taken for another's)."""
    if not isinstance(checks, Mapping):
        raise TypeError(f"grade_assessment(checks) must be a dict of each task's check, e.g. "
                        f'{{"1": check_1, "2": check_2, "3": check_3, "4": check_4}}, got '
                        f"{checks!r} (a {type(checks).__name__})")
    numbers = [t.number for t in TASKS]
    for key in checks:
        if key not in numbers:
            raise ValueError(f"grade_assessment(checks): no task {key!r}; the tasks are "
                             f"{', '.join(map(repr, numbers))} (strings)")
    for task in TASKS:
        if task.number not in checks:
            continue
        check = checks[task.number]
        name = f"checks[{task.number!r}]"
        if not isinstance(check, CheckResult):
            raise TypeError(f"{name} must be what labs.{task.checker}(...) returned (a "
                            f"CheckResult), got {check!r} (a {type(check).__name__}); run task "
                            f"{task.number}'s check cell, or leave the task out (it scores 0)")
        if check.checker != task.checker:
            given = f"the verdict of {check.checker}" if check.checker else \
                "a verdict no checker of the assessment gave"
            raise ValueError(f"{name} is {given}, not of {task.checker}: task {task.number} is "
                             f"graded by its own check (check_{task.number} = "
                             f"labs.{task.checker}(...))")
    return dict(checks)


def seal_of(report: "AssessmentReport") -> str:
    """sha256 of what a report states (attendee, date, each task's score, check and answer): a
    report edited by hand, or one task's row moved into another's report, no longer matches."""
    body = {k: v for k, v in report.as_dict().items() if k not in ("seal", "json_path", "md_path")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def grade_assessment(checks: dict, attendee: str | None = None, folder=None) -> AssessmentReport:
    """Score each task's check (``{"1": check_1, ...}``: what ``labs.check_choose_config`` and
    the others returned), write the report (JSON and Markdown) into ``folder`` (default: next to
    the notebook; a temporary folder when the reference solutions ran), and return it. A verdict
    of another task's checker is refused; a report of another attendee is never replaced."""
    checks = _checked(checks)
    name = attendee_name(attendee)
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"grade_assessment(folder) must be a folder's path (str or Path) or "
                        f"None, got {folder!r} (a {type(folder).__name__})")
    reference = use_solutions()
    tasks = [_score(t, checks.get(t.number)) for t in TASKS]
    total = sum(t.points for t in tasks)
    report = AssessmentReport(name, datetime.now(timezone.utc).isoformat(
        timespec="seconds"), tasks, total, sum(t.points for t in TASKS), PASS_MARK,
        total >= PASS_MARK, reference)
    report.seal = seal_of(report)
    if folder is None:
        folder = (Path(tempfile.gettempdir()) / "fsdp-mini-assessment" if reference
                  else Path.cwd())
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / report_stem(report.attendee)
    report.json_path, report.md_path = str(stem) + ".json", str(stem) + ".md"
    _refuse_another_attendees(Path(report.json_path), report.attendee)
    write_atomically(Path(report.json_path), json.dumps(report.as_dict(), indent=2,
                                                        ensure_ascii=False) + "\n")
    write_atomically(Path(report.md_path), report.markdown())
    return report


__all__ = (["JOB", "Job", "PASS_MARK", "TASKS", "AssessmentReport", "TaskScore", "Task",
            "attendee_name", "grade_assessment", "report_stem", "seal_of", "write_atomically"]
           + _FIT + _LINK + _TRAIN + _BYTES + _RUNS)
