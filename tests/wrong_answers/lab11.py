"""The assessment's wrong answers, its four tasks: each reference solution with one edit, as an
attendee writes it from the notebook's words; judged in one batch per task by the task's check
(``JUDGES`` of ``fit.py``, ``link.py``, ``bytes.py``: the synthetic runs, no launch; of
``train.py``: the training functions on 1-4 ranks, one launch per world size)."""

from pathlib import Path

from . import Wrong

SOLUTIONS = Path(__file__).resolve().parents[2] / "labs" / "solutions"


def variant(solution: str, attribute: str, *edits):
    """The reference solution with (old, new) source edits: an attendee's version of it."""
    source = (SOLUTIONS / f"{solution}.py").read_text()
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    namespace = {"__name__": "attendee"}
    exec(compile(source, f"attendee_{solution}", "exec"), namespace)
    return namespace[attribute]


# -- task 1: choose_config ---------------------------------------------------------------------

T1 = "11_choose_config"
LIMIT = "limit = (1 - headroom) * gpu_mem_gb * 1e9"
FITS = "if s.peak_bytes <= limit and"
COST = ("cost = (s.sent_bytes_per_step, checkpointing, STRATEGIES.index(strategy),\n"
        "                        PRECISIONS.index(precision))")
REDUCE = ',\n                               reduce_dtype="bf16" if precision == "bf16-mixed" else None'


def choose(*edits):
    return variant(T1, "choose_config", *edits)


# -- task 2: faster_on_link --------------------------------------------------------------------

T2 = "11_faster_on_link"
LATENCY = '(2 if c["op"] == "all_reduce" else 1) * (world_size - 1) * alpha'
STEP = 'run["compute_s"] + latency + transfer'
FASTER = '"faster": min(seconds, key=seconds.get)'


def on_link(*edits):
    return variant(T2, "faster_on_link", *edits)


# -- task 3: train_job (the team's training function) -----------------------------------------

T3 = "11_fix_training"
SEED = "torch.manual_seed(0)"
ROWS = "mine = order[rank * n:(rank + 1) * n]"
LOSS = "loss = nn.functional.mse_loss(model(xm), ym) / micro_batches"
ADDED = "loss = nn.functional.mse_loss(model(xm), ym)"
CLIP = "fsdp_mini.clip_grad_norm_(model, labs.JOB_MAX_NORM)"
TORCH_CLIP = "torch.nn.utils.clip_grad_norm_(model.parameters(), labs.JOB_MAX_NORM)"
BACKWARD = "            loss.backward()\n"
PARALLELIZE = 'model, optimizer = fsdp_mini.parallelize(labs.job_net(), "fsdp", optimizer=labs.job_sgd)'


def training(*edits):
    return variant(T3, "train_job", *edits)


# -- task 4: bytes_per_step --------------------------------------------------------------------

T4 = "11_bytes_per_step"
SIZE_FSDP = "sent += ring * numel * (gathers * size + size)"
GATHERS = 'gathers = 1 if name == "root" else 2'
DDP = "return 2 * ring * psi * size"
ZERO = "return ring * psi * (size + size)"


def sent(*edits):
    return variant(T4, "bytes_per_step", *edits)


WRONG = [
    Wrong(T1, "no headroom kept", choose((LIMIT, "limit = gpu_mem_gb * 1e9")),
          ("never change with headroom", "the headroom was not kept")),
    Wrong(T1, "the planner's own fits, not the headroom", choose((FITS, "if s.fits and")),
          ("never change with headroom", "the headroom was not kept")),
    Wrong(T1, "the budget read in GiB", choose((LIMIT, "limit = (1 - headroom) * gpu_mem_gb * 2**30")),
          ("you read the budget in gib (2^30 b)",)),
    Wrong(T1, "10 % kept whatever the headroom", choose((LIMIT, "limit = 0.9 * gpu_mem_gb * 1e9")),
          ("never change with headroom",)),
    Wrong(T1, "the headroom kept on the peak",
          choose((FITS, "if s.peak_bytes * (1 + headroom) <= gpu_mem_gb * 1e9 and")),
          ("you kept the headroom on the peak",)),
    Wrong(T1, "activations ignored (a parameter count planned)",
          choose(("fsdp_mini.plan(model=model,", "fsdp_mini.plan(params=model.params(),")),
          ("it fits without its activations",)),
    Wrong(T1, "fp32 only", choose(('PRECISIONS = ("fp32", "bf16-mixed")', 'PRECISIONS = ("fp32",)')),
          ("you never chose bf16-mixed",)),
    Wrong(T1, "fits by the state kept between steps",
          choose((FITS, "if s.persistent_bytes <= limit and")),
          ("its state kept between steps (persistent_bytes) fits, not its peak",)),
    Wrong(T1, "the smallest peak taken for the cheapest", choose((COST, "cost = s.peak_bytes")),
          ("fits but costs more", "the smallest planned peak")),
    Wrong(T1, "no fit check", choose((FITS, "if")),
          ("the cheapest of all candidates, fitting or not",)),
    Wrong(T1, "bf16-mixed planned without reduce_dtype='bf16'", choose((REDUCE, "")),
          ("reduced in fp32",)),
    Wrong(T1, "bytes only, the later candidate kept on a tie",
          choose((COST, "cost = s.sent_bytes_per_step"), ("cost < best_cost", "cost <= best_cost")),
          ("another that fits costs as little", "no checkpointing comes first")),
    Wrong(T1, "no headroom, and GB read as GiB", choose((LIMIT, "limit = gpu_mem_gb * 2**30")),
          ("no headroom, and gb (10^9 b) read as gib",)),
    Wrong(T1, "checkpointing never considered",
          choose(("for checkpointing in (False, True):", "for checkpointing in (False,):")),
          ("you never chose with checkpointing",)),
    Wrong(T2, "α once per collective", on_link((LATENCY, "alpha")),
          ("latency x0 (the model: x1)", "α per collective x1")),
    Wrong(T2, "(N−1)α for the all-reduce", on_link((LATENCY, "(world_size - 1) * alpha")),
          ("(n−1)α per all-reduce x-1",)),
    Wrong(T2, "no latency", on_link((STEP, 'run["compute_s"] + transfer')),
          ("latency x0 (the model: x1)",)),
    Wrong(T2, "the whole payload over the bandwidth", on_link(('c["sent_bytes"]', 'c["payload_bytes"]')),
          ("payload / b x1 (the model: x0)", "sent bytes / b x0")),
    Wrong(T2, "bits per second", on_link(("bandwidth_gbs * 1e9", "bandwidth_gbs * 1e9 / 8")),
          ("sent bytes / b x8", "bits, not bytes")),
    Wrong(T2, "GiB/s", on_link(("bandwidth_gbs * 1e9", "bandwidth_gbs * 2**30")),
          ("gib (2³⁰ b), not gb",)),
    Wrong(T2, "no compute", on_link((STEP, "latency + transfer")), ("compute x0 (the model: x1)",)),
    Wrong(T2, "communication hidden behind the compute (max)",
          on_link((STEP, 'max(run["compute_s"], latency + transfer)')),
          ("right only where there is no compute", "add up")),
    Wrong(T2, "milliseconds", on_link((STEP, f"({STEP}) * 1e3")), ("milliseconds, not seconds",)),
    Wrong(T2, "the run with fewer bytes called faster",
          on_link((FASTER, '"faster": min(runs, key=lambda n: sum(c["sent_bytes"] for c in '
                           'runs[n]["collectives"]))')),
          ("you named the run that sends fewer bytes",)),
    Wrong(T2, "the slower run named", on_link((FASTER, '"faster": max(seconds, key=seconds.get)')),
          ("your times are right, but not the run you named",)),
    Wrong(T2, "always fsdp named the faster", on_link((FASTER, '"faster": "fsdp"')),
          ("your times are right, but not the run you named",)),
    Wrong(T3, "a seed per rank (each rank its own shuffle)", training((SEED, "torch.manual_seed(rank)")),
          ("the rows the nets were fed in step 1", "one shuffle on every rank")),
    Wrong(T3, "the same rows on every rank", training((ROWS, "mine = order[:n]")),
          ("twice", "never", "the ranks' rows overlap")),
    Wrong(T3, "the micro-batches' losses added", training((LOSS, ADDED)),
          ("with 3 micro-batches each update is 3x the reference's", "their losses were added")),
    Wrong(T3, "each micro-batch's loss divided by 2", training((LOSS, ADDED + " / 2")),
          ("0.5x the reference's with 1 micro-batch, 1.5x with 3",)),
    Wrong(T3, "the loss divided by the world size", training((LOSS, LOSS + " / world_size")),
          ("right with world size 1", "1/n of the reference's update",
           "the loss divided by the world size")),
    Wrong(T3, "no clipping", training((CLIP, "pass")), ("wrong only where the reference clips",)),
    Wrong(T3, "zero_grad between micro-batches",
          training((BACKWARD, "            optimizer.zero_grad()\n" + BACKWARD)),
          ("right with micro batches 1, wrong with 3",
           "every micro-batch's gradient must reach the step")),
    Wrong(T3, "each rank's rows cut by a fixed count (12)",
          training(("n = len(x) // world_size", "n = 12")),
          ("right with world size 2, wrong with 1, 3, 4", "leave rows out")),
    Wrong(T3, "torch's clip_grad_norm_ on the shards", training((CLIP, TORCH_CLIP)),
          ("raised gradientschangederror", "fsdp_mini.clip_grad_norm_(model, labs.job_max_norm)")),
    Wrong(T3, "the clip fixed only (the seed per rank and the added losses left)",
          training((SEED, "torch.manual_seed(rank)"), (LOSS, ADDED)),
          ("with 3 micro-batches each update is 3x the reference's",)),
    Wrong(T3, "no fsdp (a plain module, torch's clip, its own state_dict)",
          training((PARALLELIZE, "model = labs.job_net(); optimizer = labs.job_sgd(model.parameters())"),
                   (CLIP, TORCH_CLIP),
                   ("return fsdp_mini.full_state_dict(model)", "return model.state_dict()")),
          ("are missing in yours", "fsdp's all-gathers and reduce-scatters")),
    Wrong(T4, "DDP's formula for FSDP", sent(('if config["strategy"] == "ddp":',
                                            'if config["strategy"] in ("ddp", "fsdp"):')),
          ("your fsdp bytes are the reference's ddp",)),
    Wrong(T4, "fp32 bytes for bf16-mixed all-gathers",
          sent((SIZE_FSDP, "sent += ring * numel * (gathers * 4 + size)"),
               (ZERO, "return ring * psi * (size + 4)")), ("bf16-mixed", "6 b per element")),
    Wrong(T4, "fp32 gradients in bf16-mixed",
          sent((SIZE_FSDP, "sent += ring * numel * (gathers * size + 4)"),
               (ZERO, "return ring * psi * (4 + size)"), (DDP, "return 2 * ring * psi * 4")),
          ("bf16-mixed", "8 b per element (the reference 4)")),
    Wrong(T4, "no (N−1)/N", sent(("ring = (world_size - 1) / world_size", "ring = 1")),
          ("the (n−1)/n is missing",)),
    Wrong(T4, "DDP's all-reduce as one pass", sent((DDP, "return ring * psi * size")),
          ("ddp, fp32", "4 b per element (the reference 8)", "2 passes")),
    Wrong(T4, "the root gathered twice", sent((GATHERS, "gathers = 2")),
          ("per root element (the reference 8)", "the root gathered once")),
    Wrong(T4, "checkpointing re-gathers every block",
          sent((GATHERS, 'gathers = 1 if name == "root" else 2 + config["checkpointing"]')),
          ("right without checkpointing only", "checkpointing changes no byte")),
    Wrong(T4, "bits", sent(("    return sent\n", "    return 8 * sent\n"),
                           (DDP, "return 8 * 2 * ring * psi * size"),
                           (ZERO, "return 8 * ring * psi * (size + size)")), ("8x", "bits")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("11")
