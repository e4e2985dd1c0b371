"""A small GPT and a synthetic dataset to train it on.

Everything the sharding code needs from a model lives here: a GPT whose
transformer blocks are the natural FSDP units (``units=list(model.blocks)``),
a ``make_model`` that gives every rank bit-identical weights, and a
``SyntheticText`` source whose batches are a pure function of ``(seed, step)``
so that every rank (and every rerun) sees exactly the same data without any
communication or downloads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    """Model hyper-parameters. The defaults give ~3.2M parameters."""

    vocab_size: int = 256
    block_size: int = 64  # maximum context length
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    mlp_ratio: int = 4
    tie_weights: bool = True  # head.weight is wte.weight (GPT-2 style)

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")

    @classmethod
    def tiny(cls, **overrides) -> "GPTConfig":
        """A ~30k-parameter config: small enough for fast CPU unit tests."""
        return cls(**{**dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32),
                      **overrides})

    @classmethod
    def sized(cls, size: str) -> "GPTConfig":
        """The GPT a job, a lab or a benchmark names by size: "tiny" (~30k parameters, for CI
        and unit tests) or "default" (3.2M, the labs' GPT on a laptop or a GPU box)."""
        if size not in ("tiny", "default"):
            raise ValueError(f"model size {size!r}: say 'tiny' (~30k parameters) or 'default' "
                             f"(3.2M)")
        return cls.tiny() if size == "tiny" else cls()


class CausalSelfAttention(nn.Module):
    """Multi-head attention; one fused qkv matmul, causal masking by SDPA."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        # Note: no bias on q, k, v. A key bias shifts every score of a row equally, which softmax
        # ignores, so its exact gradient is 0; Adam would turn the rounding noise of that 0 into
        # full-size updates, and no two summation orders (1 rank or N) would ever agree.
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> three tensors of shape (B, n_head, T, head_dim)
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # is_causal=True builds the mask internally, so the model needs no buffers.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    """Position-wise feed-forward: expand, GELU, project back."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.mlp_ratio * cfg.n_embd)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer.

    ``model.blocks`` holds the repeated layers and is what FSDP wraps as units;
    the embeddings, ``ln_f`` and ``head`` stay in the root. Keeping the tied
    ``wte``/``head`` pair together in the root means no unit boundary ever
    splits a shared parameter.
    """

    def __init__(self, config: GPTConfig | None = None):
        super().__init__()
        self.config = cfg = config or GPTConfig()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight  # same Parameter object
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, LayerNorm = identity.

        The two projections that write into the residual stream per block get
        std 0.02/sqrt(2*n_layer), so the residual's variance does not grow
        with depth. Uses the global RNG; see ``make_model`` for determinism.
        """
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=residual_std)

    def num_params(self) -> int:
        """Number of distinct parameters (a tied weight is counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx: (B, T) token ids, T <= block_size. Returns (logits, loss).

        ``loss`` is the mean cross-entropy over all B*T positions, or None
        when no targets are given.
        """
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def make_model(config: GPTConfig | None = None, seed: int = 0) -> GPT:
    """Build a GPT whose weights depend only on (config, seed).

    Every rank calls this and gets bit-identical weights, so no initial
    broadcast is needed. The seeding happens inside ``fork_rng`` so the
    caller's global RNG state is left exactly as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(config)


def _mix_seed(*values: int) -> int:
    """Fold ints into one well-spread 63-bit seed (splitmix64 rounds), so
    distinct (seed, step) pairs never share or neighbour a generator seed."""
    mask = (1 << 64) - 1
    h = 0
    for v in values:
        h = ((h ^ (v & mask)) + 0x9E3779B97F4A7C15) & mask
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & mask
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & mask
        h ^= h >> 31
    return h >> 1


class SyntheticText:
    """Deterministic token streams from a fixed sparse Markov chain.

    Each token has ``n_successors`` possible next tokens (chosen by ``seed``,
    one of them on a random Hamiltonian cycle so the chain is irreducible)
    with random probabilities. A sequence of ``block_size + 1`` tokens is:

    * first half: a Markov walk started from the stationary distribution;
    * second half (``repeat=True``): an exact copy of the first half, so a
      model that learns to attend back (an induction head) can predict it
      perfectly.

    Entropy floor: a bigram-style model can at best reach H, the chain's
    conditional entropy ``sum_i pi_i * H(P[i, :])``; for a copied target the
    best loss is 0. ``entropy()`` returns the resulting best achievable value
    of ``GPT.forward``'s mean loss, which labs can draw as a horizontal line.
    """

    def __init__(self, vocab_size: int, block_size: int, seed: int = 0,
                 n_successors: int = 4, repeat: bool = True):
        if not 1 <= n_successors <= vocab_size:
            raise ValueError(f"n_successors={n_successors} must be in [1, vocab_size={vocab_size}]")
        self.vocab_size, self.block_size, self.seed, self.repeat = vocab_size, block_size, seed, repeat
        g = torch.Generator().manual_seed(_mix_seed(seed, 0xC4A1))
        order = torch.randperm(vocab_size, generator=g)
        cycle_next = torch.empty_like(order)
        cycle_next[order] = order.roll(-1)  # order[j] -> order[j+1]
        succ = torch.empty(vocab_size, n_successors, dtype=torch.long)
        for i in range(vocab_size):
            others = torch.randperm(vocab_size, generator=g)
            others = others[others != cycle_next[i]][: n_successors - 1]
            succ[i] = torch.cat([cycle_next[i].view(1), others])
        probs = torch.rand(vocab_size, n_successors, generator=g, dtype=torch.float64) + 0.25
        self.succ = succ  # (V, k) successor ids
        self.succ_probs = probs / probs.sum(1, keepdim=True)  # (V, k)
        self.cdf = self.succ_probs.cumsum(1)
        self.cdf[:, -1] = 1.0  # guard against round-off leaving u > cdf[-1]
        self.transition = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
        self.transition.scatter_(1, succ, self.succ_probs)
        self.stationary = self._stationary(self.transition)

    @staticmethod
    def _stationary(P: torch.Tensor) -> torch.Tensor:
        """Solve pi P = pi, sum(pi) = 1 (exact for any irreducible chain)."""
        V = P.shape[0]
        A = torch.cat([P.T - torch.eye(V, dtype=P.dtype), torch.ones(1, V, dtype=P.dtype)])
        b = torch.eye(V + 1, dtype=P.dtype)[-1:].T  # (V+1, 1): zeros, then a 1
        return torch.linalg.lstsq(A, b).solution.squeeze(1).clamp_min(0)

    def chain_entropy(self) -> float:
        """H = sum_i pi_i * H(next | i), in nats: the floor on Markov tokens."""
        p = self.succ_probs
        row_h = -(p * p.log()).sum(1)
        return float((self.stationary * row_h).sum())

    def _markov_targets(self) -> int:
        """How many of the block_size targets are Markov draws (not copies)."""
        return self.block_size // 2 if self.repeat else self.block_size

    def entropy(self) -> float:
        """Best achievable mean cross-entropy (nats/token) of ``GPT.forward``."""
        return self.chain_entropy() * self._markov_targets() / self.block_size

    def batch(self, step: int, batch_size: int):
        """(idx, targets), both (batch_size, block_size) int64 on CPU.

        A pure function of (seed, step): a private Generator is used, never
        the global RNG, so every process and every call agrees.
        """
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        g = torch.Generator().manual_seed(_mix_seed(self.seed, step))
        n = self._markov_targets() + 1  # tokens drawn from the chain
        cur = torch.multinomial(self.stationary.float(), batch_size, replacement=True, generator=g)
        u = torch.rand(n - 1, batch_size, 1, generator=g, dtype=torch.float64)
        walk = [cur]
        for t in range(n - 1):  # inverse-CDF sampling over each row's successors
            j = torch.searchsorted(self.cdf[cur], u[t]).clamp_max(self.succ.shape[1] - 1)
            cur = self.succ[cur].gather(1, j).squeeze(1)
            walk.append(cur)
        seq = torch.stack(walk, dim=1)
        if self.repeat:
            seq = torch.cat([seq, seq], dim=1)
        seq = seq[:, : self.block_size + 1]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def local_batch(self, step: int, global_batch_size: int, rank: int, world_size: int):
        """This rank's contiguous rows of ``batch(step, global_batch_size)``.

        Every rank generates the whole global batch (cheap) and keeps its
        slice, so no data has to be sent between ranks.
        """
        idx, targets = self.batch(step, global_batch_size)
        return shard(idx, rank, world_size), shard(targets, rank, world_size)


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows [rank*n, (rank+1)*n) of ``t``, n = len(t) // world_size; the
    shards of ranks 0..world_size-1 concatenate back to ``t``."""
    if world_size < 1 or t.shape[0] % world_size:
        raise ValueError(f"global batch size {t.shape[0]} is not divisible by world_size {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
    n = t.shape[0] // world_size
    return t[rank * n : (rank + 1) * n]

