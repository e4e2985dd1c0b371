"""Lab 07's wrong answers: ``cheapest_fit`` as the reference solution with one edit each."""

from pathlib import Path

from fsdp_mini import labs

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


def check(*edits):
    return lambda: labs.check_cheapest_fit(variant(*edits))


WRONG = [
    Wrong(EX, "activations ignored (plan of a parameter count)",
          check(("p = fsdp_mini.plan(model=model,", "p = fsdp_mini.plan(params=model.params(),")),
          ("you ignored the activations", "give plan() the model's shape")),
    Wrong(EX, "Adam's state left out of the peak",
          check((FITS, f"if s.peak_bytes - s.by_category['optimizer_state'] <= {MEM} and")),
          ("you forgot adam's state", "plan()'s peak_bytes")),
    Wrong(EX, "no fit check (ddp chosen where it cannot fit)", check((FITS, "if")),
          ("you chose ddp where it cannot fit", "whose .fits is true")),
    Wrong(EX, "fp32 only", check(('PRECISIONS = ("fp32", "bf16-mixed")', 'PRECISIONS = ("fp32",)')),
          ("you did not consider bf16-mixed",)),
    Wrong(EX, "no activation checkpointing tried",
          check(("for checkpointing in (False, True):", "for checkpointing in (False,):")),
          ("you did not consider activation checkpointing",)),
    Wrong(EX, "fits by persistent bytes, not the peak",
          check((FITS, f"if s.persistent_bytes <= {MEM} and")),
          ("persistent_bytes), not by the peak",)),
    Wrong(EX, "gpu_mem_gb not passed to plan (its 80 GB default)",
          check(("gpu_mem_gb=gpu_mem_gb, ", "")), ("your answers fit 80 gb, not the budget",)),
    Wrong(EX, "the budget read in GiB", check((FITS, "if s.peak_bytes <= gpu_mem_gb * 2**30 and")),
          ("you compared with gib (2^30 b); the budget is in gb (10^9 b)",)),
    Wrong(EX, "the smallest peak taken for the cheapest", check((COST, "cost = s.peak_bytes")),
          ("you picked the configuration with the smallest peak",)),
    Wrong(EX, "the fewest bytes taken for the cheapest (bytes are not time)",
          check((COST, "cost = (s.sent_bytes_per_step, checkpointing, STRATEGIES.index(strategy))")),
          ("you picked the configuration that sends the fewest bytes", "step_seconds")),
    Wrong(EX, "the peak compared with the whole GPU, the reserve left out",
          check((FITS, f"if s.peak_bytes <= {MEM} and")),
          ("fit to the last byte", "reserve")),
    Wrong(EX, "micro_batch not passed to plan", check(("micro_batch=micro_batch, ", "")),
          ("micro_batch",)),
    Wrong(EX, "the first candidate that fits, bytes not compared",
          check(("if s.fits and (best_cost is None or cost < best_cost):",
                 "if s.fits and best_cost is None:")),
          ("the first configuration that fits",)),
    Wrong(EX, "ModelShape attributes used (the lab later passes the name '70b')",
          check(("    best, best_cost = None, None\n",
                 "    best, best_cost = None, None\n    size = model.params()   # for a log line\n")),
          ("with the preset's name as the lab calls it later", "attributeerror")),
]
