"""Tests for fsdp_mini.models: the GPT, its deterministic init, and the synthetic data."""
import math

import pytest
import torch

from fsdp_mini.models import GPT, GPTConfig, SyntheticText, make_model, shard

TINY = GPTConfig.tiny()


@pytest.fixture(scope="module")
def tiny_model():
    return make_model(TINY, seed=0)


@pytest.fixture(scope="module")
def data():
    return SyntheticText(TINY.vocab_size, TINY.block_size, seed=0)


# ---------------------------------------------------------------- model

def test_param_counts():
    default = GPT(GPTConfig())
    assert 2_000_000 <= default.num_params() <= 6_000_000
    assert make_model(TINY).num_params() < 100_000


def test_num_params_counts_tied_weight_once():
    tied = make_model(TINY)
    untied = make_model(GPTConfig.tiny(tie_weights=False))
    assert untied.num_params() - tied.num_params() == TINY.vocab_size * TINY.n_embd


def test_tied_weights_are_the_same_parameter(tiny_model):
    assert tiny_model.head.weight is tiny_model.wte.weight
    untied = make_model(GPTConfig.tiny(tie_weights=False))
    assert untied.head.weight is not untied.wte.weight


def test_blocks_are_fsdp_units(tiny_model):
    units = list(tiny_model.blocks)
    assert len(units) == TINY.n_layer
    assert not list(tiny_model.buffers())  # causal masking needs no buffers


def test_forward_shapes(tiny_model, data):
    idx, targets = data.batch(0, 3)
    logits, loss = tiny_model(idx)
    assert logits.shape == (3, TINY.block_size, TINY.vocab_size)
    assert loss is None
    logits, loss = tiny_model(idx[:, :5], targets[:, :5])  # shorter context is fine
    assert logits.shape == (3, 5, TINY.vocab_size)
    assert loss.shape == () and torch.isfinite(loss)


def test_too_long_sequence_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="block_size"):
        tiny_model(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))


def test_loss_at_init_is_near_uniform(tiny_model, data):
    _, loss = tiny_model(*data.batch(0, 16))
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.1 * math.log(TINY.vocab_size)


def test_loss_is_mean_cross_entropy(tiny_model, data):
    idx, targets = data.batch(1, 2)
    logits, loss = tiny_model(idx, targets)
    logp = torch.log_softmax(logits, dim=-1)
    manual = -logp.gather(-1, targets.unsqueeze(-1)).mean()
    torch.testing.assert_close(loss, manual)


def test_causal(tiny_model, data):
    idx, _ = data.batch(2, 2)
    t = 7
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % TINY.vocab_size
    with torch.no_grad():
        a, _ = tiny_model(idx)
        b, _ = tiny_model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, t:], b[:, t:])


def test_works_with_torch_func(tiny_model, data):
    idx, targets = data.batch(3, 2)
    params = {k: v.detach() for k, v in tiny_model.named_parameters()}

    def loss_fn(p):
        return torch.func.functional_call(tiny_model, p, (idx, targets))[1]

    grads = torch.func.grad(loss_fn)(params)
    tiny_model.zero_grad()
    tiny_model(idx, targets)[1].backward()
    for name, p in tiny_model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad)
    tiny_model.zero_grad(set_to_none=True)


def test_make_model_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    a, b = make_model(TINY, seed=5), make_model(TINY, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = make_model(TINY, seed=6)
    assert not torch.equal(a.wte.weight, c.wte.weight)


def test_residual_projections_use_scaled_init():
    model = make_model(GPTConfig(n_layer=8, n_embd=128, n_head=4), seed=0)
    std = model.blocks[0].mlp.proj.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(16)) < 0.001
    assert abs(model.blocks[0].mlp.fc.weight.std().item() - 0.02) < 0.001
    assert model.blocks[0].attn.qkv.bias is None  # see CausalSelfAttention
    assert torch.count_nonzero(model.blocks[0].mlp.fc.bias) == 0


# ---------------------------------------------------------------- data

def test_batch_shapes_and_shift(data):
    idx, targets = data.batch(0, 4)
    assert idx.shape == targets.shape == (4, TINY.block_size)
    assert idx.dtype == targets.dtype == torch.long
    assert torch.equal(idx[:, 1:], targets[:, :-1])
    assert 0 <= int(idx.min()) and int(idx.max()) < TINY.vocab_size


def test_batch_is_deterministic_and_ignores_global_rng(data):
    torch.manual_seed(0)
    a = data.batch(7, 8)
    torch.manual_seed(99)
    b = SyntheticText(TINY.vocab_size, TINY.block_size, seed=0).batch(7, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], data.batch(8, 8)[0])
    other_seed = SyntheticText(TINY.vocab_size, TINY.block_size, seed=1)
    assert not torch.equal(a[0], other_seed.batch(7, 8)[0])


def test_batches_follow_the_chain(data):
    idx, targets = data.batch(0, 64)
    n = data.block_size // 2  # targets before this index are Markov draws
    assert (data.transition[idx[:, :n], targets[:, :n]] > 0).all()
    # after the n + 1 walked tokens, the sequence starts over from its beginning
    seq = torch.cat([idx[:, :1], targets], dim=1)
    walk = n + 1
    assert torch.equal(seq[:, walk:], seq[:, : seq.shape[1] - walk])


def test_local_batches_concatenate_to_global_batch(data):
    idx, targets = data.batch(3, 8)
    for world in (1, 2, 4, 8):
        parts = [data.local_batch(3, 8, r, world) for r in range(world)]
        assert torch.equal(torch.cat([p[0] for p in parts]), idx)
        assert torch.equal(torch.cat([p[1] for p in parts]), targets)
    assert torch.equal(shard(idx, 1, 4), idx[2:4])


def test_indivisible_global_batch_is_rejected(data):
    with pytest.raises(ValueError, match=r"global batch size 10 .*world_size 4"):
        data.local_batch(0, 10, 0, 4)
    with pytest.raises(ValueError, match="rank 4"):
        data.local_batch(0, 8, 4, 4)


def test_entropy_floor(data):
    h = data.chain_entropy()
    assert 0 < h < math.log(4)  # at most 4 successors per token
    assert data.entropy() == pytest.approx(h / 2)  # half the targets are copies
    no_copy = SyntheticText(TINY.vocab_size, TINY.block_size, seed=0, repeat=False)
    assert no_copy.entropy() == pytest.approx(h)
    pi = data.stationary
    torch.testing.assert_close(pi @ data.transition, pi)
    assert pi.sum().item() == pytest.approx(1.0) and (pi > 0).all()
    # the true chain's own loss on the Markov part matches H
    idx, targets = no_copy.batch(0, 512)
    nll = -data.transition[idx, targets].log().mean().item()
    assert nll == pytest.approx(h, rel=0.05)


# ---------------------------------------------------------------- training

def test_tiny_model_learns(data):
    model = make_model(TINY, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    held_out = data.batch(1_000_000, 256)
    with torch.no_grad():
        start = model(*held_out)[1].item()
    for step in range(30):
        _, loss = model(*data.batch(step, 64))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        end = model(*held_out)[1].item()
    assert end < 0.8 * start, (start, end)
    assert end > data.entropy() - 0.05, (end, data.entropy())
