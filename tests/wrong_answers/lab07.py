"""Lab 07's wrong answers: ``cheapest_fit`` as the reference solution with one edit each."""

from pathlib import Path

from . import Wrong

EX = "07_cheapest_fit"
SOLUTION = (Path(__file__).resolve().parents[2] / "labs" / "solutions" / f"{EX}.py").read_text()
FITS = "if s.fits and"
MEM = "gpu_mem_gb * 1e9"
COST = "cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))"


def variant(*edits):
    """The reference solution with (old, new) source edits: a learner's version of it."""
    source = SOLUTION
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    namespace = {"__name__": "learner"}
    exec(compile(source, "learner", "exec"), namespace)
    return namespace["cheapest_fit"]


def _ranked_by_step_only():
    """The fastest step only, and the later candidate kept on a tie (<=)."""
    return variant((COST, "cost = s.step_seconds"), ("cost < best_cost", "cost <= best_cost"))


WRONG = [
    Wrong(EX, "activations ignored (plan of a parameter count)",
          variant(("p = fsdp_mini.plan(model=model,", "p = fsdp_mini.plan(params=model.params(),")),
          ("does not fit", "it fits without its activations")),
    Wrong(EX, "Adam's state left out of the peak",
          variant((FITS, f"if s.peak_bytes - s.by_category['optimizer_state'] <= {MEM} and")),
          ("it fits without adam's state",)),
    Wrong(EX, "no fit check (ddp chosen where it cannot fit)", variant((FITS, "if")),
          ("does not fit", "the cheapest of all candidates, fitting or not")),
    Wrong(EX, "fp32 only", variant(('PRECISIONS = ("fp32", "bf16-mixed")', 'PRECISIONS = ("fp32",)')),
          ("you never chose bf16-mixed",)),
    Wrong(EX, "no activation checkpointing tried",
          variant(("for checkpointing in (False, True):", "for checkpointing in (False,):")),
          ("you never chose with checkpointing",)),
    Wrong(EX, "fits by persistent bytes, not the peak",
          variant((FITS, f"if s.persistent_bytes <= {MEM} and")),
          ("its state kept between steps (persistent_bytes) fits, not its peak",)),
    Wrong(EX, "gpu_mem_gb not passed to plan (its 80 GB default)",
          variant(("gpu_mem_gb=gpu_mem_gb, ", "")),
          ("never change with gpu mem gb", "planned for gpus of 80 gb")),
    Wrong(EX, "the budget read in GiB", variant((FITS, "if s.peak_bytes <= gpu_mem_gb * 2**30 and")),
          ("it fits gpu_mem_gb gib (2^30 b)",)),
    Wrong(EX, "the smallest peak taken for the cheapest", variant((COST, "cost = s.peak_bytes")),
          ("fits but costs more", "the smallest planned peak")),
    Wrong(EX, "the fewest bytes taken for the cheapest (bytes are not time)",
          variant((COST, "cost = (s.sent_bytes_per_step, checkpointing, STRATEGIES.index(strategy))")),
          ("fits but costs more", "the fewest bytes sent per step")),
    Wrong(EX, "the peak compared with the whole GPU, the reserve left out",
          variant((FITS, f"if s.peak_bytes <= {MEM} and")),
          ("does not fit", "it fits the gpu's whole memory", "reserve")),
    Wrong(EX, "micro_batch not passed to plan", variant(("micro_batch=micro_batch, ", "")),
          ("never change with micro batch", "planned with micro-batch 1")),
    Wrong(EX, "the first candidate that fits, bytes not compared",
          variant(("if s.fits and (best_cost is None or cost < best_cost):",
                   "if s.fits and best_cost is None:")),
          ("the first candidate that fits in the order tried",)),
    Wrong(EX, "ModelShape attributes used (the lab later passes the name '70b')",
          variant(("    best, best_cost = None, None\n",
                   "    best, best_cost = None, None\n    size = model.params()   # for a log line\n")),
          ("(by name)", "attributeerror", "preset's name")),
    Wrong(EX, "the fastest step only, the later candidate kept on a tie", _ranked_by_step_only(),
          ("costs exactly as much", "no checkpointing comes first, then the less sharded")),
    Wrong(EX, "ties broken the other way (checkpointing and the more sharded first)",
          variant((COST, "cost = (s.step_seconds, not checkpointing, -STRATEGIES.index(strategy))")),
          ("costs exactly as much", "no checkpointing comes first")),
    Wrong(EX, "the fastest candidate returned when nothing fits",
          variant(("    return best\n", "    return best or {'strategy': 'fsdp', 'precision': "
                   "'bf16-mixed', 'checkpointing': True}\n")),
          ("the reference: nothing fits", "does not fit")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("07")
