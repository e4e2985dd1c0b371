"""Lab 01, reference solution: an upper bound of the peak memory of one fp32 training step.

Every parameter has its value and its gradient (4 B each in fp32); the optimizer keeps
0 (SGD), 1 (momentum) or 2 (Adam: m and v) more values per parameter. The activations come on
top, once: saved during forward, freed during backward. The sum bounds the peak from above: the
true peak is lower, because the gradients appear while backward frees the activations.
"""

BYTES_PER_VALUE = 4                                   # fp32
STATE_VALUES = {"sgd": 0, "momentum": 1, "adam": 2}   # values the optimizer keeps per parameter


def predict_peak(n_params, activation_bytes, optimizer="adam"):
    """An upper bound of the peak bytes of one fp32 training step: model state + activations."""
    params = BYTES_PER_VALUE * n_params
    grads = BYTES_PER_VALUE * n_params
    optimizer_state = STATE_VALUES[optimizer] * BYTES_PER_VALUE * n_params
    return params + grads + optimizer_state + activation_bytes
