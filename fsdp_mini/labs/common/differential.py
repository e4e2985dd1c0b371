"""The checking engine: the learner's code beside the reference, over a spread of configurations.

A check knows the lesson, not a list of mistakes. It runs the reference solution and the
learner's answer on the same inputs, records everything the kit can observe of each (outputs,
gradients and weights per rank and step, every collective of the ledger, memory by category,
what stays alive, which tensors share storage), and compares the two records::

    check = Check("your ZeRO-1", observe=train_zero, configs=spread(world_size=[1, 2, 3, 4],
                  numel=[3, 7, 12]), on_ranks=True, hints=[Hint(...), ...])
    result = check(MyZero1, reference=labs.load_solution("04_zero1", "MyZero1"))
    # ✘ at world size 3, numel 7 (rank 2 holds only padding), step 2: rank 2's weights differ
    #   from the reference's by 0.41 (relative) ... hint: ...

Shrinking, by a fixed table: the configurations are sorted from the smallest to the lab's own
(``size``), every one is run, and the verdict reports the first divergence, in the order things
happen (step by step, then by observable, then by rank), at the smallest configuration that shows
it; beside it, in which configurations the answer agrees and in which it does not. A hint is
chosen from the divergence itself (its observable, its ratio to the reference, whether it grows
step by step, what the failing configurations share that the agreeing ones lack), never from a
list of known mistakes: those live in ``tests/wrong_answers/`` as tests of the checks.

Observing runs on several ranks (``on_ranks=True``): one launch per world size runs every
configuration of that size, for one answer or many (:mod:`fsdp_mini.labs.common.on_ranks`). The
reference's records are remembered per check, so running a check again costs only the
learner's runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from . import remembered
from .on_ranks import observe_here, run_answers
from .compare import Divergence, axes_in_words, shown, collective_words, compare, where_right
from .records import Config, Record, spread  # noqa: F401  (what a lab declares a check with)
from .report import CheckResult

CHECK_TIMEOUT = 20  # seconds a collective may wait: a skipped one hangs


# -- hints ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hint:
    """``say`` when ``when(divergence)`` holds: the lab's words for what such a divergence means."""

    when: Callable[[Divergence], bool]
    say: str | Callable[[Divergence], str]

    def text(self, d: Divergence) -> str:
        return self.say(d) if callable(self.say) else self.say.format(
            **{**vars(d), **d.config, **d.where})


def near(x: float | None, target: float, rel: float = 0.02) -> bool:
    return x is not None and target != 0 and abs(x / target - 1) < rel


# -- the check ------------------------------------------------------------------------------------

@dataclass
class Check:
    """A lesson's check: ``observe(answer, cfg, record)`` runs one answer in one configuration.

    ``order``: the observables in the order they happen within a step (for "first");
    ``tolerance``: per observable, the relative difference still taken as equal (default 0);
    ``words``: per observable, how a verdict names it (``"rank {rank}'s weights after step
    {step}"``); ``agreed``: the ✔ line when everything agrees."""

    what: str
    observe: Callable
    configs: list
    order: tuple = ()
    tolerance: dict = field(default_factory=dict)
    words: dict = field(default_factory=dict)
    hints: list = field(default_factory=list)
    agreed: str = "the same as the reference in every configuration"
    on_ranks: bool = False
    timeout: float = CHECK_TIMEOUT
    _reference: dict = field(default_factory=dict, repr=False)

    def __call__(self, answer, reference, result: CheckResult | None = None,
                 configs: list | None = None) -> CheckResult:
        """Run ``answer`` and ``reference`` on ``configs`` (default: the check's own), compare,
        and add the verdict to ``result``; ``result.facts["records"]`` keeps what was seen."""
        return self.judge_many([answer], reference, configs, [result])[0]

    def judge_many(self, answers: list, reference, configs: list | None = None,
                   results: list | None = None) -> list[CheckResult]:
        """Each answer's verdict, all of them run in one launch per world size."""
        configs = configs or self.configs
        results = [r or CheckResult(self.what) for r in (results or [None] * len(answers))]
        for result, records in zip(results, self.records_many(answers, reference, configs)):
            self.verdict(records, result, len(configs))
        return results

    def verdict(self, records: dict, result: CheckResult, planned: int = 0) -> CheckResult:
        """The ✔ line, or the ✘ line of the first divergence at the smallest configuration
        (``planned``: how many configurations there were, run or not)."""
        result.facts["records"] = records
        diverged, agree_in = [], []
        for cfg, (mine, want) in records.items():
            d = compare(mine, want, self.order, self.tolerance, cfg)
            (diverged if d else agree_in).append(d or cfg)
        if not diverged:
            result.ok(f"{self.agreed}: {len(agree_in)} configurations, "
                      f"{axes_in_words(agree_in)}")
            result.facts["configurations"] = len(agree_in)
            return result
        first = diverged[0]
        # Note: where it is right or wrong, among the configurations that observe what differs
        seen = {c for c, (_, want) in records.items()
                if any(k[0] == first.observable for k in want.seen)} if first.observable in \
            self.order else set(records)
        first.agree = [c for c in agree_in if c in seen]
        first.differ = [d.config for d in diverged if d.config in seen]
        first.table = records
        left = planned - len(records)
        result.wrong(self.sentence(first) + (f"; the {left} larger configurations were not run"
                                             if left > 0 else ""), hint=self.hint(first))
        result.facts.update(divergence=first, configurations=len(records))
        return result

    def sentence(self, d: Divergence) -> str:
        where = f"at {d.config.words()}"
        if d.raised and d.raised[0] == "a hang":
            said = f"the ranks hung: {d.raised[1]}"
        elif d.raised:
            kind, message, line = d.raised
            said = f"your code raised {kind}: {message}" + (f" (at {line})" if line else "")
        else:
            name = self.words.get(d.observable, "{observable} of rank {rank} at step {step}")
            named = name.format(**{"observable": d.observable, "rank": 0, "step": 0,
                                   **d.where}) + (f" {d.path}" if d.path else "")
            if d.observable == "ledger":
                said = f"{named}: {collective_words(*d.whole)}"
            elif d.mine is None:
                said = f"{named}: the reference has {shown(d.want)}, yours has none"
            elif d.want is None:
                said = f"{named}: yours has {shown(d.mine)}, which the reference does not"
            else:
                said = f"{named}: yours {shown(d.mine)}, the reference {shown(d.want)}" + (
                    f", {d.how_much}" if d.how_much else "") + (
                    f" ({d.ratio:.3g}x)" if d.ratio is not None and not near(d.ratio, 1, 1e-3)
                    else "")
        right = f"; {where_right(d.agree, d.differ)}"
        return f"{where}: {said}{right}"

    def hint(self, d: Divergence) -> str:
        for h in self.hints:
            if _holds(h, d):
                try:
                    return h.text(d)
                except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError,
                        IndexError):
                    continue  # Note: a hint whose words do not apply to these values
        return ""

    # -- running ----------------------------------------------------------------------------------

    def records_many(self, answers: list, reference, configs: list) -> list[dict]:
        """Per answer, {config: (its record, the reference's)}, smallest config first; an
        answer's configurations after the one where it raised or hung are left out."""
        for c in configs:
            if c not in self._reference and (found := remembered.load(self.what, c)):
                self._reference[c] = found
        todo = [c for c in configs if c not in self._reference]
        if todo:
            for (_, c), record in self._run([reference], todo).items():
                self._reference[c] = record
                remembered.save(self.what, c, record)
        # Note: a rank waits for its peers at most 10x as long as the reference took, so an
        # answer that hangs costs seconds, not the collective's whole timeout
        wait = {c: max(5.0, 10 * self._reference[c].seconds) for c in configs}
        mine = self._run(answers, configs, wait)
        return [{c: (mine[(a, c)], self._reference[c]) for c in configs if (a, c) in mine}
                for a in range(len(answers))]

    def _run(self, answers, configs, wait=None) -> dict:
        if self.on_ranks:
            return run_answers(self.observe, answers, configs, self.timeout, wait)
        return {(a, c): observe_here(self.observe, answer, c, 0)
                for a, answer in enumerate(answers) for c in configs}


def _holds(hint: Hint, d: Divergence) -> bool:
    try:
        return bool(hint.when(d))
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        return False  # Note: a hint's test may not apply to this divergence's values
