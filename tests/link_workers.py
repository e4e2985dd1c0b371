"""What the ranks of tests/test_link.py run (importable, so ranks can unpickle them by reference)."""

from __future__ import annotations

import time
from functools import partial

import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini.comm.collectives import Comm
from fsdp_mini.models import GPTConfig, SyntheticText, make_model
from fsdp_mini.telemetry import Recorder
from fsdp_mini.training import train

MB = 10**6


def _timed(fn) -> float:
    dist.barrier()  # Note: an unlinked barrier, so both ranks start the timed part together
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timings(rank: int, world_size: int, bandwidth_gbs: float, latency_us: float) -> dict:
    """Collectives on a simulated link: blocking, two at once, one hidden behind compute."""
    torch.set_num_threads(1)
    link = fsdp_mini.Link(bandwidth_gbs=bandwidth_gbs, latency_us=latency_us)
    comm = Comm(link=link)
    x = torch.ones(MB // 4)  # a 1 MB payload
    out = {"blocking": _timed(lambda: comm.all_reduce(x, label="blocking"))}
    out["summed"] = x[0].item()

    def two_at_once():
        handles = [comm.all_reduce(x, label="first", async_op=True),
                   comm.all_gather(torch.empty(MB // 4), torch.ones(MB // 8), label="second",
                                   async_op=True)]
        for h in handles:
            h.wait()
        out["ends"] = [h.sim_end for h in handles]  # when each one's simulated transfer ended
    out["two"] = _timed(two_at_once)

    handle = {}

    def hidden():
        handle["h"] = comm.all_reduce(x, label="hidden", async_op=True)
        time.sleep(out["hidden_compute"])  # "compute" longer than the collective's cost
        start = time.perf_counter()
        # Note: what the link still owes when the rank waits: 0 once the compute outlasted it.
        # (The wait itself also holds gloo's real all-reduce, which a busy machine can delay.)
        out["hidden_link_left"] = max(0.0, handle["h"].sim_end - start)
        handle["h"].wait()
        out["hidden_wait"] = time.perf_counter() - start
    out["hidden_compute"] = 1.5 * link.cost("all_reduce", MB, world_size) + 0.02
    out["hidden"] = _timed(hidden)
    out["records"] = [(r.op, r.label, r.payload_bytes, r.simulated_seconds, r.simulated_queue,
                       r.seconds) for r in comm.ledger.records]
    unlinked = Comm()
    unlinked.all_reduce(x, label="plain")
    out["plain"] = [(r.simulated_seconds, r.simulated_queue) for r in unlinked.ledger.records]
    return out


def train_with_and_without(rank: int, world_size: int, strategies, link) -> dict:
    """Per strategy, the tiny GPT for 3 steps without and with ``link``: losses, final weights,
    step seconds and bytes sent, telemetry events, ledger records."""
    torch.set_num_threads(1)
    cfg = GPTConfig.tiny()
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    out = {}
    for strategy in strategies:
        for name, used in (("plain", None), ("linked", link)):
            model = make_model(cfg)
            rec = Recorder(run=f"{strategy}-{name}")
            model, opt = fsdp_mini.parallelize(model, strategy, units=list(model.blocks),
                                               optimizer=partial(torch.optim.AdamW, lr=1e-3),
                                               link=used, recorder=rec)
            run = train(model, opt, lambda s: data.local_batch(s, 8, rank, world_size), 3,
                        recorder=rec)
            rec.close()
            out[strategy, name] = {
                "losses": run.losses, "state": fsdp_mini.full_state_dict(model),
                "events": rec.events, "step_seconds": run.step_seconds,
                "sent_bytes": run.sent_bytes,
                "records": [(r.op, r.payload_bytes, r.simulated_seconds)
                            for r in model.fsdp_mini.comm.ledger.records]}
    return out
