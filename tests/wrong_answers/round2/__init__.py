"""The second round of wrong answers: written by readers of each lab's notebook and solution only
(never the checkers or the first registry), as ``Case(exercise, mistake, call)``: ``call`` runs the
public checker exactly as the notebook does. :func:`round2` turns a lab's cases into registry
entries (:class:`wrong_answers.Wrong`): an answer the lab's ``JUDGES`` can batch is judged with the
others of its exercise; any other keeps its own call.

``NAMES[lab][i]``: the words case ``i``'s verdict must contain; ``MISSES[lab][i]``: why case ``i``
is still passed or not named (a known miss, an expected failure that must not start passing
unnoticed).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from fsdp_mini import labs
from wrong_answers import Wrong
from wrong_answers.round2.words import MISSES, NAMES


@dataclass
class Case:
    exercise: str
    mistake: str
    call: Callable[[], object]


class _Called(Exception):
    pass


BATCHED = {"check_mean_of_ranks", "check_peak_predictor", "check_ring_all_reduce", "check_zero1",
           "check_zero2", "check_unit", "check_predict_crossover", "check_cheapest_fit",
           "check_reshard", "check_seeds_and_data", "check_no_hang", "check_clipping",
           "check_port_to_fsdp2", "check_choose_config", "check_ddp", "check_buckets",
           "check_reduce_scatter_grad", "check_faster_on_link", "check_bytes_per_step",
           "check_job_training"}


def _answer(case: Case):
    """The answer ``case.call`` gives its checker, if the lab's JUDGES batch that checker with the
    notebook's own arguments; None (the case keeps its call) otherwise."""
    called_names = set(case.call.__code__.co_names)
    if not called_names & BATCHED:
        return None
    cells = [c.cell_contents for c in case.call.__closure__ or ()]
    if len(cells) == 1 and callable(cells[0]):  # Note: a call made by a helper, _c2(fn): the
        return cells[0]                         # answer read, not run (lab 11's runs launch jobs)
    real = {n: getattr(labs, n) for n in BATCHED}

    def stand_in(name):
        def called(*args, **kwargs):
            raise _Called(name, args, kwargs)
        return called
    try:
        for n in BATCHED:
            setattr(labs, n, stand_in(n))
        case.call()
    except _Called as called:
        name, args, kwargs = called.args
        if name == "check_ddp":
            return (args[0], args[1] if len(args) > 1 else kwargs.get("average_gradient"))
        return args[0]
    finally:
        for n, f in real.items():
            setattr(labs, n, f)
    return None


def round2(lab: str) -> list[Wrong]:
    module = importlib.import_module(f"wrong_answers.round2.lab{lab}")
    out = []
    for i, case in enumerate(module.CASES):
        answer = _answer(case)
        out.append(Wrong(case.exercise, f"{case.mistake} (round 2)", answer,
                         names=NAMES[lab].get(i, ()), run=None if answer is not None else
                         case.call, known_miss=MISSES[lab].get(i, "")))
    return out
