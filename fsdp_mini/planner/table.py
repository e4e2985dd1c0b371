"""The planner's table, as ``fsdp-mini plan`` prints it and the Planner widget shows it.

Blocks per plan: memory per GPU by category, the peak with the reserve kept free, whether it
fits; traffic and time per step: bytes sent, the step's compute, the communication the overlap
does not hide, offload, and GPU-hours per million tokens; with a training budget, the time to
train, the GPU-hours and, with a price per GPU-hour, the cost. The assumptions the time rests
on (GPU, FLOP/s, efficiency, both network levels, the reserve) are printed under them.
"""

from __future__ import annotations

from .plan import Plan

CATEGORIES = ("params", "grads", "optimizer_state", "gathered_params", "comm_buffers",
              "activations")
SHORT = ("param", "grads", "optim", "gathr", "comm", "activ")


def format_plan(p: Plan) -> str:
    """The terminal table of ``fsdp-mini plan`` (GB, or MB / kB for small models)."""
    if not isinstance(p, Plan):
        raise TypeError(f"format_plan: p must be a Plan (what fsdp_mini.plan returns), got "
                        f"{type(p).__name__}")
    peak = max((s.peak_bytes for s in p.strategies.values()), default=0)
    unit, scale = next((u, f) for u, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1))
                       if peak >= f or f == 1)
    head = (f"{'strategy':<8} {'state ' + unit:>8} " + " ".join(f"{s:>7}" for s in SHORT)
            + f" {'peak ' + unit:>8} {'+resv':>7} {'fits':>4}  peak at")
    title = (f"Ψ = {p.params:,} parameters, {p.gpus} GPUs of {p.gpu_mem_bytes / 1e9:g} GB, "
             f"{p.precision}, gradients reduced in {p.reduce_dtype}; "
             f"{p.reserve_bytes / 1e9:.3g} GB kept free per GPU")
    lines = [title, head, "-" * len(head)]
    for name, s in p.strategies.items():
        cat = " ".join(f"{s.by_category[c] / scale:7.2f}" for c in CATEGORIES)
        lines.append(f"{name:<8} {s.persistent_bytes / scale:8.2f} {cat}"
                     f" {s.peak_bytes / scale:8.2f} {(s.peak_bytes + p.reserve_bytes) / scale:7.2f}"
                     f" {'yes' if s.fits else 'NO':>4}  {s.peak_moment}")
    lines += ["", _time_block(p, unit, scale)]
    if p.train_steps is not None:
        lines += ["", _budget_block(p)]
    a = p.assumptions
    lines += [f"time: {p.tokens_per_gpu_per_step:,} tokens per GPU per step; {a['gpu']} at "
              f"{a['peak_flops'] / 1e12:g} TFLOPS x {a['efficiency']:.0%}; inside a node "
              f"({a['gpus_per_node']} GPUs) {a['node_link']}, across nodes {a['across_nodes']}",
              f"reserve: {a['reserve']}"]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _budget_block(p: Plan) -> str:
    price = ("no price given (price_per_gpu_hour=...)" if p.price_per_gpu_hour is None
             else f"at {p.price_per_gpu_hour:g} per GPU-hour (your price)")
    head = f"{'strategy':<8} {'days':>8} {'hours':>10} {'GPU-hours':>12} {'cost':>14}  fits"
    rows = [f"to train {p.train_tokens:,.0f} tokens ({p.train_steps:,} steps of "
            f"{p.tokens_per_gpu_per_step * p.gpus:,} tokens), {price}:", head, "-" * len(head)]
    for name, s in p.strategies.items():
        cost = "-" if s.train_cost is None else f"{s.train_cost:,.0f}"
        rows.append(f"{name:<8} {s.train_hours / 24:8.1f} {s.train_hours:10.1f} "
                    f"{s.train_gpu_hours:12,.0f} {cost:>14}  {'yes' if s.fits else 'NO'}")
    return "\n".join(rows)


def _time_block(p: Plan, unit: str, scale: float) -> str:
    head = (f"{'strategy':<8} {'sent ' + unit + '/step':>12} {'comm s':>8} {'compute s':>9} "
            f"{'exposed s':>9} {'offload s':>9} {'step s':>8} {'GPU-h/Mtok':>10}")
    rows = [head, "-" * len(head)]
    for name, s in p.strategies.items():
        rows.append(f"{name:<8} {s.sent_bytes_per_step / scale:12.3f} "
                    f"{s.comm_seconds_per_step:8.3g} {s.compute_seconds:9.3g} "
                    f"{s.exposed_comm_seconds:9.3g} {s.offload_seconds:9.3g} "
                    f"{s.step_seconds:8.3g} {s.gpu_hours_per_million_tokens:10.3g}")
    if any(s.offloaded_bytes for s in p.strategies.values()):
        rows += [f"offload: {name} keeps {s.host_bytes_per_node / 1e9:.3g} GB per node in host "
                 f"memory, moves {s.pcie_bytes_per_step / 1e9:.3g} GB over PCIe per GPU and step"
                 for name, s in p.strategies.items() if s.offloaded_bytes]
    return "\n".join(rows)
