"""Lab 01 (memory): fresh wrong answers for the exercise 01_predict_peak."""
import torch

from wrong_answers.round2 import Case
from fsdp_mini import labs
from fsdp_mini.theory import persistent_bytes


def check(fn):
    gpt = labs.lab_config(world_size=2, model="tiny").gpt()      # CI sizes
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return labs.check_peak_predictor(fn, gpt, device)


BYTES_PER_VALUE = 4
STATE_VALUES = {"sgd": 0, "momentum": 1, "adam": 2}


# 1. Adam keeps only one extra value per parameter (12 B in all)
def peak_adam_one_moment(n_params, activation_bytes, optimizer="adam"):
    values = {"sgd": 0, "momentum": 1, "adam": 1}
    return (2 + values[optimizer]) * BYTES_PER_VALUE * n_params + activation_bytes


# 2. forgets the gradients
def peak_no_grads(n_params, activation_bytes, optimizer="adam"):
    params = BYTES_PER_VALUE * n_params
    optimizer_state = STATE_VALUES[optimizer] * BYTES_PER_VALUE * n_params
    return params + optimizer_state + activation_bytes


# 3. forgets the parameters themselves
def peak_no_params(n_params, activation_bytes, optimizer="adam"):
    grads = BYTES_PER_VALUE * n_params
    optimizer_state = STATE_VALUES[optimizer] * BYTES_PER_VALUE * n_params
    return grads + optimizer_state + activation_bytes


# 4. activations counted twice (once for forward, once for backward)
def peak_activations_twice(n_params, activation_bytes, optimizer="adam"):
    state = (2 + STATE_VALUES[optimizer]) * BYTES_PER_VALUE * n_params
    return state + 2 * activation_bytes


# 5. model state only, activations left out
def peak_no_activations(n_params, activation_bytes, optimizer="adam"):
    return (2 + STATE_VALUES[optimizer]) * BYTES_PER_VALUE * n_params


# 6. max of model state and activations ("they are never alive at once")
def peak_max_not_sum(n_params, activation_bytes, optimizer="adam"):
    state = (2 + STATE_VALUES[optimizer]) * BYTES_PER_VALUE * n_params
    return max(state, activation_bytes)


# 7. tight estimate: gradients and activations overlap, so only the larger one counts
def peak_grads_or_activations(n_params, activation_bytes, optimizer="adam"):
    params = BYTES_PER_VALUE * n_params
    grads = BYTES_PER_VALUE * n_params
    optimizer_state = STATE_VALUES[optimizer] * BYTES_PER_VALUE * n_params
    return params + optimizer_state + max(grads, activation_bytes)


# 8. only Adam has state: momentum treated like plain SGD
def peak_momentum_stateless(n_params, activation_bytes, optimizer="adam"):
    state_values = 2 if optimizer == "adam" else 0
    return (2 + state_values) * BYTES_PER_VALUE * n_params + activation_bytes


# 9. momentum given two buffers like Adam
def peak_momentum_two_buffers(n_params, activation_bytes, optimizer="adam"):
    values = {"sgd": 0, "momentum": 2, "adam": 2}
    return (2 + values[optimizer]) * BYTES_PER_VALUE * n_params + activation_bytes


# 10. ZeRO's 16 Psi for every optimizer
def peak_16_psi_always(n_params, activation_bytes, optimizer="adam"):
    return persistent_bytes((), n_params, world_size=1) + activation_bytes


# 11. the measured 16.01 B per parameter for Adam (the assert's 8.01 for m and v)
def peak_measured_adam_ratio(n_params, activation_bytes, optimizer="adam"):
    per_param = {"sgd": 8, "momentum": 12, "adam": 16.01}
    return per_param[optimizer] * n_params + activation_bytes


# 12. activation_bytes taken as a count of float32 values and multiplied by 4
def peak_activations_times_four(n_params, activation_bytes, optimizer="adam"):
    state = (2 + STATE_VALUES[optimizer]) * BYTES_PER_VALUE * n_params
    return state + BYTES_PER_VALUE * activation_bytes


# 13. the default optimizer changed to "sgd"
def peak_default_sgd(n_params, activation_bytes, optimizer="sgd"):
    state = (2 + STATE_VALUES[optimizer]) * BYTES_PER_VALUE * n_params
    return state + activation_bytes


# 14. every part rounded up to the CUDA caching allocator's 512-byte blocks
def peak_rounded_to_blocks(n_params, activation_bytes, optimizer="adam"):
    def up(b):
        return -(-b // 512) * 512
    params = up(BYTES_PER_VALUE * n_params)
    grads = up(BYTES_PER_VALUE * n_params)
    optimizer_state = STATE_VALUES[optimizer] * up(BYTES_PER_VALUE * n_params)
    return params + grads + optimizer_state + up(activation_bytes)


E = "01_predict_peak"
CASES = [
    Case(E, "Adam counted with one moment: 12 B per parameter instead of 16", lambda: check(peak_adam_one_moment)),
    Case(E, "forgets the gradients (4 B per parameter)", lambda: check(peak_no_grads)),
    Case(E, "forgets the parameters themselves", lambda: check(peak_no_params)),
    Case(E, "adds the activations twice (forward and backward)", lambda: check(peak_activations_twice)),
    Case(E, "model state only, activations left out", lambda: check(peak_no_activations)),
    Case(E, "max of model state and activations instead of their sum", lambda: check(peak_max_not_sum)),
    Case(E, "counts only the larger of gradients and activations (a tight estimate, not the bound)", lambda: check(peak_grads_or_activations)),
    Case(E, "momentum SGD given no optimizer state, like plain SGD", lambda: check(peak_momentum_stateless)),
    Case(E, "momentum SGD given two buffers like Adam", lambda: check(peak_momentum_two_buffers)),
    Case(E, "uses ZeRO's 16 Psi for every optimizer", lambda: check(peak_16_psi_always)),
    Case(E, "uses the measured 16.01 B per parameter for Adam instead of 16", lambda: check(peak_measured_adam_ratio)),
    Case(E, "multiplies activation_bytes by 4 as if it were a count of floats", lambda: check(peak_activations_times_four)),
    Case(E, "default optimizer changed from adam to sgd", lambda: check(peak_default_sgd)),
    Case(E, "rounds every part up to 512-byte allocator blocks", lambda: check(peak_rounded_to_blocks)),
]
