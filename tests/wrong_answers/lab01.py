"""Lab 01's wrong answers to ``predict_peak``, and the words ``labs.check_peak_predictor`` must use.

Most are a formula with the wrong bytes per parameter for (sgd, momentum, adam), the activations
counted the wrong number of times, or the wrong unit (``per_param``).
"""

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


EX = "01_predict_peak"
WRONG = [
    Wrong(EX, "optimizer state left out", per_param(8, 8, 8),
          ("right with sgd", "4 b short with momentum", "8 b short with adam")),
    Wrong(EX, "one Adam moment", per_param(8, 12, 12),
          ("right with momentum", "4 b short with adam")),
    Wrong(EX, "no momentum buffer", per_param(8, 8, 16),
          ("4 b short with momentum", "right with adam")),
    Wrong(EX, "no gradients", per_param(4, 8, 12),
          ("4 b short with sgd, 4 b short with momentum, 4 b short with adam",)),
    Wrong(EX, "2 bytes per value", per_param(4, 6, 8),
          ("0.5x the reference's with every optimizer", "2 bytes per value")),
    Wrong(EX, "bits, not bytes", per_param(64, 96, 128), ("bits, not bytes",)),
    Wrong(EX, "Adam's state for every optimizer", per_param(16, 16, 16),
          ("8 b too many with sgd", "4 b too many with momentum", "right with adam")),
    Wrong(EX, "one copy too many", per_param(12, 16, 20),
          ("4 b too many with sgd, 4 b too many with momentum, 4 b too many with adam",)),
    Wrong(EX, "an fp32 master copy for Adam only (mixed-precision recipe)",
          per_param(8, 12, 20), ("right with sgd, right with momentum, 4 b too many with adam",)),
    Wrong(EX, "only the optimizer state", per_param(0, 4, 8),
          ("8 b short with sgd, 8 b short with momentum, 8 b short with adam",)),
    Wrong(EX, "activations twice", per_param(8, 12, 16, activations=2),
          ("adds the activations 2 times",)),
    Wrong(EX, "no activations", per_param(8, 12, 16, activations=0),
          ("adds the activations 0 times",)),
    Wrong(EX, "the larger of state and activations, not the sum", larger_of_the_two,
          ("not the model state plus the activations",)),
    Wrong(EX, "MB, not bytes", per_param(8, 12, 16, scale=1e-6), ("mb, not bytes",)),
    Wrong(EX, "GiB, not bytes", per_param(8, 12, 16, scale=2 ** -30), ("gib, not bytes",)),
    Wrong(EX, "9 B for sgd (no known pattern)", per_param(9, 12, 17),
          ("1 b too many with sgd", "right with momentum", "1 b too many with adam")),
    Wrong(EX, "a dict with only adam (KeyError)", forgot_sgd, ("raised keyerror: 'sgd'",)),
    Wrong(EX, "returns a string", lambda n, a, optimizer="adam": "lots",
          ("yours 'lots'", "return the number of bytes")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("01")
