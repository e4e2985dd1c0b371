"""Prefetch, activation checkpointing and offload under fsdp: same numbers, same bytes; what changes is
when the all-gathers are issued, how many units are whole at once, and the activation memory.
(Parity with single-process training for both options is in test_parity.py's variants.)"""

import fsdp_option_workers as w
import pytest
import torch
from helpers import assert_states_equal

import fsdp_mini
from fsdp_mini import launch

WS = 2


@pytest.fixture(scope="module")
def runs():
    return launch(w.all_checks, WS, timeout=120)


def test_the_next_units_gather_is_issued_before_the_unit_computes(runs):
    order = runs[0]["order"]  # (step, unit) -> gathers issued when the unit was ready
    # the first step (1) learns the order: nothing is prefetched yet
    assert order[False][(1, "blocks.0")] == ["root", "blocks.0"]
    assert order[True][(1, "blocks.0")] == ["root", "blocks.0"]
    # later steps: when blocks.0 is ready, blocks.1's gather is already out
    assert order[False][(2, "blocks.0")] == ["root", "blocks.0"]
    assert order[True][(2, "blocks.0")] == ["root", "blocks.0", "blocks.1"]
    # the root's forward already sends for the first unit (two ahead: both blocks)
    assert order[False][(2, "root")] == ["root"]
    assert order[True][(2, "root")] == ["root", "blocks.0"]
    assert order[2][(2, "root")] == ["root", "blocks.0", "blocks.1"]
    # backward, in reverse: blocks.0's gather leaves before blocks.1's gradient is sent
    assert order[False]["backward"] == ["blocks.1/backward", "blocks.1/grad",
                                        "blocks.0/backward", "blocks.0/grad", "root/grad"]
    assert order[True]["backward"] == ["blocks.1/backward", "blocks.0/backward",
                                       "blocks.1/grad", "blocks.0/grad", "root/grad"]


def test_prefetched_gathers_overlap_with_compute_in_the_ledger_and_timeline(runs):
    # ``waited`` > 0: the rank computed between issuing the gather and waiting for it, which is
    # what the dashboard's timeline draws as overlap. Blocking gathers wait at once (0).
    order = runs[0]["order"]
    assert order[False]["overlapped"] == []
    assert order[True]["overlapped"] == ["blocks.0/backward", "blocks.0/forward",
                                         "blocks.1/backward", "blocks.1/forward"]


def test_prefetch_gathers_one_more_unit_at_a_time_and_sends_the_same_bytes(runs):
    peak = runs[0]["peak"]
    unit, root = peak[False]["unit"], peak[False]["root"]
    assert peak[False]["gathered_peak"] == root + unit
    assert peak[True]["gathered_peak"] == root + 2 * unit
    assert peak[2]["gathered_peak"] == root + 3 * unit
    for p in (False, True, 2):
        assert peak[p]["sent"] == peak[p]["expected"], f"prefetch={p}: bytes differ from formula"


def test_a_model_whose_order_changes_gets_the_same_results(runs):
    reference = w.changing_order_reference()
    changing = runs[0]["changing"]
    for name, res in changing.items():
        assert_states_equal(res["state"], reference, 1e-6, f"changing order, {name}")
        if name == "plain":
            assert not any("prefetch" in m for m in res["warnings"])
        else:
            assert any("different order" in m for m in res["warnings"]), res["warnings"]
    for key, value in changing["prefetch"]["state"].items():
        assert torch.equal(value, changing["plain"]["state"][key]), key


def test_activation_checkpointing_cuts_activations_and_costs_no_extra_bytes(runs):
    act = runs[0]["activations"]
    without, with_ac = act[False], act[True]
    assert with_ac["sent"] == without["sent"] == without["expected"] == with_ac["expected"]
    ratio = with_ac["activations"] / without["activations"]
    print(f"\nactivation peak: {without['activations']} B -> {with_ac['activations']} B "
          f"({ratio:.2f}x); own peak {without['peak']} -> {with_ac['peak']} B")
    assert ratio < 0.75, f"activation checkpointing kept {ratio:.2f}x of the activations"


@pytest.mark.parametrize("options, message", [
    ({"prefetch": -1}, "prefetch"), ({"prefetch": "yes"}, "prefetch"),
    ({"prefetch": 1.5}, "prefetch"), ({"activation_checkpointing": "yes"},
                                      "activation_checkpointing"),
])
def test_bad_options_are_refused(options, message):
    model = w.Shuffled()
    with pytest.raises((TypeError, ValueError), match=message):
        fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks), **options)
    assert getattr(model, "fsdp_mini", None) is None


def test_prefetch_is_an_fsdp_option_only():
    model = w.Shuffled()
    with pytest.raises(TypeError, match="prefetch"):
        fsdp_mini.parallelize(model, "ddp", prefetch=True)


def test_offload_on_cpu_ranks_warns_and_changes_nothing():
    model = w.Shuffled()
    with pytest.warns(UserWarning, match="offload=True has no effect"):
        model, _ = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks), offload=True)
    assert model.fsdp_mini.offload is False
