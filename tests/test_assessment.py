"""The assessment (lab 11): each task's checker, beside the reference solution over a spread of
configurations, passes the reference and says in how many configurations; says of a stub that it
is not written yet, of an error its line, of a wrong return type what to return, of a hang where
each rank waited; passes another right method; names the job's own configuration where the
notebook reads it. The grading adds the points, applies the pass mark and writes the report (JSON
and Markdown, each atomically).

The known mistakes (each reference solution with one slip, as an attendee writes it) are the
catalogue of tests/wrong_answers/lab11.py, run by tests/test_wrong_answers.py: no test here
re-enacts it. Tasks 2 and 4 are checked on the ledger of one real run of the stand-in on 2 ranks;
task 3 through the checker's own call (beside the reference on 1-4 ranks), on the reference,
another right fix, the notebook's broken function and a hang.
"""

import json
import linecache
import math
import os
import tempfile
from pathlib import Path

import nbformat
import pytest
from assessment_workers import log_on_rank_0

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs import CheckFailed, CheckResult
from fsdp_mini.labs.lab11 import assessment
from fsdp_mini.labs.lab11 import bytes as assessment_bytes
from fsdp_mini.labs.lab11 import fit as assessment_fit
from fsdp_mini.labs.lab11 import link as assessment_link
from fsdp_mini.labs.lab11 import train as assessment_train

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "labs" / "11_assessment.ipynb"


@pytest.fixture
def learner(monkeypatch):
    """As on an attendee's laptop: a failed check reports, it does not raise."""
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("FSDP_MINI_SOLUTIONS", raising=False)


def attendee_code(source: str, filename: str) -> dict:
    """``source`` run as a notebook cell is: its lines known to tracebacks (IPython puts each
    cell in linecache), so a verdict can name the line an error came from."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "attendee"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def variant(solution, attribute, *edits):
    """The reference solution with (old, new) source edits: an attendee's version of it."""
    source = (ROOT / "labs" / "solutions" / f"{solution}.py").read_text()
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return attendee_code(source, f"attendee_{solution}")[attribute]


def wrong_lines(result):
    return [msg for ok, msg, _ in result.lines if not ok]


def hints(result):
    return [hint for ok, _, hint in result.lines if not ok]


@pytest.fixture(scope="module")
def runs():
    """The stand-in on 2 ranks, once for the module: the ledger tasks 2 and 4 are checked on."""
    cfg = labs.LabConfig(2, "gloo", "tiny", 3, 4, True, 0)
    chosen = {"strategy": "fsdp", "precision": "bf16-mixed", "checkpointing": False}
    return labs.run_job_configs(cfg, {"ddp": labs.DDP_FP32, "fsdp": chosen,
                                      "fsdp fp32": {**chosen, "precision": "fp32"},
                                      "zero2 fp32": {**labs.DDP_FP32, "strategy": "zero2"}})


# -- task 1: a configuration that fits, with headroom ---------------------------------------------

LIMIT = "limit = (1 - headroom) * gpu_mem_gb * 1e9"
NO_HEADROOM = (LIMIT, "limit = gpu_mem_gb * 1e9")


def choose(*edits):
    return variant("11_choose_config", "choose_config", *edits)


def fixed_choice(choice):
    def choose_config(model, gpus, gpu_mem_gb, micro_batch, headroom):
        return dict(choice)
    return choose_config


def test_task1_the_reference_passes_and_names_the_jobs_configuration(monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = labs.check_choose_config(choose())
    budgets = len(assessment_fit.configs())
    assert result.passed and budgets == 108, str(result)
    assert result.facts["configurations"] == budgets and f"{budgets} configurations" in str(result)
    assert result.facts["verdict"] == (f"the cheapest configuration within the headroom on all "
                                       f"{budgets} budgets; for the job: fsdp, bf16-mixed, no "
                                       f"checkpointing")
    assert result.facts["answers"][0] == {"strategy": "fsdp", "precision": "bf16-mixed",
                                          "checkpointing": False}
    assert result.facts["answers"][1] is None       # 32b on 8 GPUs with 20 % headroom: nothing fits


def test_task1_a_choice_over_the_headroom_says_its_planned_peak_and_the_limit(learner):
    result = labs.check_choose_config(choose(NO_HEADROOM))
    assert not result.passed and len(wrong_lines(result)) == 1
    assert wrong_lines(result)[0].startswith(
        "at model '2.7b', gpus 1, gpu mem gb 48, micro batch 1, headroom 0.1: choose_config chose "
        "ddp, fp32, no checkpointing: planned peak 43.8 GB > 43.2 GB (48 GB less 10%), 0.0 GB sent "
        "per GPU per step; the reference: nothing fits (the smallest planned peak is 43.5 GB > "
        "43.2 GB (48 GB less 10%))"), str(result)
    assert result.facts["verdict"] == wrong_lines(result)[0]    # the report's sentence


def test_task1_a_configuration_over_the_gpu_says_its_peak(learner):
    said = wrong_lines(labs.check_choose_config(fixed_choice(labs.DDP_FP32)))[0]
    assert said.startswith("at model '13b', gpus 1, gpu mem gb 48, micro batch 1, headroom 0: "
                           "choose_config chose ddp, fp32, no checkpointing: planned peak 221.0 GB "
                           "> 48.0 GB (48 GB less 0%)"), said
    assert "the reference: nothing fits (the smallest planned peak is 209.6 GB" in said


def test_task1_a_wrong_line_says_what_is_wrong_without_giving_the_answer_away(learner):
    result = labs.check_choose_config(choose(('PRECISIONS = ("fp32", "bf16-mixed")',
                                              'PRECISIONS = ("fp32",)')))
    line, first = wrong_lines(result)[0], result.facts["divergence"].config
    want = result.facts["records"][first][1].get("choice")
    assert want["precision"] == "bf16-mixed" and labs.describe(want) not in line, line
    assert "bf16" not in line and "the reference" not in line
    assert "another that fits costs as little: at equal cost no checkpointing comes first, then " \
           "the less sharded strategy" in line    # yours fits, and sends as few bytes: a tie
    # a choice that fits but sends more is told what the cheapest sends, not what it is
    line = wrong_lines(labs.check_choose_config(choose((
        "cost = (s.sent_bytes_per_step,", "cost = (-s.sent_bytes_per_step,"))))[0]   # the most
    assert "; the cheapest that fits: " in line and "GB sent per GPU per step" in line, line
    assert "the reference" not in line.split("; right ")[0]


def test_task1_another_right_method_passes(learner):
    """Every candidate that fits in one list, the cheapest taken by one key (bytes, then no
    checkpointing, then the less sharded; fp32 before bf16-mixed where all else is equal)."""
    source = '''
import fsdp_mini

def choose_config(model, gpus, gpu_mem_gb, micro_batch, headroom):
    order = ("ddp", "zero1", "zero2", "fsdp")
    fitting = []
    for p_rank, precision in enumerate(("fp32", "bf16-mixed")):
        for checkpointing in (True, False):
            plan = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb,
                                  precision=precision, micro_batch=micro_batch,
                                  checkpointing=checkpointing, strategies=order[::-1],
                                  reduce_dtype="bf16" if precision == "bf16-mixed" else None)
            for strategy, s in plan.strategies.items():
                if s.peak_bytes <= (1 - headroom) * gpu_mem_gb * 1e9:
                    key = (s.sent_bytes_per_step, checkpointing, order.index(strategy), p_rank)
                    fitting.append((key, {"strategy": strategy, "precision": precision,
                                          "checkpointing": checkpointing}))
    return min(fitting, key=lambda f: f[0])[1] if fitting else None
'''
    right = attendee_code(source, "attendee_another_choose_config")["choose_config"]
    result = labs.check_choose_config(right)
    assert result.passed, str(result)


def test_task1_a_stub_an_error_and_a_wrong_form_are_one_line_each(learner):
    def choose_config(model, gpus, gpu_mem_gb, micro_batch, headroom):
        ...   # your code here
    result = labs.check_choose_config(choose_config)
    assert wrong_lines(result) == [
        "choose_config is not written yet: write its body in the cell above"]
    assert result.facts["verdict"] == "choose_config is not written yet"

    def choose_config(model, gpus, gpu_mem_gb, micro_batch, headroom):  # noqa: F811
        return 1 / 0
    result = labs.check_choose_config(choose_config)
    assert len(wrong_lines(result)) == 1 and (
        "your code raised ZeroDivisionError: division by zero (at `return 1 / 0` in "
        "choose_config)") in wrong_lines(result)[0], str(result)
    assert hints(result)[0].startswith("model is a ModelShape (or a preset's name)")

    result = labs.check_choose_config(lambda *a: ("fsdp", "bf16-mixed", False))
    wrong = wrong_lines(result)
    assert len(wrong) == 1 and "returned ('fsdp', 'bf16-mixed', False): return a dict with the " \
        "keys strategy, precision, checkpointing, or None when nothing fits" in wrong[0], str(result)
    assert hints(result)[0].startswith("return a dict with the keys strategy")


def test_task1_in_ci_a_failure_raises_with_the_words(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(CheckFailed, match=r"planned peak 43\.8 GB > 43\.2 GB \(48 GB less 10%\)"):
        labs.check_choose_config(choose(NO_HEADROOM))


# -- task 2: faster on the slow link ---------------------------------------------------------------


def link_check(runs, fn):
    return labs.check_faster_on_link(fn, {"ddp": runs["ddp"], "fsdp": runs["fsdp"]}, 2)


def on_link(*edits):
    return variant("11_faster_on_link", "faster_on_link", *edits)


def test_task2_the_reference_passes_and_says_ddp_wins_on_the_jobs_link(runs, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = link_check(runs, on_link())
    assert result.passed, str(result)
    # the spread, and the job's runs on its link and three others, as measured and on 8 ranks
    cases = len(assessment_link.configs()) + 2 * len(assessment_link.LINK_CASES)
    assert result.facts["configurations"] == cases == 308
    said = str(result)
    assert f"{cases} configurations" in said
    job = result.facts["job"]
    assert job["faster"] == "ddp" and job["fsdp"] > job["ddp"]
    assert result.facts["verdict"] == (f"the α-β step times on all {cases} links and runs; on the "
                                       f"job's link DDP is faster")
    assert "0.05 GB/s, 2000 µs, 2 ranks (the job's link):" in said and "DDP is faster" in said
    assert "0.001 GB/s, 10 µs, 2 ranks:" in said and "FSDP is faster" in said  # bytes decide there
    assert "8 ranks" in said


def test_task2_the_kit_model_is_the_alpha_beta_time_of_the_ledgers_collectives(runs):
    """C + Σ (latency steps × α + sent / b), computed another way: with fsdp_mini.Link."""
    link = fsdp_mini.Link(0.05, 2000)
    pair = {"ddp": runs["ddp"], "fsdp": runs["fsdp"]}
    got = labs.link_model(pair, 2, 0.05, 2000)
    for name, run in pair.items():
        want = run["compute_s"] + sum(link.cost(c["op"], c["payload_bytes"], 2)
                                      for c in run["collectives"])
        assert got[name] == pytest.approx(want)


def test_task2_a_stub_an_error_and_a_wrong_form_are_one_line_each(runs, learner):
    def faster_on_link(runs, world_size, bandwidth_gbs, latency_us):
        ...   # your code here
    assert wrong_lines(link_check(runs, faster_on_link)) == [
        "faster_on_link is not written yet: write its body in the cell above"]

    def faster_on_link(runs, world_size, bandwidth_gbs, latency_us):  # noqa: F811
        return runs["ddp"]["compute"]
    result = link_check(runs, faster_on_link)
    assert len(wrong_lines(result)) == 1 and "your code raised KeyError: 'compute' (at `return " \
        "runs[\"ddp\"][\"compute\"]` in faster_on_link)" in wrong_lines(result)[0], str(result)
    assert hints(result)[0] == ("runs[name] holds compute_s (seconds) and collectives (a list of "
                                "{op, payload_bytes, sent_bytes}); return {name: seconds, ..., "
                                "'faster': name}")

    result = link_check(runs, lambda *a: "ddp")
    wrong = wrong_lines(result)
    assert len(wrong) == 1 and "the step times: yours \"'ddp': return a dict with the keys ddp, " \
        "fsdp (seconds) and faster (the name of the faster run)\"" in wrong[0], str(result)
    assert hints(result) == ["return a dict: each run's seconds, and faster"]


# -- task 3: the training function trains like one process ----------------------------------------
# Each function goes through the checker's own call: beside the reference on 1-4 ranks.

RIGHT = {"its own shuffle generator, seeded the same": [
    ("torch.manual_seed(0)", "torch.manual_seed(rank)"),
    ("order = torch.randperm(len(x))",
     "order = torch.randperm(len(x), generator=torch.Generator().manual_seed(step))")]}


def training(*edits):
    return variant("11_fix_training", "train_job", *edits)


def test_task3_the_reference_passes_and_trains_like_one_process(learner):
    result = labs.check_job_training(labs.load_solution("11_fix_training", "train_job"))
    configurations = len(assessment_train._configs(2))
    assert result.passed and configurations == 13, str(result)
    assert f"{configurations} configurations" in str(result)
    assert result.checker == "check_job_training" and result.facts["parity_error"] < 1e-6
    # what the notebook prints of it: the job's 2 ranks, 3 micro-batches, clipped, SGD
    assert result.facts["verdict"] == (f"2 ranks train like one process (relative difference "
                                       f"{result.facts['parity_error']:.1e})")


@pytest.mark.parametrize("name", RIGHT)
def test_task3_another_right_fix_passes(learner, name):
    result = labs.check_job_training(training(*RIGHT[name]))
    assert result.passed and result.facts["parity_error"] < 1e-6, str(result)


def test_task3_the_configurations_split_the_micro_batches_evenly():
    cfgs = assessment_train._configs(4)
    assert {c["world_size"] for c in cfgs} == {1, 2, 3, 4}
    assert all(labs.JOB_ROWS // c["world_size"] % c["micro_batches"] == 0 for c in cfgs)
    assert {(c["max_norm"], c["optimizer"]) for c in cfgs} >= {
        (labs.JOB_MAX_NORM, "AdamW"), (labs.JOB_MAX_NORM, "SGD+momentum")}


def notebook_cells():
    return nbformat.read(NOTEBOOK, as_version=4).cells


def test_task3_the_notebooks_broken_function_is_stopped_at_torchs_clip(learner):
    """The function as the attendee finds it, through the checker's own call."""
    cell = next(c.source for c in notebook_cells()
                if c.source.startswith('@labs.exercise("11_fix_training")'))
    namespace = attendee_code("import torch\nfrom torch import nn\nimport fsdp_mini\nfrom "
                              "fsdp_mini import labs\n" + cell, "attendee_cell")
    result = labs.check_job_training(namespace["train_job"])
    assert not result.passed and len(wrong_lines(result)) == 1
    said = wrong_lines(result)[0]
    assert said.startswith("at world size 1, ") and "your code raised GradientsChangedError" \
        in said and "(at `optimizer.step()` in train_job)" in said, str(result)
    assert "fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM)" in hints(result)[0]
    assert result.facts["verdict"] == said and math.isinf(result.facts["parity_error"])


def test_task3_a_hang_is_stopped_and_each_ranks_place_named(learner):
    """Rank 0 alone gathers the weights each step: on 1 rank an all-gather the reference does
    not make; on 2 a hang, stopped (the larger configurations are not run), each rank's place
    named."""
    result = labs.check_job_training(log_on_rank_0)
    said, hint = wrong_lines(result)[0], hints(result)[0]
    assert not result.passed and said.startswith("at world size 1, ") and \
        "yours makes 1 all_gather of 808 B that the reference does not" in said, str(result)
    assert said.endswith("the 8 larger configurations were not run")
    assert hint.startswith("at world size 2 the ranks hung: rank 0 waited in all_gather, at `"), \
        str(result)
    assert "(log_on_rank_0, line " in hint and "; rank 1 waited in " in hint
    assert "under `if rank == 0`" in hint


def test_task3_only_2_or_4_ranks_and_a_stub_is_not_written(learner):
    with pytest.raises(ValueError, match="world_size must be 2 or 4"):
        labs.check_job_training(lambda rank, world_size, steps: {}, 3)

    def train_job(rank, world_size, steps):
        ...
    assert wrong_lines(labs.check_job_training(train_job)) == ["not written yet"]


# -- task 4: the bytes per step -----------------------------------------------------------------


def sent(*edits):
    return variant("11_bytes_per_step", "bytes_per_step", *edits)


def test_task4_the_reference_passes_on_the_ledger_and_the_planner(runs, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = labs.check_bytes_per_step(sent(), runs, 2)
    assert result.passed, str(result)
    said = str(result)
    # the spread, then each run's ledger and the planner's bytes of each configuration at scale
    cases = len(assessment_bytes.configs()) + 2 * len(runs)
    assert result.facts["configurations"] == cases == 248 and f"{cases} configurations" in said
    assert result.facts["verdict"] == (f"the bytes per step of all {cases} configurations, the "
                                       f"ledger's and the planner's")
    assert "the stand-in's ledger, fsdp on 2 ranks: fsdp, bf16-mixed, no checkpointing: 264,864 B per step" in said
    assert "the planner, the job's model on 64 GPUs: fsdp, bf16-mixed, no checkpointing: " \
           "191,285,404,128 B per step" in said
    assert runs["fsdp"]["sent_bytes"] == 264864 and runs["ddp"]["sent_bytes"] == 360960


def test_task4_the_stand_ins_units_are_the_ledgers(runs):
    """The formula on units_of(shape) gives the ledger's bytes: the units are the real ones."""
    units = labs.units_of(fsdp_mini.planner.shapes.ModelShape.from_gpt(labs.JOB_GPT))
    assert sum(units.values()) == fsdp_mini.models.make_model(labs.JOB_GPT).num_params()
    for run in runs.values():
        assert math.isclose(labs.bytes_model(run["config"], units, 2), run["sent_bytes"],
                            rel_tol=1e-3)


def test_task4_a_check_runs_every_configuration_and_leaves_the_spread_as_it_was(runs, learner):
    """The units a check names for its own configurations do not join the spread of later
    checks, and a verdict says 'not run' only of configurations that were not."""
    spread = assessment_bytes.configs()
    result = labs.check_bytes_per_step(sent(("ring = (world_size - 1) / world_size", "ring = 1")),
                                       runs, 2)
    assert assessment_bytes.configs() == spread and len(spread) == 240
    assert not result.passed and result.facts["configurations"] == len(spread) + 2 * len(runs)
    assert "were not run" not in str(result), str(result)


def test_task4_a_wrong_number_an_error_and_a_stub_are_said_plainly(runs, learner):
    result = labs.check_bytes_per_step(lambda c, u, n: "many", runs, 2)
    assert len(wrong_lines(result)) == 1 and "the bytes of one step: yours 'many', the " \
        "reference 0" in wrong_lines(result)[0], str(result)
    assert hints(result) == ["return the number of bytes (an int or a float)"]

    result = labs.check_bytes_per_step(lambda c, u, n: 1000.0, runs, 2)
    assert wrong_lines(result)[0].startswith(
        "at strategy 'ddp', precision 'fp32', checkpointing False, world size 1, units 'equal': the "
        "bytes of one step: yours 1000, the reference 0; wrong in all "), str(result)

    def bytes_per_step(config, units, world_size):
        return units["blocks"]
    result = labs.check_bytes_per_step(bytes_per_step, runs, 2)
    assert "your code raised KeyError: 'blocks' (at `return units[\"blocks\"]` in " \
        "bytes_per_step)" in wrong_lines(result)[0], str(result)
    assert hints(result) == ["config is {strategy, precision, checkpointing}, units {name: "
                             "elements}, world_size N; return the bytes one rank sends in a step"]

    def bytes_per_step(config, units, world_size):  # noqa: F811
        ...
    assert wrong_lines(labs.check_bytes_per_step(bytes_per_step, runs, 2)) == [
        "bytes_per_step is not written yet: write its body in the cell above"]


# -- the grade and the report ---------------------------------------------------------------------

def check(passed: bool, verdict: str | None = None, task: str = "1") -> CheckResult:
    """A verdict as task ``task``'s checker would give it (its name recorded)."""
    result = CheckResult("a task")
    (result.ok if passed else result.wrong)("what the checker saw")
    if verdict:
        result.facts["verdict"] = verdict
    result.checker = next(t.checker for t in labs.TASKS if t.number == task)
    result.answer = f"answer-{task}"
    return result


def all_checks(passed=(True, True, True, True)) -> dict:
    return {str(i + 1): check(p, f"verdict {i + 1}", str(i + 1)) for i, p in enumerate(passed)}


def grade(tmp_path, passed=(True, True, True, True), **kw):
    return labs.grade_assessment(all_checks(passed), folder=tmp_path, **kw)


@pytest.mark.parametrize("passed, total, verdict", [
    ((True, True, True, True), 100, True), ((True, True, False, True), 75, True),
    ((False, True, False, True), 50, False), ((False, False, False, False), 0, False)])
def test_the_total_is_the_passed_tasks_points_and_75_pass(learner, tmp_path, passed, total,
                                                          verdict):
    report = grade(tmp_path, passed, attendee="Ada")
    assert (report.total, report.passed, report.max_total, report.pass_mark) == (total, verdict,
                                                                                 100, 75)
    assert [t.points for t in report.tasks] == [25 if p else 0 for p in passed]


def test_the_report_files_hold_the_scores_and_the_checkers_sentences(learner, tmp_path):
    report = grade(tmp_path, (True, False, True, True), attendee="Ada Lovelace")
    path = tmp_path / (labs.report_stem("Ada Lovelace") + ".json")
    assert report.json_path == str(path)
    data = json.loads(path.read_text())
    assert data["attendee"] == "Ada Lovelace" and data["total"] == 75 and data["passed"] is True
    assert data["reference_solutions"] is False and data["pass_mark"] == 75
    assert data["date"][:4].isdigit() and data["date"].endswith("+00:00")   # ISO, UTC
    task2 = data["tasks"][1]
    assert (task2["number"], task2["points"], task2["passed"], task2["message"]) == (
        "2", 0, False, "verdict 2")
    assert task2["lines"] == [{"ok": False, "message": "what the checker saw", "hint": ""}]
    md = (tmp_path / (labs.report_stem("Ada Lovelace") + ".md")).read_text()
    assert "# Assessment report: Ada Lovelace" in md and "**PASS**, 75 of 100 points" in md
    assert "| 2 · faster on the slow link: DDP or FSDP | 0 / 25 | ✘ | verdict 2 |" in md
    assert "not an attendee's work" not in md


def test_a_missing_check_scores_nothing_and_says_so(learner, tmp_path):
    report = labs.grade_assessment({"1": check(True)}, attendee="Ada", folder=tmp_path)
    assert report.total == 25 and not report.passed
    assert report.tasks[0].message == "what the checker saw" or report.tasks[0].passed
    assert report.tasks[3].message.startswith("not checked")
    with pytest.raises(ValueError, match="no task"):
        labs.grade_assessment({"5": check(True)}, folder=tmp_path)


def test_the_name_comes_from_user_when_attendee_is_empty(learner, tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "grace")
    report = grade(tmp_path, attendee="")
    assert report.attendee == "grace"
    assert Path(report.json_path).name == labs.report_stem("grace") + ".json"
    assert labs.report_stem("grace").startswith("assessment_report_grace-")
    assert labs.report_stem("../../etc/x y").startswith("assessment_report_etc_x_y-")  # stays in
    assert "/" not in labs.report_stem("../../etc/x y")                              # the folder


def test_the_report_goes_next_to_the_notebook(learner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # Note: a kernel runs in the notebook's folder
    report = labs.grade_assessment(all_checks(), attendee="Ada")
    assert Path(report.json_path).parent == tmp_path and Path(report.md_path).is_file()
    assert oct(Path(report.json_path).stat().st_mode & 0o777) == "0o644"   # readable by others


def test_a_report_of_the_reference_solutions_is_marked_and_kept_apart(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    report = labs.grade_assessment(all_checks(), attendee="Ada")
    assert report.reference_solutions and Path(report.json_path).parent == tmp_path / "tmp" / \
        "fsdp-mini-assessment"
    assert not list(tmp_path.glob("assessment_report_*"))      # nothing beside the notebook
    assert "this is not an attendee's work" in Path(report.md_path).read_text()


def test_a_report_is_replaced_whole_or_not_at_all(learner, tmp_path, monkeypatch):
    first = grade(tmp_path, (True, True, True, True), attendee="Ada")
    before = Path(first.json_path).read_text()
    grade(tmp_path, (False, True, True, True), attendee="Ada")     # replaced: 75 now
    assert json.loads(Path(first.json_path).read_text())["total"] == 75
    after_ok = Path(first.json_path).read_text()

    def fail(*args):
        raise OSError("disk full")
    monkeypatch.setattr(assessment.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        grade(tmp_path, (False, False, False, False), attendee="Ada")
    assert Path(first.json_path).read_text() == after_ok != before    # the old file, whole
    stem = labs.report_stem("Ada")
    assert sorted(p.name for p in tmp_path.iterdir()) == [stem + ".json", stem + ".md"]  # no temp



# -- a grade is bound to its task, its attendee and its answer -----------------------------------

def test_a_verdict_of_another_tasks_checker_is_refused(learner, tmp_path):
    first = check(True, task="1")
    with pytest.raises(ValueError, match=r"checks\['2'\] is the verdict of check_choose_config, "
                                         r"not of check_faster_on_link"):
        labs.grade_assessment({n: first for n in "1234"}, attendee="Ada", folder=tmp_path)
    for number in "234":   # task 1's verdict put under any other task
        with pytest.raises(ValueError, match=f"not of {labs.TASKS[int(number) - 1].checker}"):
            labs.grade_assessment({"1": check(True, task="1"), number: check(True, task="1")},
                                  attendee="Ada", folder=tmp_path)
    unbound = CheckResult("made by hand").ok("fine")
    with pytest.raises(ValueError, match="a verdict no checker of the assessment gave"):
        labs.grade_assessment({"3": unbound}, attendee="Ada", folder=tmp_path)
    same = check(True, task="2")
    with pytest.raises(ValueError, match="not of check_choose_config"):
        labs.grade_assessment({"1": same, "2": same}, attendee="Ada", folder=tmp_path)
    assert not list(tmp_path.iterdir())   # nothing graded, nothing written


def test_the_real_checkers_name_themselves_and_the_answer(learner, tmp_path):
    def choose_config(shape, gpus, gpu_mem_gb, micro_batch, headroom):
        return None
    verdict = labs.check_choose_config(choose_config)
    assert verdict.checker == "check_choose_config" and len(verdict.answer) == 16
    def choose_config(shape, gpus, gpu_mem_gb, micro_batch, headroom):  # noqa: F811
        return {"strategy": "fsdp", "precision": "fp32", "checkpointing": False}
    other = labs.check_choose_config(choose_config)
    assert other.answer != verdict.answer      # another answer, another digest
    report = labs.grade_assessment({"1": verdict}, attendee="Ada", folder=tmp_path)
    saved = json.loads(Path(report.json_path).read_text())["tasks"][0]
    assert (saved["checker"], saved["answer"]) == ("check_choose_config", verdict.answer)
    with pytest.raises(ValueError, match="check_choose_config, not of check_bytes_per_step"):
        labs.grade_assessment({"4": verdict}, attendee="Ada", folder=tmp_path)


def test_the_seal_changes_with_what_the_report_says(learner, tmp_path):
    report = grade(tmp_path, attendee="Ada")
    data = json.loads(Path(report.json_path).read_text())
    assert data["seal"] == report.seal == labs.seal_of(report) and len(report.seal) == 64
    report.attendee = "Bob"
    assert labs.seal_of(report) != data["seal"]
    report.attendee, report.tasks[2].answer = "Ada", "another"
    assert labs.seal_of(report) != data["seal"]


@pytest.mark.parametrize("first, second", [("山田太郎", "佐藤花子"), ("Ada Lovelace", "Ada_Lovelace"),
                                           ("José", "Jose"), ("Łukasz", "Lukasz"),
                                           ("a/b", "a_b"), ("ＡＢ", "AB")])
def test_two_attendees_never_share_a_report(learner, tmp_path, first, second):
    one = grade(tmp_path, (True, True, True, True), attendee=first)
    two = grade(tmp_path, (False, False, False, False), attendee=second)
    assert one.json_path != two.json_path and one.md_path != two.md_path
    assert json.loads(Path(one.json_path).read_text())["attendee"] == first
    assert json.loads(Path(two.json_path).read_text())["attendee"] == second
    assert Path(one.json_path).parent == Path(two.json_path).parent == tmp_path
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_non_latin_names_are_kept_in_the_file_name(learner, tmp_path):
    report = grade(tmp_path, attendee="山田太郎")
    assert "山田太郎" in Path(report.json_path).name
    assert "# Assessment report: 山田太郎" in Path(report.md_path).read_text(encoding="utf-8")


def test_another_attendees_report_is_never_replaced(learner, tmp_path, monkeypatch):
    ada = grade(tmp_path, attendee="Ada")
    before = Path(ada.json_path).read_text()
    monkeypatch.setattr(assessment, "report_stem", lambda name: "assessment_report_shared")
    shared = grade(tmp_path, attendee="Ada")                       # its own: replaced
    with pytest.raises(FileExistsError, match="is not 'Grace'.s report .*the report of 'Ada'"):
        grade(tmp_path, attendee="Grace")
    assert json.loads(Path(shared.json_path).read_text())["attendee"] == "Ada"
    Path(shared.json_path).write_text("not json")                    # not a report at all
    with pytest.raises(FileExistsError, match="kept as it is"):
        grade(tmp_path, attendee="Ada")
    assert Path(ada.json_path).read_text() == before


@pytest.mark.parametrize("checks, error, words", [
    ("1234", TypeError, r"must be a dict of each task's check"),
    (None, TypeError, r"must be a dict of each task's check, .* got None"),
    ([("1", None)], TypeError, r"must be a dict"),
    ({"1": None}, TypeError, r"checks\['1'\] must be what labs.check_choose_config"),
    ({"2": "passed"}, TypeError, r"checks\['2'\] must be .* got 'passed' \(a str\)"),
    ({"3": True}, TypeError, r"checks\['3'\] must be"),
    ({1: None}, ValueError, r"no task 1; the tasks are '1', '2', '3', '4' \(strings\)"),
    ({"5": None}, ValueError, r"no task '5'")])
def test_what_is_not_a_dict_of_verdicts_is_refused_by_name(learner, tmp_path, checks, error, words):
    with pytest.raises(error, match=words):
        labs.grade_assessment(checks, attendee="Ada", folder=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("attendee, error", [(42, TypeError), (["Ada"], TypeError),
                                             (b"Ada", TypeError), ("Ada\tB", ValueError),
                                             ("Ada\x00", ValueError), ("Ada\nBob", ValueError)])
def test_an_attendee_that_is_not_a_name_is_refused(learner, tmp_path, attendee, error):
    with pytest.raises(error, match="grade_assessment\\(attendee\\)"):
        grade(tmp_path, attendee=attendee)
    assert not list(tmp_path.iterdir())


def test_a_folder_that_is_not_a_path_is_refused(learner, tmp_path):
    with pytest.raises(TypeError, match=r"grade_assessment\(folder\) must be a folder's path"):
        labs.grade_assessment(all_checks(), attendee="Ada", folder=42)

# -- the notebook ---------------------------------------------------------------------------------

def test_the_stubs_are_not_written_and_ci_runs_the_solutions(monkeypatch):
    cells = notebook_cells()
    stubs = {name: next(c.source for c in cells if c.source.startswith(f'@labs.exercise("{name}")'))
             for name in ("11_choose_config", "11_faster_on_link", "11_bytes_per_step")}
    for name, source in stubs.items():
        monkeypatch.setenv("CI", "false")
        ns = {"labs": labs}
        exec(source, ns)
        fn = next(v for k, v in ns.items() if getattr(v, "exercise", None) == name)
        assert labs.not_written_yet(fn), name
        monkeypatch.setenv("CI", "true")
        exec(source, ns)
        fn = next(v for k, v in ns.items() if getattr(v, "exercise", None) == name)
        assert fn.__code__.co_filename.endswith(f"{name}.py")


def test_the_notebook_keeps_the_broken_function_and_grades_all_four_tasks():
    text = "\n".join(c.source for c in notebook_cells())
    assert 'torch.manual_seed(rank)                               # "each rank its own shuffle"' in text
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), labs.JOB_MAX_NORM)" in text
    assert "/ labs.JOB_MICRO_BATCHES" not in text and "/ micro_batches" not in text
    assert ('labs.grade_assessment({"1": check_1, "2": check_2, "3": check_3, "4": check_4},'
            in text) and 'ATTENDEE = ""' in text
    first = notebook_cells()[0].source
    assert "**Time:** about 5 min teaching" in first and "40 min exercises" in first
    row = next(line for line in (ROOT / "labs" / "README.md").read_text().splitlines()
               if line.startswith("| `11_assessment"))
    assert "5 + 40 min" in row


def test_no_report_is_left_in_the_labs_folder():
    assert not list((ROOT / "labs").glob("assessment_report_*")), "a run left its report in labs/"


@pytest.mark.filterwarnings("ignore:Cell is missing an id field")   # the other labs' notebooks
def test_the_job_is_one_no_lab_uses():
    text = "\n".join(c.source for p in sorted((ROOT / "labs").glob("[01][0-9]_*.ipynb"))
                     if p.stem != "11_assessment" for c in nbformat.read(p, as_version=4).cells)
    assert "job_net" not in text and "n_embd=48" not in text and "6656" not in text
    assert labs.JOB.shape not in (fsdp_mini.planner.shapes.PRESETS["7b"],
                                  fsdp_mini.planner.shapes.PRESETS["70b"], labs.lab07.checks.GPT_1B)
    assert os.path.basename(str(NOTEBOOK)) == "11_assessment.ipynb"
