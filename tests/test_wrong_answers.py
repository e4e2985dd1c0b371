"""Every wrong answer in tests/wrong_answers/ is failed by its lab's checker, which names the mistake.

A wrong answer that a checker passes teaches the wrong algorithm; one failed with words that do not
name it leaves the learner guessing. ``python benchmarks/checker_sweep.py`` prints the counts.
"""

import pytest
from wrong_answers import LABS, registry, verdict

CASES = [pytest.param(wrong, marks=pytest.mark.xfail(strict=True, reason=wrong.known_miss))
         if wrong.known_miss else wrong for lab in LABS for wrong in registry(lab)]


@pytest.mark.parametrize("wrong", CASES, ids=lambda w: str(w))
def test_the_checker_names_the_mistake(wrong):
    judged, text = verdict(wrong)
    assert judged != "passed", f"{wrong}: the checker PASSED this wrong answer:\n{text}"
    assert judged == "named", f"{wrong}: failed, but the verdict does not say {wrong.names}:\n{text}"
