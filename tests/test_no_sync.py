"""Gradient accumulation with ``fsdp_mini.no_sync``: K = 3 micro-batches, the first two inside the
block, then one optimizer step, under every strategy at world sizes 2 and 3 (one launch each).

It must equal one process training on the whole (concatenated) batch, issue no gradient
collective inside the block, send the gradients once per step instead of K times (exact
bytes), keep ``grad is None`` for a parameter no micro-batch used, and refuse misuse clearly.
"""

import no_sync_workers as nw
import pytest
import torch
from helpers import assert_states_equal, padded, ring, trainable_numel

import fsdp_mini

TOL = 1e-6
GRAD_OP = {"ddp": "all_reduce", "zero1": "reduce_scatter", "zero2": "reduce_scatter",
           "fsdp": "reduce_scatter"}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"ws{n}")
def runs(request):
    ws = request.param
    return ws, fsdp_mini.launch(nw.run_all, ws, timeout=60)


@pytest.fixture(scope="module")
def references():
    return {opt: nw.reference(opt) for opt in nw.OPTIMIZERS}


def _base(variant: str) -> str:
    return variant.split(",")[0]


def test_accumulation_equals_one_process_on_the_whole_batch(runs, references):
    ws, results = runs
    for (variant, opt, mode), res in results[0].items():
        assert_states_equal(res["state"], references[opt], TOL, f"{variant}/{opt}/{mode} ws{ws}")


def test_no_gradient_collective_inside_no_sync(runs):
    _, results = runs
    for (variant, opt, mode), res in results[0].items():
        if mode != "no_sync":
            continue
        strategy = _base(variant)
        for i, ops in enumerate(res["ops"]):
            inside = i % nw.K < nw.K - 1
            if inside:  # fsdp still gathers its units for forward and backward
                assert set(ops) <= ({"all_gather"} if strategy == "fsdp" else set()), (variant, i)
            elif strategy != "zero1":  # zero1 reduce-scatters at optimizer.step()
                assert GRAD_OP[strategy] in ops, (variant, i, ops)


def _unit_sizes(ws: int) -> tuple[int, int, int]:
    model = nw.Accum()
    return (padded(trainable_numel(model.block), ws), padded(trainable_numel(model.extra), ws),
            padded(trainable_numel(model.head), ws))


def _expected_grad_bytes(strategy: str, mode: str, ws: int, res) -> float:
    """Bytes one rank sends per step in gradient collectives, from the formulas."""
    k = 1 if mode == "no_sync" else nw.K
    psi = trainable_numel(nw.Accum())
    if strategy == "ddp":
        return 2 * ring(ws) * 4 * psi * k
    if strategy == "zero1":
        return ring(ws) * 4 * res["padded_numel"]
    if strategy == "zero2":
        return ring(ws) * 4 * res["padded_numel"] * k
    block, extra, root = _unit_sizes(ws)
    # extra is used in micro-batch 0 only: reduce-scattered once either way
    return ring(ws) * 4 * (k * (block + root) + extra)


def test_gradients_are_sent_once_per_step_not_once_per_micro_batch(runs):
    ws, results = runs
    psi = trainable_numel(nw.Accum())
    for rank in range(ws):
        for (variant, opt, mode), res in results[rank].items():
            strategy = _base(variant)
            if strategy in ("zero1", "zero2") and "bucket_mb" not in variant:
                assert res["padded_numel"] == padded(psi, ws)
            if strategy == "fsdp":
                assert res["units"] == list(_unit_sizes(ws))
            other = results[rank][(variant, opt, "every" if mode == "no_sync" else "no_sync")]
            for step, totals in enumerate(res["totals"]):
                _, sent = totals[GRAD_OP[strategy]]
                assert sent == pytest.approx(_expected_grad_bytes(strategy, mode, ws, res),
                                             rel=1e-12), (variant, mode, step)
                for op in set(totals) | set(other["totals"][step]):  # all-gathers: the same
                    if op != GRAD_OP[strategy]:
                        assert totals[op] == other["totals"][step][op], (variant, op)


def test_ddp_all_reduces_once_instead_of_k_times(runs):
    _, results = runs
    once = results[0][("ddp", "sgd", "no_sync")]["totals"][0]["all_reduce"]
    every = results[0][("ddp", "sgd", "every")]["totals"][0]["all_reduce"]
    assert (once[0], every[0]) == (1, nw.K)  # one bucket
    assert every[1] == pytest.approx(nw.K * once[1], rel=1e-12)


def test_a_parameter_no_micro_batch_used_keeps_no_gradient(runs):
    ws, results = runs
    initial = nw.Accum().state_dict()["block.never"]
    for (variant, opt, mode), res in results[0].items():
        assert torch.equal(res["state"]["block.never"], initial), (variant, opt, mode)
        for rank in range(ws):
            assert all(results[rank][(variant, opt, mode)]["never_none"]), (variant, rank)


def test_fsdp_keeps_whole_flat_gradients_only_while_accumulating(runs):
    ws, results = runs
    whole = sum(_unit_sizes(ws))
    for rank in range(ws):
        quiet = results[rank][("fsdp", "sgd", "no_sync")]["grads_numel"]
        plain = results[rank][("fsdp", "sgd", "every")]["grads_numel"]
        for i, numel in enumerate(quiet):
            if i % nw.K < nw.K - 1:  # every unit's flat gradient, whole, counted as grads
                assert numel == whole, (rank, i)
            else:  # sent and freed: only this rank's shard of the gradients is left
                assert numel == plain[i] < whole, (rank, i)


# -- in this very process (world size 1) ----------------------------------------------------------

def _wrapped(strategy: str):
    model = nw.Accum()
    return fsdp_mini.parallelize(model, strategy, optimizer=nw.OPTIMIZERS["sgd"],
                                 units=[model.block, model.extra])


def _backward(model, micro: int = 1):
    (model(*nw.micro_batch(0, micro, 0, 1), micro) / nw.K).backward()


def test_no_sync_on_a_plain_model_is_refused():
    with pytest.raises(ValueError, match=r"no_sync: this Accum was not parallelized.*"
                                         r"fsdp_mini.parallelize"), fsdp_mini.no_sync(nw.Accum()):
        pass
    _, optimizer = _wrapped("ddp")
    with pytest.raises(TypeError, match="no_sync takes the model"), fsdp_mini.no_sync(optimizer):
        pass


@pytest.mark.parametrize("strategy", ["single", "ddp", "zero1", "zero2", "fsdp"])
def test_blocks_nest_and_restore_on_error(strategy):
    model, _ = _wrapped(strategy)
    engine = model.fsdp_mini
    with fsdp_mini.no_sync(model) as inner_model:
        assert inner_model is model and not engine.sync_gradients
        with fsdp_mini.no_sync(model):
            assert not engine.sync_gradients
        assert not engine.sync_gradients  # the outer block still holds
    assert engine.sync_gradients
    with pytest.raises(KeyError), fsdp_mini.no_sync(model):
        raise KeyError("inside")
    assert engine.sync_gradients


@pytest.mark.parametrize("strategy", ["single", "ddp", "zero1", "zero2", "fsdp"])
def test_a_step_with_gradients_never_sent_is_refused(strategy):
    model, optimizer = _wrapped(strategy)
    with fsdp_mini.no_sync(model):
        _backward(model)
        if strategy in ("ddp", "zero2", "fsdp"):
            with pytest.raises(RuntimeError, match=r"after backward\(\) under fsdp_mini.no_sync.*"
                                                   r"outside the no_sync block"):
                optimizer.step()
        else:  # single and zero1 send nothing during backward: their step is right
            optimizer.step()
    optimizer.zero_grad()  # drops what was kept: a step is fine again
    if strategy == "fsdp":
        assert not model.fsdp_mini.local_grads.owed
    _backward(model)
    optimizer.step()
