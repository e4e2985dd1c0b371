"""Activation checkpointing from outside the kit trains like one process under fsdp and hsdp.

``torch.utils.checkpoint.checkpoint`` around a unit's call (its hooks run again when backward
recomputes it), around its ``forward`` (they do not), around two units at once, reentrant and
not, and a transformers GPT-2 built from a config with ``gradient_checkpointing_enable()``: the
recomputation finds the unit gathered, the weights after 2 SGD-with-momentum steps equal those
of one process training on the whole batch without checkpointing, and the bytes sent per step
are those of the same run without checkpointing (the recomputation gathers nothing more).
"""

import pytest
import recompute_workers as rw
import torch
from helpers import relative_errors

from fsdp_mini import launch

pytest.importorskip("transformers")
TOL = 1e-5


@pytest.fixture(scope="module")
def single():
    return {case: rw.train(0, 1, case[0], "none", False, "single")[0] for case in rw.CASES}


@pytest.fixture(scope="module", params=[("fsdp", 2, {}), ("fsdp", 3, {"prefetch": 1}),
                                        ("hsdp", 4, {"shard_size": 2})],
                ids=["fsdp-ws2", "fsdp-ws3-prefetch", "hsdp-2x2"])
def runs(request):
    strategy, world_size, options = request.param
    return strategy, launch(rw.train_all, world_size, strategy, options, timeout=240)[0]


@pytest.mark.parametrize("case", rw.CASES[1:], ids=lambda c: f"{c[0]}-{c[1]}"
                         + ("-reentrant" if c[2] else ""))
def test_checkpointing_from_outside_trains_like_one_process(single, runs, case):
    strategy, results = runs
    state, sent = results[case]
    errors = relative_errors(state, single[case])
    worst = max(e[0] for e in errors.values())
    assert worst <= TOL, f"{strategy} {case}: {worst:.1e} from one process"
    plain_state, plain_sent = results[(case[0], "none", False)]
    assert sent == plain_sent, f"{strategy} {case}: bytes per step {sent} against {plain_sent} " \
                               f"without checkpointing"


def test_the_references_agree(single, runs):
    """The runs without checkpointing match one process too (what the cases are held to)."""
    strategy, results = runs
    for model in ("stack", "gpt2"):
        case = (model, "none", False)
        worst = max(e[0] for e in relative_errors(results[case][0], single[case]).values())
        assert worst <= TOL, f"{strategy} {model}: {worst:.1e}"
        assert all(torch.isfinite(v).all() for v in results[case][0].values())
