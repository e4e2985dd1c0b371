"""A strategy from outside the kit plugs in with one registration line (tests/toy_strategy.py)."""

import pytest
import workers
from helpers import assert_states_equal

import fsdp_mini


def naive_run(rank, world_size):
    import toy_strategy  # noqa: F401  (registers "naive_ddp" in this rank)
    out = workers.train("gpt", "naive_ddp", {}, "sgd", rank, world_size)
    model, opt = fsdp_mini.parallelize(workers.make_odd(), "naive_ddp")
    x, y = workers.odd_batch(0, rank, world_size)
    with fsdp_mini.track_memory(model, opt) as mem:
        model(x, y)[1].backward()
        norm = fsdp_mini.clip_grad_norm_(model, 1e9)
        opt.step()
    out["grads_bytes"] = mem.category_bytes()["grads"]
    out["norm"] = float(norm)
    return out


def test_a_registered_strategy_trains_like_a_single_process():
    results = fsdp_mini.launch(naive_run, 2, timeout=60)
    reference = workers.train_reference("gpt", "sgd")
    assert_states_equal(results[0]["state"], reference, 1e-5, "naive_ddp")
    for res in results:
        for sent in res["sent_per_step"][:-1]:
            assert sent == pytest.approx(res["expected"]["sent_bytes_per_step"], rel=1e-12)
        assert res["grads_bytes"] == 4 * (7 * 15 + 15 * 3 + 3)  # one whole gradient per param
    assert results[0]["norm"] == pytest.approx(results[1]["norm"])


def test_registration_errors_are_clear():
    import toy_strategy
    with pytest.raises(TypeError, match="subclass of fsdp_mini.Strategy"):
        fsdp_mini.register_strategy(object)
    with pytest.raises(TypeError, match=r"unknown option\(s\) for 'naive_ddp': bucket_mb"):
        fsdp_mini.parallelize(workers.make_odd(), "naive_ddp", bucket_mb=1)
    from fsdp_mini.fsdp.algorithm import FSDP
    from fsdp_mini.registry import get_strategy

    class Forgot(FSDP):  # inherits the name "fsdp"
        pass
    with pytest.raises(ValueError, match="'fsdp', the name of the kit's own FSDP; .*'my_fsdp'"):
        fsdp_mini.register_strategy(Forgot)
    assert get_strategy("fsdp") is FSDP
    again = type("NaiveDDP", (toy_strategy.NaiveDDP,), {})  # a cell run twice: yours is replaced
    assert fsdp_mini.register_strategy(again) is again
    fsdp_mini.register_strategy(toy_strategy.NaiveDDP)
    model, _ = fsdp_mini.parallelize(workers.make_odd(), toy_strategy.NaiveDDP)  # the class too
    assert model.fsdp_mini.strategy == "naive_ddp"
    assert model.fsdp_mini.formulas() == {"memory": "16Ψ", "sent": "2Ψ·4(N−1)/N"}


def test_a_strategy_class_goes_to_the_ranks_as_it_is():
    """The ready-made job takes your class: no registration inside the ranks needed."""
    import toy_strategy

    from fsdp_mini.jobs import train_gpt
    from fsdp_mini.models import GPTConfig, make_model
    out = fsdp_mini.launch(train_gpt, 2, toy_strategy.NaiveDDP, 2, "tiny", 4, False)
    psi = make_model(GPTConfig.tiny()).num_params()
    for rank in out:  # two steps, each an all-reduce of every gradient: 2 x 2(N-1)/N x 4Ψ
        assert len(rank["losses"]) == 2
        assert rank["sent_bytes_by_op"]["all_reduce"] == 2 * 2 * (2 - 1) / 2 * 4 * psi
