"""Reference solution of lab 06: the bandwidth below which FSDP is slower than DDP (α-β model)."""

import math


def predict_crossover(psi, world_size, units, compute_s, latency_us, margin):
    n, alpha = world_size, latency_us * 1e-6
    payload = 4 * psi                              # fp32 parameters (and gradients), bytes
    ddp_bytes = 2 * (n - 1) / n * payload          # one all-reduce: 2Ψ
    fsdp_bytes = 3 * (n - 1) / n * payload         # per unit 2 all-gathers + 1 reduce-scatter: 3Ψ
    ddp_latency = 2 * (n - 1) * alpha              # one all-reduce: 2(N-1) messages
    fsdp_latency = 3 * units * (n - 1) * alpha     # 3 collectives per unit, (N-1) messages each
    # C + L_f + B_f/b = (1 + m)(C + L_d + B_d/b), solved for b (bytes per second):
    extra_bytes = fsdp_bytes - (1 + margin) * ddp_bytes
    time_left = (1 + margin) * (compute_s + ddp_latency) - compute_s - fsdp_latency
    if extra_bytes <= 0:
        return 0.0 if time_left > 0 else math.inf   # FSDP never more than the margin slower
    if time_left <= 0:
        return math.inf                             # slower at every bandwidth
    return extra_bytes / time_left / 1e9            # GB/s = 10⁹ bytes per second
