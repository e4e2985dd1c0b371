"""The wrong-answer sweep: for every lab, how many plausible wrong answers its checkers catch.

    python benchmarks/checker_sweep.py [LAB ...]      # e.g. 04 05; all labs by default

Prints one line per wrong answer (named / generic / PASSED) and a table per lab: tried, caught
and named, caught with words that do not name the mistake, passed. Runs small (CI=true sizes).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("CI", "true")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
from wrong_answers import LABS, registry, verdict  # noqa: E402


def main(labs: list[str]) -> int:
    torch.set_num_threads(1)
    rows, start = [], time.perf_counter()
    for lab in labs:
        counts = {"named": 0, "generic": 0, "passed": 0}
        for wrong in registry(lab):
            judged, text = verdict(wrong)
            counts[judged] += 1
            first = next((line.strip() for line in text.splitlines() if "✘" in line), "")
            print(f"{judged.upper() if judged == 'passed' else judged:8s} {wrong}"
                  + (f"\n         said: {first[:150]}" if judged == "generic" else ""))
        rows.append((lab, sum(counts.values()), counts))
    print(f"\n{'lab':4s} {'tried':>6s} {'named':>6s} {'generic':>8s} {'passed':>7s}")
    for lab, tried, c in rows:
        print(f"{lab:4s} {tried:6d} {c['named']:6d} {c['generic']:8d} {c['passed']:7d}")
    total = {k: sum(c[k] for _, _, c in rows) for k in ("named", "generic", "passed")}
    tried = sum(t for _, t, _ in rows)
    print(f"all  {tried:6d} {total['named']:6d} {total['generic']:8d} {total['passed']:7d}"
          f"   caught {total['named'] + total['generic']} of {tried}, named {total['named']} "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if total["passed"] or total["generic"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(LABS)))
