"""The assessment (lab 11): each task's checker passes the reference solution and rejects the
plausible wrong answers, each with a sentence that names the mistake; the grading adds the points,
applies the pass mark and writes the report (JSON and Markdown, each atomically).

Wrong answers are the reference solutions with one slip each, as an attendee writes them (lab 07's
tests do the same). Tasks 2 and 4 are checked on the ledger of one real run of the stand-in on 2
ranks; task 3's wrong functions train in one launch, and the checker's judging is applied to what
the ranks returned (the checker itself launches one function at a time: tried here on the
notebook's broken function and on a hang).
"""

import json
import math
import os
import tempfile
from pathlib import Path

import nbformat
import pytest
from assessment_workers import log_on_rank_0, weights_of_each

import fsdp_mini
from fsdp_mini import labs
from fsdp_mini.labs import CheckFailed, CheckResult
from fsdp_mini.labs.lab11 import assessment
from fsdp_mini.labs.lab11 import train as assessment_train

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "labs" / "11_assessment.ipynb"


@pytest.fixture
def learner(monkeypatch):
    """As on an attendee's laptop: a failed check reports, it does not raise."""
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("FSDP_MINI_SOLUTIONS", raising=False)


def variant(solution, attribute, *edits):
    """The reference solution with (old, new) source edits: an attendee's version of it."""
    source = (ROOT / "labs" / "solutions" / f"{solution}.py").read_text()
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    namespace = {"__name__": "attendee"}
    exec(compile(source, f"attendee_{solution}", "exec"), namespace)
    return namespace[attribute]


def wrong_lines(result):
    return [msg for ok, msg, _ in result.lines if not ok]


def named(result):
    """The last ✘ line and its hint: where a checker names the mistake."""
    last = [(msg, hint) for ok, msg, hint in result.lines if not ok][-1]
    return last


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
FITS = "if s.peak_bytes <= limit and"
TASK1 = {
    "no headroom": ([(LIMIT, "limit = gpu_mem_gb * 1e9")], "the headroom was not kept"),
    "the plan's own fits": ([(FITS, "if s.fits and")], "the headroom was not kept"),
    "GiB": ([(LIMIT, "limit = (1 - headroom) * gpu_mem_gb * 2**30")],
            "you read the budget in GiB (2^30 B)"),
    "GiB, no headroom": ([(LIMIT, "limit = gpu_mem_gb * 2**30")],
                         "no headroom, and GB (10^9 B) read as GiB"),
    "10 % always": ([(LIMIT, "limit = 0.9 * gpu_mem_gb * 1e9")],
                    "you kept 10 % free whatever the headroom asked"),
    "headroom on the peak": ([(FITS, "if s.peak_bytes * (1 + headroom) <= gpu_mem_gb * 1e9 and")],
                             "you kept the headroom on the peak"),
    "activations": ([("fsdp_mini.plan(model=model,", "fsdp_mini.plan(params=model.params(),")],
                    "you ignored the activations"),
    "fp32 only": ([('PRECISIONS = ("fp32", "bf16-mixed")', 'PRECISIONS = ("fp32",)')],
                  "you did not consider bf16-mixed"),
    "no checkpointing": ([("for checkpointing in (False, True):",
                           "for checkpointing in (False,):")],
                         "you did not consider activation checkpointing"),
    "persistent": ([(FITS, "if s.persistent_bytes <= limit and")],
                   "fit by the state kept between steps (persistent_bytes)"),
    "smallest peak": ([("cost = (s.sent_bytes_per_step, checkpointing, STRATEGIES.index(strategy))",
                        "cost = s.peak_bytes")], "you picked the smallest peak"),
    "no fit check": ([(FITS, "if")], "whether or not it fits"),
}


def choose(*edits):
    return variant("11_choose_config", "choose_config", *edits)


def test_task1_the_reference_passes_and_names_the_jobs_configuration(monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = labs.check_choose_config(choose())
    assert result.passed, str(result)
    assert ("32b on 64 GPUs of 80 GB, micro-batch 1, 10% headroom: fsdp, bf16-mixed, no "
            "checkpointing: planned peak 41.3 GB <= 72.0 GB (80 GB less 10%)") in str(result)
    assert "20% headroom: nothing fits, rightly" in str(result)
    assert result.facts["verdict"].endswith("for the job: fsdp, bf16-mixed, no checkpointing")


@pytest.mark.parametrize("mistake", TASK1)
def test_task1_each_mistake_is_named_once(learner, mistake):
    edits, words = TASK1[mistake]
    result = labs.check_choose_config(choose(*edits))
    assert not result.passed
    budget_lines = [m for m in wrong_lines(result) if " GPUs of " in m]
    assert len(wrong_lines(result)) == len(budget_lines) + 1, str(result)
    assert words in named(result)[0] and result.facts["verdict"] == named(result)[0], str(result)


def test_task1_a_plan_to_the_last_gb_is_told_what_the_headroom_leaves(learner):
    said = str(labs.check_choose_config(choose((LIMIT, "limit = gpu_mem_gb * 1e9"))))
    assert ("32b on 64 GPUs of 80 GB, micro-batch 1, 10% headroom: zero2, bf16-mixed, with "
            "checkpointing fits 80 GB with no headroom: its planned peak 73.2 GB is over 72.0 GB "
            "(80 GB less 10%)") in said


def test_task1_a_configuration_over_the_gpu_says_its_peak(learner):
    def always_ddp(model, gpus, gpu_mem_gb, micro_batch, headroom):
        return {"strategy": "ddp", "precision": "bf16-mixed", "checkpointing": False}
    said = str(labs.check_choose_config(always_ddp))
    assert ("32b on 64 GPUs of 80 GB, micro-batch 1, 10% headroom: ddp, bf16-mixed, no "
            "checkpointing does not fit the GPU: its planned peak is 522.2 GB > 80 GB") in said


def test_task1_a_wrong_line_says_what_is_wrong_without_giving_the_answer_away(learner):
    result = labs.check_choose_config(choose(*TASK1["fp32 only"][0]))
    job_line = next(m for m in wrong_lines(result) if m.startswith("32b on 64 GPUs"))
    assert job_line.endswith("fsdp, fp32, with checkpointing fits, but it is not the cheapest: it "
                             "sends 382.6 GB per step; one that fits sends 191.3 GB")
    assert "bf16" not in job_line
    result = labs.check_choose_config(choose(*TASK1["smallest peak"][0]))   # a tie in bytes
    job_line = next(m for m in wrong_lines(result) if m.startswith("32b on 64 GPUs"))
    assert job_line.endswith("another that fits sends as few: at equal bytes no checkpointing "
                             "comes first, then the less sharded strategy")


def test_task1_another_right_method_passes(learner):
    """The planner's own fits, asked with the memory the headroom leaves."""
    right = choose(("gpu_mem_gb=gpu_mem_gb, precision", "gpu_mem_gb=(1 - headroom) * gpu_mem_gb, "
                    "precision"), (FITS, "if s.fits and"))
    assert labs.check_choose_config(right).passed


def test_task1_a_stub_an_error_and_a_wrong_form_are_one_line_each(learner):
    def choose_config(model, gpus, gpu_mem_gb, micro_batch, headroom):
        ...   # your code here
    assert wrong_lines(labs.check_choose_config(choose_config)) == [
        "choose_config is not written yet: write its body in the cell above"]
    assert wrong_lines(labs.check_choose_config(lambda *a: 1 / 0)) == [
        "choose_config('32b' shape, 64, 80, 1, 0.1) raised ZeroDivisionError: division by zero"]
    wrong = wrong_lines(labs.check_choose_config(lambda *a: ("fsdp", "bf16-mixed", False)))
    assert len(wrong) == 1 and "return a dict with the keys strategy" in wrong[0]


def test_task1_in_ci_a_failure_raises_with_the_words(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(CheckFailed, match="the headroom was not kept"):
        labs.check_choose_config(choose(*TASK1["no headroom"][0]))


# -- task 2: faster on the slow link ---------------------------------------------------------------

LATENCY = '(2 if c["op"] == "all_reduce" else 1) * (world_size - 1) * alpha'
STEP = 'run["compute_s"] + latency + transfer'
FASTER = '"faster": min(seconds, key=seconds.get)'
TASK2 = {
    "α once": ([(LATENCY, "alpha")], "you paid α once per collective"),
    "all-reduce's α": ([(LATENCY, "(world_size - 1) * alpha")],
                       "you paid (N−1)α for the all-reduce"),
    "no latency": ([(STEP, 'run["compute_s"] + transfer')], "you left out the latency"),
    "payload, no /N": ([('c["sent_bytes"]', 'c["payload_bytes"]')],
                       "you divided the whole payload by the bandwidth"),
    "bits": ([("bandwidth_gbs * 1e9", "bandwidth_gbs * 1e9 / 8")], "off by 8"),
    "GiB/s": ([("bandwidth_gbs * 1e9", "bandwidth_gbs * 2**30")], "read as GiB/s"),
    "no compute": ([(STEP, "latency + transfer")], "you left out the compute"),
    "overlap": ([(STEP, 'max(run["compute_s"], latency + transfer)')],
                "hidden behind the compute"),
    "milliseconds": ([(STEP, f"({STEP}) * 1e3")], "your times are in milliseconds"),
    "fewer bytes wins": ([(FASTER, '"faster": min(runs, key=lambda n: sum(c["sent_bytes"] for c '
                                   'in runs[n]["collectives"]))')],
                         "you called the run that sends fewer bytes the faster one"),
    "reversed": ([(FASTER, '"faster": max(seconds, key=seconds.get)')],
                 "you named the slower run as the faster one"),
}


def link_check(runs, fn):
    return labs.check_faster_on_link(fn, {"ddp": runs["ddp"], "fsdp": runs["fsdp"]}, 2)


def on_link(*edits):
    return variant("11_faster_on_link", "faster_on_link", *edits)


def test_task2_the_reference_passes_and_says_ddp_wins_on_the_jobs_link(runs, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = link_check(runs, on_link())
    assert result.passed, str(result)
    job = result.facts["job"]
    assert job["faster"] == "ddp" and job["fsdp"] > job["ddp"]
    said = str(result)
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


@pytest.mark.parametrize("mistake", TASK2)
def test_task2_each_mistake_is_named(runs, learner, mistake):
    edits, words = TASK2[mistake]
    result = link_check(runs, on_link(*edits))
    assert not result.passed
    assert words in named(result)[0] and result.facts["verdict"] == named(result)[0], str(result)


def test_task2_always_fsdp_is_told_on_the_jobs_link(runs, learner):
    result = link_check(runs, on_link((FASTER, '"faster": "fsdp"')))
    job_line = next(m for m in wrong_lines(result) if "(the job's link)" in m)
    assert "FSDP is faster; the α-β model says" in job_line and job_line.endswith("DDP is faster")
    assert not any(m.startswith("you ") for m in wrong_lines(result))   # no known slip: none named


def test_task2_a_stub_an_error_and_a_wrong_form_are_one_line_each(runs, learner):
    def faster_on_link(runs, world_size, bandwidth_gbs, latency_us):
        ...   # your code here
    assert wrong_lines(link_check(runs, faster_on_link))[0].startswith(
        "faster_on_link is not written yet")
    assert "raised KeyError: 'compute'" in wrong_lines(
        link_check(runs, lambda r, *a: r["ddp"]["compute"]))[0]
    wrong = wrong_lines(link_check(runs, lambda *a: "ddp"))
    assert len(wrong) == 1 and "return a dict with the keys ddp, fsdp (seconds) and faster" in wrong[0]


# -- task 3: the training function trains like one process ----------------------------------------

SEED = "torch.manual_seed(0)"
ROWS = "mine = order[rank * n:(rank + 1) * n]"
LOSS = "loss = nn.functional.mse_loss(model(xm), ym) / micro_batches"
CLIP = "fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM)"
BACKWARD = "            loss.backward()\n"
TASK3 = {  # name: (edits of the reference, words the checker must say)
    "seed per rank": ([(SEED, "torch.manual_seed(rank)")],
                      ["each rank shuffled the batch with its own seed"]),
    "the same rows on every rank": ([(ROWS, "mine = order[:n]")],
                                    ["every rank trained on the same rows"]),
    "micro-batches added": ([(LOSS, "loss = nn.functional.mse_loss(model(xm), ym)")],
                            ["the 3 micro-batches' losses were added, not averaged"]),
    "loss divided by N": ([(LOSS, LOSS + " / world_size")],
                          ["the loss was divided by the world size"]),
    "no clipping": ([(CLIP, "pass")], ["the gradients were not clipped"]),
    "zero_grad between micro-batches": ([(BACKWARD,
                                          "            optimizer.zero_grad()\n" + BACKWARD)],
                                        ["only the last micro-batch's gradient"]),
    "clip fixed only (seed and sum left)": (
        [(SEED, "torch.manual_seed(rank)"), (LOSS, "loss = nn.functional.mse_loss(model(xm), ym)")],
        ["each rank shuffled the batch with its own seed", "; and the 3 micro-batches' losses"]),
    "no fsdp, no averaging": (
        [('model, optimizer = fsdp_mini.parallelize(labs.job_net(), "fsdp", '
          'optimizer=labs.job_sgd)',
          "model = labs.job_net(); optimizer = labs.job_sgd(model.parameters())"),
         (CLIP, "torch.nn.utils.clip_grad_norm_(model.parameters(), labs.JOB_MAX_NORM)"),
         ("return fsdp_mini.full_state_dict(model)", "return model.state_dict()")],
        ["the ranks hold different weights after 4 steps"]),
}
RIGHT = {"the reference": [],
         "its own shuffle generator, seeded the same": [
             (SEED, "torch.manual_seed(rank)"),
             ("order = torch.randperm(len(x))",
              "order = torch.randperm(len(x), generator=torch.Generator().manual_seed(step))")]}


def training(*edits):
    return variant("11_fix_training", "train_job", *edits)


@pytest.fixture(scope="module")
def trained():
    """Every task-3 function that runs to the end, trained on 2 ranks in one launch."""
    fns = {**{k: training(*e) for k, e in RIGHT.items()},
           **{k: training(*e) for k, (e, _) in TASK3.items()}}
    out = fsdp_mini.launch(weights_of_each, 2, list(fns.values()), labs.JOB_STEPS, timeout=30)
    return {name: [by_rank[i] for by_rank in out] for i, name in enumerate(fns)}


def judged(trained, name) -> CheckResult:
    return assessment_train._judge(CheckResult(name), trained[name])


@pytest.mark.parametrize("name", RIGHT)
def test_task3_right_fixes_train_like_one_process(trained, name):
    result = judged(trained, name)
    assert result.passed and "2 ranks train like one process" in str(result), str(result)
    assert result.facts["parity_error"] < 1e-6


@pytest.mark.parametrize("mistake", TASK3)
def test_task3_each_mistake_is_named(trained, mistake):
    result = judged(trained, mistake)
    assert not result.passed
    for words in TASK3[mistake][1]:
        assert words in named(result)[0], str(result)


@pytest.mark.parametrize("mistake", assessment_train.MISTAKES)
def test_task3_each_replayed_mistake_is_named_on_4_ranks_too(mistake):
    """The judging alone, on the weights a mistake gives on 4 simulated ranks (no launch)."""
    knobs, words, _ = assessment_train.MISTAKES[mistake]
    result = CheckResult("replay")
    got = labs.job_replay(4, **knobs)
    assessment_train._name_mistakes(result, got, 4, labs.relative_difference(
        got, labs.job_one_process()))
    assert named(result)[0].endswith(words), str(result)


def test_task3_the_replay_of_one_rank_is_the_one_process_answer():
    one = labs.job_one_process()
    assert labs.relative_difference(labs.job_replay(2), one) < 1e-6
    assert labs.relative_difference(labs.job_replay(1, clip=None), one) > 1e-3  # clipping matters


def notebook_cells():
    return nbformat.read(NOTEBOOK, as_version=4).cells


def test_task3_the_notebooks_broken_function_is_stopped_at_torchs_clip(learner):
    """The function as the attendee finds it, through the checker's own launch."""
    cell = next(c.source for c in notebook_cells()
                if c.source.startswith('@labs.exercise("11_fix_training")'))
    namespace = {"__name__": "attendee"}
    exec(compile("import torch\nfrom torch import nn\nimport fsdp_mini\nfrom fsdp_mini import "
                 "labs\n" + cell, "attendee_cell", "exec"), namespace)
    result = labs.check_job_training(namespace["train_job"])
    said = str(result)
    assert any(f"rank {r} raised GradientsChangedError" in said for r in (0, 1)), said
    assert "fsdp_mini.clip_grad_norm_(model, max_norm)" in said
    assert result.facts["verdict"] == "torch's clip_grad_norm_ on sharded gradients"


def test_task3_a_hang_is_stopped_and_its_place_named(learner, monkeypatch):
    monkeypatch.setattr(assessment_train, "CHECK_TIMEOUT", 3)
    result = labs.check_job_training(log_on_rank_0)
    said = str(result)
    assert "the ranks did not finish" in said and "under `if rank == 0`" in said
    assert "Where they waited: rank 0 at `" in said


def test_task3_only_2_or_4_ranks_and_a_stub_is_not_written(learner):
    with pytest.raises(ValueError, match="world_size must be 2 or 4"):
        labs.check_job_training(lambda rank, world_size, steps: {}, 3)

    def train_job(rank, world_size, steps):
        ...
    assert wrong_lines(labs.check_job_training(train_job)) == ["not written yet"]


# -- task 4: the bytes per step -----------------------------------------------------------------

SIZE_FSDP = "sent += ring * numel * (gathers * size + size)"
GATHERS = 'gathers = 1 if name == "root" else 2'
DDP = "return 2 * ring * psi * size"
ZERO = "return ring * psi * (size + size)"
TASK4 = {
    "DDP's formula for FSDP": ([('if config["strategy"] == "ddp":',
                                 'if config["strategy"] in ("ddp", "fsdp"):')],
                               "you used DDP's formula for FSDP"),
    "fp32 bytes for a bf16 all-gather": ([(SIZE_FSDP,
                                           "sent += ring * numel * (gathers * 4 + size)"),
                                          (ZERO, "return ring * psi * (size + 4)")],
                                         "you counted bf16-mixed all-gathers in fp32"),
    "fp32 gradients in bf16-mixed": ([(SIZE_FSDP, "sent += ring * numel * (gathers * size + 4)"),
                                      (ZERO, "return ring * psi * (4 + size)"),
                                      (DDP, "return 2 * ring * psi * 4")],
                                     "you counted bf16-mixed gradients in fp32"),
    "no (N-1)/N": ([("ring = (world_size - 1) / world_size", "ring = 1")],
                   "the (N−1)/N is missing"),
    "all-reduce as one pass": ([(DDP, "return ring * psi * size")],
                               "you counted DDP's all-reduce as one pass"),
    "the root gathered twice": ([(GATHERS, "gathers = 2")], "you gathered the root twice"),
    "checkpointing re-gathers": ([(GATHERS, 'gathers = 1 if name == "root" else 2 + '
                                            'config["checkpointing"]')],
                                 "you added all-gathers for checkpointing"),
    "bits": ([("    return sent\n", "    return 8 * sent\n"),
              (DDP, "return 8 * 2 * ring * psi * size"),
              (ZERO, "return 8 * ring * psi * (size + size)")], "off by 8: you counted bits"),
}


def sent(*edits):
    return variant("11_bytes_per_step", "bytes_per_step", *edits)


def test_task4_the_reference_passes_on_the_ledger_and_the_planner(runs, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = labs.check_bytes_per_step(sent(), runs, 2)
    assert result.passed, str(result)
    said = str(result)
    assert "the stand-in's ledger, fsdp on 2 ranks: fsdp, bf16-mixed, no checkpointing: 264,864 B per step" in said
    assert "the planner, the job's model on 64 GPUs: fsdp, bf16-mixed," in said
    assert runs["fsdp"]["sent_bytes"] == 264864 and runs["ddp"]["sent_bytes"] == 360960


def test_task4_the_stand_ins_units_are_the_ledgers(runs):
    """The formula on units_of(shape) gives the ledger's bytes: the units are the real ones."""
    units = labs.units_of(fsdp_mini.planner.shapes.ModelShape.from_gpt(labs.JOB_GPT))
    assert sum(units.values()) == fsdp_mini.models.make_model(labs.JOB_GPT).num_params()
    for run in runs.values():
        assert math.isclose(labs.bytes_model(run["config"], units, 2), run["sent_bytes"],
                            rel_tol=1e-3)


@pytest.mark.parametrize("mistake", TASK4)
def test_task4_each_mistake_is_named(runs, learner, mistake):
    edits, words = TASK4[mistake]
    result = labs.check_bytes_per_step(sent(*edits), runs, 2)
    assert not result.passed
    assert words in named(result)[0] and result.facts["verdict"] == named(result)[0], str(result)


def test_task4_a_wrong_number_and_a_stub_are_said_plainly(runs, learner):
    wrong = wrong_lines(labs.check_bytes_per_step(lambda c, u, n: "many", runs, 2))
    assert "you returned 'many', not a number of bytes" in wrong[0]
    wrong = wrong_lines(labs.check_bytes_per_step(lambda c, u, n: 1000.0, runs, 2))
    assert "ddp, fp32, no checkpointing: you say 1,000 B, it sends 360,960 B" in wrong[0]

    def bytes_per_step(config, units, world_size):
        ...
    assert wrong_lines(labs.check_bytes_per_step(bytes_per_step, runs, 2))[0].startswith(
        "bytes_per_step is not written yet")


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
