"""Assessment, task 4, reference solution: the bytes one rank sends per step in a configuration.

Ring collectives on N ranks: an all-gather or a reduce-scatter sends (N-1)/N of its payload, an
all-reduce 2(N-1)/N. Bytes per element: 4 in fp32; 2 in bf16-mixed, for the parameters gathered
and the gradients reduced alike (the planner's bf16-mixed). Checkpointing changes no byte.
"""


def bytes_per_step(config, units, world_size):
    """Bytes one rank sends per step; ``units``: {"blocks.0": elements, ..., "root": elements}."""
    ring = (world_size - 1) / world_size
    size = 2 if config["precision"] == "bf16-mixed" else 4     # bytes per element
    psi = sum(units.values())
    if config["strategy"] == "ddp":
        return 2 * ring * psi * size                 # one all-reduce of the gradients
    if config["strategy"] in ("zero1", "zero2"):
        return ring * psi * (size + size)            # reduce-scatter gradients, all-gather params
    sent = 0.0                                       # fsdp, unit by unit
    for name, numel in units.items():
        gathers = 1 if name == "root" else 2         # the root stays gathered for its backward
        sent += ring * numel * (gathers * size + size)
    return sent
