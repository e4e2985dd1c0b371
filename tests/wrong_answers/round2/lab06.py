"""Fresh wrong answers for lab 06 (making it fast): 06_predict_crossover.

Each function is the reference solution with one change a learner would make.
"""

import math

from wrong_answers.round2 import Case
from fsdp_mini import labs


def floor_division(psi, world_size, units, compute_s, latency_us, margin):
    """Writes the ring factor with // : 2 * (n - 1) // n is an integer (1 or so), not 2(N-1)/N."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) // n * payload
    fsdp_bytes = 3 * (n - 1) // n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def psi_as_bytes(psi, world_size, units, compute_s, latency_us, margin):
    """Takes Ψ as the payload in bytes: forgot the 4 bytes of an fp32 parameter."""
    n, alpha = world_size, latency_us * 1e-6
    payload = psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def latency_in_ms(psi, world_size, units, compute_s, latency_us, margin):
    """Converts the latency with 1e-3 (as if it were in ms): α 1000x too large."""
    n, alpha = world_size, latency_us * 1e-3
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def n_messages(psi, world_size, units, compute_s, latency_us, margin):
    """Counts N messages per ring collective instead of N - 1 (in both latencies)."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * n * alpha
    fsdp_latency = 3 * units * n * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def root_not_regathered(psi, world_size, units, compute_s, latency_us, margin):
    """Remembers lab 05: the root is not gathered again for backward, so counts 3u - 1
    collectives in the latency (but keeps the table's 3Ψ bytes)."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = (3 * units - 1) * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def zero_without_time_check(psi, world_size, units, compute_s, latency_us, margin):
    """No extra bytes -> returns 0.0 at once, without asking whether any time is left (should be
    inf when FSDP's extra latency alone is more than the margin)."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def edges_swapped(psi, world_size, units, compute_s, latency_us, margin):
    """The two edges swapped: inf where FSDP never loses, 0.0 where it loses everywhere."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return math.inf if time_left > 0 else 0.0
    if time_left <= 0:
        return 0.0
    return extra_bytes / time_left / 1e9


def no_time_left_check(psi, world_size, units, compute_s, latency_us, margin):
    """Handles the no-extra-bytes edge but never checks time_left <= 0: a negative bandwidth
    when FSDP's latency alone is over the margin."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    return extra_bytes / time_left / 1e9


def compute_cancelled(psi, world_size, units, compute_s, latency_us, margin):
    """"C is the same on both sides, so it cancels": drops the compute, though the margin
    multiplies it on DDP's side."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * ddp_latency - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def margin_skips_ddp_latency(psi, world_size, units, compute_s, latency_us, margin):
    """Applies (1 + margin) to DDP's compute but not to DDP's latency."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * compute_s + ddp_latency - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def reduce_scatter_as_all_reduce(psi, world_size, units, compute_s, latency_us, margin):
    """Costs FSDP's reduce-scatter like an all-reduce: 4(N-1)/N of the payload and 4u(N-1)
    messages per step."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = (2 + 2) * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 4 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left / 1e9


def bytes_per_second(psi, world_size, units, compute_s, latency_us, margin):
    """Returns bytes per second: forgot the division by 1e9 for GB/s."""
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi
    ddp_bytes = 2 * (n - 1) / n * payload
    fsdp_bytes = 3 * (n - 1) / n * payload
    ddp_latency = 2 * (n - 1) * alpha
    fsdp_latency = 3 * units * (n - 1) * alpha
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf
    if time_left <= 0:
        return math.inf
    return extra_bytes / time_left


def _check(fn):
    return lambda: labs.check_predict_crossover(fn)


CASES = [
    Case("06_predict_crossover", "floor division in the ring factors: 2*(n-1)//n and 3*(n-1)//n "
         "are integers", _check(floor_division)),
    Case("06_predict_crossover", "Ψ used as bytes: forgot 4 bytes per fp32 parameter",
         _check(psi_as_bytes)),
    Case("06_predict_crossover", "latency converted with 1e-3 (as milliseconds) instead of 1e-6",
         _check(latency_in_ms)),
    Case("06_predict_crossover", "N messages per ring collective instead of N - 1",
         _check(n_messages)),
    Case("06_predict_crossover", "FSDP latency counted as 3u - 1 collectives (root not "
         "re-gathered) while the bytes stay 3Ψ", _check(root_not_regathered)),
    Case("06_predict_crossover", "no extra bytes returns 0.0 without checking that time is left "
         "(should be inf when no time is left)", _check(zero_without_time_check)),
    Case("06_predict_crossover", "the two edges swapped: inf where FSDP never loses, 0.0 where it "
         "always loses", _check(edges_swapped)),
    Case("06_predict_crossover", "never checks time_left <= 0: returns a negative bandwidth when "
         "FSDP's latency alone exceeds the margin", _check(no_time_left_check)),
    Case("06_predict_crossover", "compute cancelled from both sides although the margin multiplies "
         "DDP's", _check(compute_cancelled)),
    Case("06_predict_crossover", "margin applied to DDP's compute but not to DDP's latency",
         _check(margin_skips_ddp_latency)),
    Case("06_predict_crossover", "reduce-scatter costed like an all-reduce: 4(N-1)/N payload and "
         "4 collectives per unit", _check(reduce_scatter_as_all_reduce)),
    Case("06_predict_crossover", "returns bytes per second, not GB/s (no division by 1e9)",
         _check(bytes_per_second)),
]
