"""Model shapes for the planner: how many parameters a transformer has, in which tensors, and
how many bytes of activations one micro-batch leaves saved for backward.

Two layer styles are known:

* ``"gpt"``: the kit's own GPT (:mod:`fsdp_mini.models`): learned positions, LayerNorm, a GELU MLP
  of ``ffn`` = 4d, biases, the head tied to the token embedding by default.
* ``"llama"``: RMSNorm, a SwiGLU MLP (three matrices), no biases, no position table, an untied
  head, grouped-query attention (``kv_heads`` < ``n_head``).

Activations saved per layer and token (elements; the attention is a fused, flash-style kernel
that keeps its output and one log-sum-exp per head, never the s x s score matrix)::

    norm 1 out  d        q, k, v    d + 2 d_kv    attention out  d    residual  d
    norm 2 out  d        MLP        2 ffn (gpt: fc out, GELU out)       residual  d
                                    4 ffn (llama: gate, up, silu, product)
    fp32 extras: 2 statistics per LayerNorm (1 per RMSNorm), 1 log-sum-exp per head

so a kit GPT layer keeps 16d elements + (4 + heads) floats per token. Around the layers: the
embedded input (d), the final norm (d + stats), the logits, log-softmax and the logits'
gradient (3 x vocab) at the start of backward. Worked example, the tiny GPT (d 32, 2 layers,
2 heads, vocab 64) in fp32, 4 sequences of 16 tokens: (32 + 2 x 518 + 34 + 192) x 4 B x 64
tokens = 331 264 B; ``track_memory`` measures 331 408 B of activations at the peak.

With activation checkpointing each layer keeps only its input (d) and one layer at a time is
recomputed in backward.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..arguments import choice, count, flag

STYLES = ("gpt", "llama")
MOMENTS = ("forward end", "backward start", "backward")
# Note: the planner's sums are floats: a count beyond 2**53 is no longer held exactly, and a
# product of a few such counts overflows a float; and it lists every layer's tensors, so a
# depth of millions would take minutes (the deepest published transformers have a few hundred).
MAX_COUNT = 2**53
MAX_LAYERS = 10_000


@dataclass(frozen=True)
class ModelShape:
    """A transformer's shape. ``seq`` is the training sequence length; ``positions`` the rows of
    a learned position table (gpt style; default ``seq``)."""

    n_layer: int
    d_model: int
    n_head: int
    vocab: int
    seq: int
    kv_heads: int | None = None    # None: as many as n_head (no grouped-query attention)
    ffn: int | None = None         # None: 4 x d_model
    style: str = "gpt"
    tie_weights: bool = True
    positions: int | None = None

    def __post_init__(self):
        required = ("n_layer", "d_model", "n_head", "vocab", "seq")
        for name in required + ("kv_heads", "ffn", "positions"):
            value = getattr(self, name)
            if value is None and name not in required:
                continue
            # Note: stored as an int, so 32.0 layers are 32 layers (the dataclass is frozen)
            object.__setattr__(self, name, count(f"ModelShape: {name}", value, at_most=(
                MAX_LAYERS if name == "n_layer" else MAX_COUNT)))
        choice("ModelShape: style", self.style, STYLES)
        flag("ModelShape: tie_weights", self.tie_weights)
        if self.d_model % self.n_head:
            raise ValueError(f"ModelShape: d_model {self.d_model} is not divisible by n_head "
                             f"{self.n_head}")
        if self.n_head % self.kv_head_count:
            raise ValueError(f"ModelShape: n_head {self.n_head} is not divisible by kv_heads "
                             f"{self.kv_heads}")

    @classmethod
    def from_gpt(cls, config, seq: int | None = None) -> ModelShape:
        """The shape of a :class:`fsdp_mini.models.GPTConfig` (read by attribute name)."""
        seq = config.block_size if seq is None else count("ModelShape.from_gpt: seq", seq)
        return cls(config.n_layer, config.n_embd, config.n_head, config.vocab_size, seq, ffn=config.mlp_ratio * config.n_embd,
                   tie_weights=config.tie_weights, positions=config.block_size)

    def with_seq(self, seq: int) -> ModelShape:
        return replace(self, seq=seq)

    @property
    def kv_head_count(self) -> int:
        return self.kv_heads or self.n_head

    @property
    def d_kv(self) -> int:
        return self.d_model // self.n_head * self.kv_head_count

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.d_model

    def layer_tensors(self) -> list[int]:
        """Element counts of one layer's parameters, in registration order."""
        d, f, kv = self.d_model, self.ffn_size, self.d_kv
        if self.style == "llama":
            return [d, d * d, 2 * kv * d, d * d, d, f * d, f * d, d * f]
        return [d, d, (d + 2 * kv) * d, d * d, d, d, d, d * f, f, f * d, d]

    def tensors(self) -> list[tuple[str, int]]:
        """(unit, elements) of every distinct parameter, in the module's registration order;
        unit ``"root"`` or ``"blocks.i"`` (the kit wraps each layer as an FSDP unit)."""
        d = self.d_model
        out = [("root", self.vocab * d)]
        if self.style == "gpt":
            out.append(("root", (self.positions or self.seq) * d))
        for i in range(self.n_layer):
            out += [(f"blocks.{i}", n) for n in self.layer_tensors()]
        out += [("root", n) for n in ([d, d] if self.style == "gpt" else [d])]
        if not self.tie_weights:
            out.append(("root", self.vocab * d))
        return out

    def params(self) -> int:
        return sum(n for _, n in self.tensors())

    def activation_bytes(self, micro_batch: int, elem_bytes: int = 4,
                         checkpointing: bool = False, moment: str = "forward end",
                         done: int = 1) -> int:
        """Bytes of activations alive at a moment of the step, for one micro-batch.

        ``"forward end"``: everything saved for backward, and the logits' gradient (see the
        module docstring); ``"backward start"``: and an untied head's weight gradient (the head
        has run its backward). ``"backward"``: during the backward of a layer once ``done``
        layers above it have finished theirs (1: the second-last layer), the head's and those
        layers' activations are freed; alive are the other layers', the
        gradient of the residual stream (2d per token), the layer's two largest weight
        gradients before they are flattened (2 d x ffn) and an untied head's weight gradient
        (vocab x d, reduced with the root at the end of backward). With ``checkpointing`` each layer keeps
        only its input (d per token) and the layer in backward is recomputed whole (the last one
        right at backward start)."""
        name = "ModelShape.activation_bytes: {}".format
        micro_batch = count(name("micro_batch"), micro_batch, at_most=MAX_COUNT)
        elem_bytes = count(name("elem_bytes"), elem_bytes, at_most=8)
        flag(name("checkpointing"), checkpointing)
        choice(name("moment"), moment, MOMENTS)
        done = count(name("done"), done, at_least=0, at_most=MAX_LAYERS)
        d, f, tokens = self.d_model, self.ffn_size, micro_batch * self.seq
        llama = self.style == "llama"
        stats = 1 if llama else 2  # fp32 statistics per norm and token
        layer = (6 * d + 2 * self.d_kv + (4 if llama else 2) * f) * elem_bytes \
            + (2 * stats + self.n_head) * 4
        kept = d * elem_bytes if checkpointing else layer  # what each layer keeps for backward
        head_grad = 0 if self.tie_weights else self.vocab * d * elem_bytes
        if moment in ("forward end", "backward start"):
            around = (2 * d + 3 * self.vocab) * elem_bytes + stats * 4
            # Note: with checkpointing the last layer is recomputed as soon as the head has run
            # its backward, while the head's tensors are still alive.
            again = layer if checkpointing and moment == "backward start" else 0
            return (tokens * (around + self.n_layer * kept + again)
                    + (head_grad if moment == "backward start" else 0))
        working = (layer if checkpointing else 0) + 2 * d * elem_bytes  # "backward"
        return (tokens * (d * elem_bytes + max(self.n_layer - done, 0) * kept + working)
                + 2 * d * f * elem_bytes + head_grad)


# "Class" shapes: approximately the published Llama-2 shapes of each size, for planning only.
PRESETS: dict[str, ModelShape] = {
    "7b": ModelShape(32, 4096, 32, 32000, 4096, ffn=11008, style="llama", tie_weights=False),
    "13b": ModelShape(40, 5120, 40, 32000, 4096, ffn=13824, style="llama", tie_weights=False),
    "70b": ModelShape(80, 8192, 64, 32000, 4096, kv_heads=8, ffn=28672, style="llama",
                      tie_weights=False),
}
