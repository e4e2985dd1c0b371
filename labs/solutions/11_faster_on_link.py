"""Assessment, task 2, reference solution: each run's step on a link, by the α-β model, from the
collectives the ledger counted; the faster run is the one with the smaller time.

A step is its compute plus, for every collective, its latency (each rank sends N-1 messages one
after another in a ring: (N-1)α for an all-gather or a reduce-scatter, 2(N-1)α for an all-reduce)
and its bytes over the bandwidth (the ledger's sent_bytes are already what one rank sends).
"""


def faster_on_link(runs, world_size, bandwidth_gbs, latency_us):
    """{"ddp": seconds, "fsdp": seconds, "faster": the name of the faster run}."""
    alpha = latency_us * 1e-6                 # seconds per message
    bytes_per_second = bandwidth_gbs * 1e9    # GB/s = 10**9 bytes per second
    seconds = {}
    for name, run in runs.items():
        latency = sum((2 if c["op"] == "all_reduce" else 1) * (world_size - 1) * alpha
                      for c in run["collectives"])
        transfer = sum(c["sent_bytes"] for c in run["collectives"]) / bytes_per_second
        seconds[name] = run["compute_s"] + latency + transfer
    return {**seconds, "faster": min(seconds, key=seconds.get)}
