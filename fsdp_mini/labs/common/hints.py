"""What a divergence of a training run says, read the same way by every lab's check.

Each function reads a :class:`~fsdp_mini.labs.common.compare.Divergence` (where the answer first
differs from the reference, and every configuration's records), never the answer itself::

    power_of_n(d, "grads") == 1      # the gradients are N times the reference's at every N
    divides_by(d, "grads") == 2.0    # ... the sum was divided by 2 whatever N was
    ranks_differ(d, "grads")         # rank 0 and rank 1 hold different gradients there

``TRAINING_HINTS`` are the hints every training check shares (a hang, a gradient not there yet,
ranks issuing other collectives, the start, memory growing step by step, right only in step 1);
a lab adds its own in front of them.
"""

from __future__ import annotations

import math

from .compare import agree
from .differential import Hint, near


def ratios(d, observable: str, step: int = 1) -> list[tuple[int, float]]:
    """(N, yours / the reference's) of rank 0's ``observable`` at ``step``, where they differ."""
    out = []
    for cfg, mine, want in d.pairs(observable, step=step):
        a = agree(mine, want, 0) if mine is not None and want is not None else None
        if a is not None and not a.same and a.ratio and a.ratio > 0:
            out.append((cfg["world_size"], a.ratio))
    return out


def power_of_n(d, observable: str) -> int | None:
    """k where ``observable`` is N^k times the reference's at every N > 1 that differs (1: a sum
    not divided by N; -1: divided by N twice)."""
    found = [math.log(r) / math.log(n) for n, r in ratios(d, observable) if n > 1]
    k = round(found[0]) if found else 0
    return k if k and len(found) > 1 and all(abs(f - k) < 0.02 for f in found) else None


def divides_by(d, observable: str) -> float | None:
    """What a sum was divided by, where that is one number at every N: N / ratio."""
    found = [n / r for n, r in ratios(d, observable)]
    return found[0] if len(found) > 1 and all(near(f, found[0]) for f in found) else None


def ranks_differ(d, observable: str) -> bool:
    """In the first differing configuration, rank 0's and rank 1's ``observable`` differ where
    the reference's agree (under sharding, ranks hold different shards by design)."""
    mine, want = d.table[d.config]
    step = d.where.get("step", 1)

    def differ(record):
        one = record.get(observable, rank=1, step=step)
        return one is not None and not agree(record.get(observable, rank=0, step=step), one,
                                             1e-6).same
    return differ(mine) and not differ(want)


def _raised(d, *words) -> bool:
    return bool(d.raised) and any(w in d.raised[0] + d.raised[1] for w in words)


HANG = ("a rank waits in a collective another rank never makes: every rank must issue the same "
        "collectives, in the same order, every step")
def _ratio_words(d, observable: str) -> str:
    found = dict(ratios(d, observable))
    r, n = ", ".join(f"{v:.3g}" for v in found.values()), ", ".join(f"{k:.3g}" for k in found)
    by = ", ".join(f"{k / v:.3g}" for k, v in found.items())
    return (f"your gradients are {r}x the reference's at N = {n}: the sum over ranks divided by "
            f"{by} instead of N")


def scale_hints(observable: str = "grads") -> list[Hint]:
    """What the size of ``observable`` (a gradient) beside the reference's says of the average:
    N^1 (not divided), N^-1 (divided twice), or another divisor at each N."""
    def on(test):
        return lambda d: d.observable == observable and test(d)
    return [Hint(on(lambda d: power_of_n(d, observable) == 1), "the gradients are N times too "
                 "large: divide the sum over ranks by the world size (AdamW hides it)"),
            Hint(on(lambda d: power_of_n(d, observable) == -1), "the gradients are N times too "
                 "small: divided by N twice; divide the sum by the world size once"),
            Hint(on(lambda d: len(dict(ratios(d, observable))) > 1),
                 lambda d: _ratio_words(d, observable))]


# A buffer made without its tensors' dtype is right only in float32 (and a byte count that
# assumes 4 B per element too): the configurations in other dtypes show it.
DTYPE = Hint(lambda d: d.only_where(lambda c: c.get("dtype", "float32") != "float32"),
             lambda d: f"right in float32 only, wrong with {d.config['dtype']} parameters: take "
             f"every buffer's dtype and device from the tensors it holds (torch.empty_like, or "
             f"dtype=flat.dtype, device=flat.device), and bytes from element_size() (2 B in "
             f"bfloat16, 4 in float32), never a fixed 4")

ROUNDING = Hint(lambda d: d.ratio is not None and abs(d.ratio - 1) < 0.01 and all(
    c.get("dtype") == "bfloat16" for c in d.differ) and d.differ, "yours differs from the "
    "reference by less than 1 %, in bfloat16 only: the same numbers rounded in another order "
    "(each bfloat16 operation rounds to 8 bits). Do the operations in the reference's order: "
    "reduce first, then divide the result in place, with no tensors in between")

def _count(d, of: int, op: str = "broadcast") -> int:
    """How many ``op`` collectives yours (of=0) or the reference's (of=1) made there."""
    return sum(1 for r in (d.whole[of] or ()) if r[0] == op)


def _more(d) -> int:
    """How many bytes more than the reference's yours holds (0 if not more, or not numbers)."""
    return d.mine - d.want if isinstance(d.mine, int) and isinstance(d.want, int) and \
        d.mine > d.want else 0


TRAINING_HINTS = [
    DTYPE,
    ROUNDING,
    Hint(lambda d: _raised(d, "a hang", "Mismatch"), HANG),
    Hint(lambda d: _raised(d, "None"), "something was still None: a gradient is there only once "
         "autograd has made it (register_post_accumulate_grad_hook; a bucket once every "
         "gradient in it has arrived)"),
    Hint(lambda d: d.observable == "start", "every rank must start from rank 0's weights: "
         "broadcast each parameter from rank 0 when wrapping (comm.broadcast(p.data, src=0))"),
    Hint(lambda d: d.observable == "ledger" and d.where.get("step") == 0, lambda d: "wrapping "
         "sends each parameter once, a broadcast from rank 0: " + (
             f"yours made {_count(d, 0)} broadcasts where the reference makes {_count(d, 1)}: "
             "every parameter, biases and norms included" if _count(d, 0) < _count(d, 1) else
             f"yours made {_count(d, 0)} broadcasts where the reference makes {_count(d, 1)} "
             "(named_parameters() gives a tied weight once; state_dict() names it twice)"
             if _count(d, 0) > _count(d, 1) else "yours sent other collectives, or other sizes")),
    Hint(lambda d: d.observable == "alive" and d.grows, "more memory stays alive after every "
         "step: something keeps each step's tensors (a list or a cache never emptied?)"),
    Hint(lambda d: d.observable == "alive" and _more(d), lambda d: f"after the step "
         f"{_more(d):,} B more of {d.path} are alive than in the reference: a tensor kept on "
         "self (a buffer kept for the next step, or the last step's flat tensor) holds them; "
         "keep no reference once its values are copied back"),
    Hint(lambda d: d.observable == "ledger" and not d.whole[0], "nothing went through comm: the "
         "kit's ledger counts what goes through the comm it gives you (comm.all_reduce, not "
         "dist.all_reduce)"),
    Hint(lambda d: d.observable == "ledger" and d.whole[0] and d.whole[1] and
         len(d.whole[0]) == len(d.whole[1]) and not d.from_a_later_step, "as many collectives as "
         "the reference, but of other sizes: each must carry what the reference's carries (its "
         "own parameter's gradient, its own bucket, its own shard), not one tensor again and "
         "again"),
    Hint(lambda d: d.from_a_later_step and d.observable not in ("weights", "grads", "loss"),
         "right in the first step, not in later ones: reset what you count (and the handles you "
         "keep) at the end of each step, so that the next starts afresh"),
    Hint(lambda d: d.observable == "grads" and ranks_differ(d, "grads"), "after backward the "
         "ranks hold different gradients: they were not averaged. A collective works in place "
         "on the tensor you give it (a copy gets the result, param.grad does not), and an "
         "async_op=True handle must be waited for"),
    Hint(lambda d: d.observable == "grads" and power_of_n(d, "grads") == 1, "the gradients are "
         "N times too large: the sum over ranks was not divided by the world size (AdamW hides "
         "a wrong scale, SGD does not)"),
    Hint(lambda d: d.observable == "grads" and power_of_n(d, "grads") == -1, "the gradients are "
         "N times too small: divided by N twice; divide the sum by the world size once"),
    Hint(lambda d: d.observable == "grads" and divides_by(d, "grads") is not None,
         lambda d: f"the sum of the gradients was divided by {divides_by(d, 'grads'):.3g} "
                   f"whatever the world size: divide it by comm.world_size, once"),
]
