"""Lab 01's wrong answers to ``predict_peak``, and the words ``labs.check_peak_predictor`` must use.

Most are a formula with the wrong bytes per parameter for (sgd, momentum, adam), the activations
counted the wrong number of times, or the wrong unit (``per_param``).
"""

from fsdp_mini import labs
from wrong_answers import Wrong


def per_param(sgd, momentum, adam, activations=1.0, scale=1.0):
    """A predictor with the given bytes per parameter for each optimizer."""
    table = {"sgd": sgd, "momentum": momentum, "adam": adam}
    return lambda n, a, optimizer="adam": (table[optimizer] * n + activations * a) * scale


def larger_of_the_two(n_params, activation_bytes, optimizer="adam"):
    """The peak as the larger of model state and activations, not their sum."""
    return max({"sgd": 8, "momentum": 12, "adam": 16}[optimizer] * n_params, activation_bytes)


def forgot_sgd(n_params, activation_bytes, optimizer="adam"):
    return {"adam": 16}[optimizer] * n_params + activation_bytes


def check(fn):
    return lambda: labs.check_peak_predictor(fn)


EX = "01_predict_peak"
WRONG = [
    Wrong(EX, "optimizer state left out", check(per_param(8, 8, 8)),
          ("you left out the optimizer state",)),
    Wrong(EX, "one Adam moment", check(per_param(8, 12, 12)),
          ("you counted one moment for adam; it keeps two",)),
    Wrong(EX, "no momentum buffer", check(per_param(8, 8, 16)),
          ("you left out the momentum buffer",)),
    Wrong(EX, "no gradients", check(per_param(4, 8, 12)), ("you left out the gradients",)),
    Wrong(EX, "2 bytes per value", check(per_param(4, 6, 8)),
          ("you used 2 bytes per value (fp16/bf16 thinking)",)),
    Wrong(EX, "bits, not bytes", check(per_param(64, 96, 128)),
          ("you counted bits, not bytes",)),
    Wrong(EX, "Adam's state for every optimizer", check(per_param(16, 16, 16)),
          ("you counted adam's state for every optimizer",)),
    Wrong(EX, "one copy too many", check(per_param(12, 16, 20)),
          ("one 4-byte copy per parameter too many",)),
    Wrong(EX, "an fp32 master copy for Adam only (mixed-precision recipe)",
          check(per_param(8, 12, 20)), ("master copy", "mixed precision")),
    Wrong(EX, "only the optimizer state", check(per_param(0, 4, 8)),
          ("you counted only the optimizer state",)),
    Wrong(EX, "activations twice", check(per_param(8, 12, 16, activations=2)),
          ("you counted the activations twice",)),
    Wrong(EX, "no activations", check(per_param(8, 12, 16, activations=0)),
          ("you left out the activations",)),
    Wrong(EX, "the larger of state and activations, not the sum", check(larger_of_the_two),
          ("you left out the activations",)),
    Wrong(EX, "MB, not bytes", check(per_param(8, 12, 16, scale=1e-6)),
          ("you returned mb, not bytes",)),
    Wrong(EX, "GiB, not bytes", check(per_param(8, 12, 16, scale=2 ** -30)),
          ("you returned gib, not bytes",)),
    Wrong(EX, "9 B for sgd (no known pattern)", check(per_param(9, 12, 17)),
          ("model state with sgd: your formula gives 9 b per parameter",)),
    Wrong(EX, "a dict with only adam (KeyError)", check(forgot_sgd),
          ("raised keyerror: 'sgd'",)),
    Wrong(EX, "returns a string", check(lambda n, a, optimizer="adam": "lots"),
          ("returned 'lots' (str)", "return the number of bytes")),
]
