"""Lab 07 (07_bigger.ipynb): fresh wrong answers for cheapest_fit, each one mistake away from
the reference solution."""
from wrong_answers.round2 import Case
import fsdp_mini
from fsdp_mini import labs

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
PRECISIONS = ("fp32", "bf16-mixed")


def _config(strategy, precision, checkpointing):
    return {"strategy": strategy, "precision": precision, "checkpointing": checkpointing}


# 1. fits judged on the state kept between steps (persistent_bytes), not on the peak
def fit_on_state(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                fits = s.persistent_bytes + p.reserve_bytes <= gpu_mem_gb * 1e9
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 2. peak compared with the whole GPU, the reserve forgotten
def fit_no_reserve(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.peak_bytes <= gpu_mem_gb * 1e9 and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 3. cheapest = fewest bytes sent, not the fastest step
def fit_fewest_bytes(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                cost = (s.sent_bytes_per_step, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 4. the step's time taken as compute + all the communication (no overlap)
def fit_no_overlap(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                seconds = s.compute_seconds + s.comm_seconds_per_step
                cost = (seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 5. at equal times the later (more sharded) strategy wins: <= instead of <, no tie-break tuple
def fit_ties_last(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_time = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                if s.fits and (best_time is None or s.step_seconds <= best_time):
                    best_time, best = s.step_seconds, _config(strategy, precision, checkpointing)
    return best


# 6. micro_batch never passed to plan (planned at its default, 1)
def fit_ignores_micro_batch(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               checkpointing=checkpointing, strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 7. planned from the parameter count: activations not counted
def fit_from_params(model, gpus, gpu_mem_gb, micro_batch=1):
    psi = fsdp_mini.plan(model=model, gpus=gpus).params
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(psi, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 8. a default configuration instead of None when nothing fits
def fit_default_when_none(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    if best is None:       # "the most memory-saving one, then"
        best = _config("fsdp", "bf16-mixed", True)
    return best


# 9. the GPU's GB converted to GiB before planning (80 GB read as 74.5)
def fit_gib(model, gpus, gpu_mem_gb, micro_batch=1):
    mem = gpu_mem_gb * 1e9 / 2**30
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=mem, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 10. checkpointing never tried ("it only makes the step slower")
def fit_no_checkpointing(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    checkpointing = False
    for precision in PRECISIONS:
        p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                           micro_batch=micro_batch, checkpointing=checkpointing,
                           strategies=STRATEGIES)
        for strategy, s in p.strategies.items():
            cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
            if s.fits and (best_cost is None or cost < best_cost):
                best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 14. bf16-mixed planned with its gradients reduced in bf16 (parallelize reduces in fp32)
def fit_bf16_reduce(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES,
                               reduce_dtype="bf16" if precision == "bf16-mixed" else None)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 11. strategies= left out: hsdp among the candidates
def fit_with_hsdp(model, gpus, gpu_mem_gb, micro_batch=1):
    order = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing)
            for strategy, s in p.strategies.items():
                cost = (s.step_seconds, checkpointing, order.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


# 12. the first configuration that fits, in loop order, not the fastest
def fit_first_found(model, gpus, gpu_mem_gb, micro_batch=1):
    for checkpointing in (False, True):
        for precision in ("bf16-mixed", "fp32"):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy in STRATEGIES:
                if p.strategies[strategy].fits:
                    return _config(strategy, precision, checkpointing)
    return None


# 13. ranked by compute time alone
def fit_compute_only(model, gpus, gpu_mem_gb, micro_batch=1):
    best, best_cost = None, None
    for precision in PRECISIONS:
        for checkpointing in (False, True):
            p = fsdp_mini.plan(model=model, gpus=gpus, gpu_mem_gb=gpu_mem_gb, precision=precision,
                               micro_batch=micro_batch, checkpointing=checkpointing,
                               strategies=STRATEGIES)
            for strategy, s in p.strategies.items():
                # compute only: "communication overlaps, so the FLOPs decide"
                cost = (s.compute_seconds, checkpointing, STRATEGIES.index(strategy))
                if s.fits and (best_cost is None or cost < best_cost):
                    best_cost, best = cost, _config(strategy, precision, checkpointing)
    return best


CASES = [
    Case("07_cheapest_fit", "fits judged on the persistent state, not the peak",
         lambda: labs.check_cheapest_fit(fit_on_state)),
    Case("07_cheapest_fit", "peak compared with the whole GPU memory, reserve forgotten",
         lambda: labs.check_cheapest_fit(fit_no_reserve)),
    Case("07_cheapest_fit", "cheapest taken as the fewest bytes sent instead of the fastest step",
         lambda: labs.check_cheapest_fit(fit_fewest_bytes)),
    Case("07_cheapest_fit", "step time as compute plus all communication, overlap ignored",
         lambda: labs.check_cheapest_fit(fit_no_overlap)),
    Case("07_cheapest_fit", "at equal times keeps the last candidate (more sharded, checkpointing)",
         lambda: labs.check_cheapest_fit(fit_ties_last)),
    Case("07_cheapest_fit", "micro_batch not passed to plan (always planned with 1)",
         lambda: labs.check_cheapest_fit(fit_ignores_micro_batch)),
    Case("07_cheapest_fit", "planned from the parameter count, activations not counted",
         lambda: labs.check_cheapest_fit(fit_from_params)),
    Case("07_cheapest_fit", "returns fsdp/bf16/checkpointing instead of None when nothing fits",
         lambda: labs.check_cheapest_fit(fit_default_when_none)),
    Case("07_cheapest_fit", "GPU memory converted from GB to GiB before planning",
         lambda: labs.check_cheapest_fit(fit_gib)),
    Case("07_cheapest_fit", "checkpointing candidates never tried",
         lambda: labs.check_cheapest_fit(fit_no_checkpointing)),
    Case("07_cheapest_fit", "bf16-mixed planned with gradients reduced in bf16 (reduce_dtype)",
         lambda: labs.check_cheapest_fit(fit_bf16_reduce)),
    Case("07_cheapest_fit", "strategies not restricted: hsdp can be returned",
         lambda: labs.check_cheapest_fit(fit_with_hsdp)),
    Case("07_cheapest_fit", "returns the first fitting candidate in loop order, not the fastest",
         lambda: labs.check_cheapest_fit(fit_first_found)),
    Case("07_cheapest_fit", "ranks by compute time only, exposed communication ignored",
         lambda: labs.check_cheapest_fit(fit_compute_only)),
]
