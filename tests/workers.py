"""Functions the tests run on every rank (importable, so ranks can unpickle them by reference)."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

import fsdp_mini
from fsdp_mini import training
from fsdp_mini.models import GPTConfig, SyntheticText, make_model

GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4
STEPS = 5
OPTIMIZERS = {
    "adamw": partial(torch.optim.AdamW, lr=1e-3),
    "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
}
# (strategy, options) pairs every parity run covers
VARIANTS = [("ddp", {}), ("zero1", {}), ("zero2", {}), ("fsdp", {}),
            ("fsdp", {"reshard_after_forward": False}), ("ddp", {"bucket_mb": 0.01}),
            ("zero2", {"bucket_mb": 0.01}), ("fsdp", {"prefetch": True}),
            ("fsdp", {"prefetch": 2, "activation_checkpointing": True}),
            ("fsdp", {"offload": True})]  # on the CPU: a warning and no effect; on a GPU: offload


def variant_name(strategy: str, options: dict) -> str:
    return strategy + "".join(f",{k}={v}" for k, v in sorted(options.items()))


# -- models ------------------------------------------------------------------------------------

class OddInner(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(7, 15) * 0.3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 15), requires_grad=False)  # frozen

    def forward(self, x):
        return torch.tanh(x @ self.w1) * self.scale


class OddNet(nn.Module):
    """Deliberately uneven shapes (7x15, 15x3), a frozen parameter and a buffer."""

    def __init__(self):
        super().__init__()
        self.inner = OddInner()
        self.w2 = nn.Parameter(torch.randn(15, 3) * 0.3)
        self.b = nn.Parameter(torch.zeros(3))
        self.register_buffer("offset", torch.tensor([0.1, -0.2, 0.3]))

    def forward(self, x, y):
        out = self.inner(x) @ self.w2 + self.b + self.offset
        return out, ((out - y) ** 2).mean()


def make_odd(seed: int = 0) -> OddNet:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return OddNet()


def odd_batch(step: int, rank: int = 0, world_size: int = 1):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 7, generator=g)
    y = torch.randn(GLOBAL_BATCH, 3, generator=g)
    n = GLOBAL_BATCH // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def gpt_batch(step: int, rank: int = 0, world_size: int = 1):
    cfg = GPTConfig.tiny()
    return SyntheticText(cfg.vocab_size, cfg.block_size).local_batch(step, GLOBAL_BATCH, rank,
                                                                      world_size)


MODELS = {
    "gpt": (lambda: make_model(GPTConfig.tiny()), lambda m: list(m.blocks), gpt_batch),
    "odd": (make_odd, lambda m: [m.inner], odd_batch),
}


# -- training ----------------------------------------------------------------------------------

def train(model_name: str, strategy: str, options: dict, opt_name: str, rank: int,
          world_size: int, steps: int = STEPS, micro_batches: int = 1):
    """Train for ``steps`` on this rank's slice of each global batch; return what tests check."""
    build, units_of, batch = MODELS[model_name]
    device = fsdp_mini.rank_device()  # a GPU under NCCL (benchmarks/gpu_check.sh), else the CPU
    model = build().to(device)
    model, optimizer = fsdp_mini.parallelize(model, strategy, optimizer=OPTIMIZERS[opt_name],
                                             units=units_of(model), **options)
    run = training.train(model, optimizer, lambda step: tuple(
        t.to(device) for t in batch(step, rank, world_size)), steps, micro_batches=micro_batches)
    expected = fsdp_mini.expected_costs(model)
    state = {k: v.cpu() for k, v in fsdp_mini.full_state_dict(model).items()}
    return {"state": state if rank == 0 else None, "sent_per_step": run.sent_bytes,
            "losses": run.losses, "expected": expected}


def train_reference(model_name: str, opt_name: str, steps: int = STEPS):
    """Single process, whole global batch: what every strategy must reproduce."""
    build, _, batch = MODELS[model_name]
    model = build()
    optimizer = OPTIMIZERS[opt_name]([p for p in model.parameters() if p.requires_grad])
    training.train(model, optimizer, batch, steps)
    return model.state_dict()


def parity_run(rank: int, world_size: int, model_name: str, variants, opt_names):
    out = {}
    for strategy, options in variants:
        for opt_name in opt_names:
            out[(variant_name(strategy, options), opt_name)] = train(
                model_name, strategy, options, opt_name, rank, world_size)
    return out


def accumulation_run(rank: int, world_size: int, strategies, micro_batches=(1, 3)):
    """Final states after 3 steps, each step's batch cut into k micro-batches, for each k."""
    return {(s, k): train("gpt", s, {}, "sgd", rank, world_size, steps=3, micro_batches=k)["state"]
            for s in strategies for k in micro_batches}


# -- memory ------------------------------------------------------------------------------------

def persistent_state_bytes(rank: int, world_size: int, strategy: str, model_name: str = "gpt"):
    """Model-state bytes (params + grads + optimizer state) this rank holds after a step."""
    build, units_of, batch = MODELS[model_name]
    model = build()
    model, optimizer = fsdp_mini.parallelize(model, strategy, units=units_of(model))
    with fsdp_mini.track_memory(model, optimizer) as mem:
        x, y = batch(0, rank, world_size)
        model(x, y)[1].backward()
        optimizer.step()
        after_step = mem.category_bytes()
    keep = ("params", "grads", "optimizer_state")
    return {"measured": sum(after_step[c] for c in keep), "by_category": after_step,
            "expected": fsdp_mini.expected_costs(model)["persistent_bytes"]}


def persistent_all(rank: int, world_size: int):
    return {s: persistent_state_bytes(rank, world_size, s)
            for s in ("ddp", "zero1", "zero2", "fsdp")}


class StateHeavy(nn.Module):
    """Four wide layers and a tiny batch: model state dominates memory, activations are small."""

    def __init__(self, width: int = 256, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.square().mean()


def fsdp_peak(rank: int, world_size: int, width: int = 256, depth: int = 4):
    """Measured FSDP peak of one training step, with the parts of its prediction measured too."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = StateHeavy(width, depth)
    model, optimizer = fsdp_mini.parallelize(model, "fsdp", units=list(model.layers))
    x = torch.randn(2, width)
    model(x).backward()  # warm-up step creates the optimizer state
    optimizer.step()
    optimizer.zero_grad()
    with fsdp_mini.track_memory(model, optimizer) as mem:
        start = mem.category_bytes()
        model(x).backward()
        optimizer.step()
        optimizer.zero_grad()
    unit_bytes = [u.padded_bytes for u in model.fsdp_mini.units]
    return {"own_peak": mem.own_peak_bytes, "peak": mem.peak_bytes, "start": start,
            "external": mem.external_bytes, "unit_bytes": unit_bytes,
            "at_peak": mem.at_peak, "expected": fsdp_mini.expected_costs(model)}


# -- communication -----------------------------------------------------------------------------

def collectives(rank: int, world_size: int):
    """Each collective once, sync and async; returns results and the ledger's records."""
    from fsdp_mini.comm.collectives import Comm
    comm = Comm()
    shard = torch.full((5,), float(rank))
    gathered = torch.empty(5 * world_size)
    comm.all_gather(gathered, shard, label="ag")
    full = torch.arange(5.0 * world_size)
    mine = torch.empty(5)
    handle = comm.reduce_scatter(mine, full, label="rs", async_op=True)
    handle.wait()
    summed = torch.ones(7) * (rank + 1)
    comm.all_reduce(summed, label="ar")
    b = torch.full((3,), float(rank))
    comm.broadcast(b, label="bc", src=world_size - 1)
    comm.barrier()
    return {"gathered": gathered, "mine": mine, "summed": summed, "broadcast": b,
            "records": [(r.op, r.label, r.payload_bytes, r.sent_bytes, r.seconds >= 0)
                        for r in comm.ledger.records]}


# -- GPU ---------------------------------------------------------------------------------------

def cuda_memory(rank: int, world_size: int):
    """One FSDP step of the default GPT on this rank's GPU: tensor bytes and allocator figures."""
    from fsdp_mini import parallelize, track_memory
    model = make_model(GPTConfig()).cuda()
    model, opt = parallelize(model, "fsdp", units=list(model.blocks))
    x = torch.randint(0, 256, (4, 64), device="cuda")
    model(x, x)[1].backward()
    opt.step()
    opt.zero_grad()
    with track_memory(model, opt) as mem:
        model(x, x)[1].backward()
        opt.step()
    return {"tensor_peak": mem.peak_bytes, **mem.cuda}


def wrap_memory(rank: int, world_size: int, strategy: str):
    """Live tensor bytes of this process before and after parallelize (model state only), and
    whether the full parameters' storages were released.

    Note: gloo's worker thread drops its reference to a broadcast tensor a moment after the
    broadcast's wait returns; on oversubscribed cores that moment can outlast parallelize. So the
    count is read once every original storage is gone (or after 10 s, when ``released`` says the
    kit still holds one)."""
    import time
    import weakref
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = StateHeavy()
    originals = [weakref.ref(p.untyped_storage()) for p in model.parameters()]
    with fsdp_mini.track_memory() as mem:
        before = mem.current_bytes
        model, _ = fsdp_mini.parallelize(model, strategy, units=list(model.layers))
        deadline = time.monotonic() + 10
        while any(r() is not None for r in originals) and time.monotonic() < deadline:
            time.sleep(0.01)
        after = mem.current_bytes
    return {"before": before, "after": after, "model_bytes": 4 * sum(
        p.numel() for p in StateHeavy().parameters()),
        "released": sum(r() is None for r in originals), "parameters": len(originals)}


def sent_buffers_after_step(rank: int, world_size: int, strategy: str, options: dict):
    """Bytes still held by each gradient buffer a strategy sent in one step, though the test holds
    every one of them (as a backend's worker thread can, a moment past the wait): a buffer made to
    be sent is freed once read, a buffer the strategy keeps (ZeRO-1's) is not."""
    torch.manual_seed(0)
    model = StateHeavy(width=32, depth=3)
    units = list(model.layers) if strategy == "fsdp" else None
    model, opt = fsdp_mini.parallelize(model, strategy, units=units, **options)
    comm = model.fsdp_mini.comm
    held = []
    for op in ("all_reduce", "reduce_scatter"):
        def keeping(*args, _call=getattr(comm, op), _op=op, **kwargs):
            held.append((_op, args[0] if _op == "all_reduce" else args[1]))
            return _call(*args, **kwargs)
        setattr(comm, op, keeping)
    model(torch.randn(2, 32)).backward()
    opt.step()
    return [(op, t.untyped_storage().nbytes(), t.numel() * t.element_size()) for op, t in held]


# -- debugging ---------------------------------------------------------------------------------

def skip_a_unit(rank: int, world_size: int, check: bool, stamp_dir: str):
    """Rank 1 never calls block 0, so it skips that unit's all-gather: a mismatched sequence.
    Each rank stamps the time it starts the forward pass into ``stamp_dir``."""
    import os
    import time
    model = make_model(GPTConfig.tiny())
    model, opt = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                       check_collectives=check)
    if rank == 1:
        model.blocks = nn.ModuleList(list(model.blocks)[1:])
    x, y = gpt_batch(0, rank, world_size)
    with open(os.path.join(stamp_dir, f"forward{rank}"), "w") as f:
        f.write(repr(time.time()))
    model(x, y)[1].backward()
    opt.step()
    return "finished"


def offload_memory(rank: int, world_size: int):
    """GPU bytes kept between steps and the GPU peak of one step, with and without offload."""
    import gc
    import time
    device = fsdp_mini.rank_device()
    out = {}
    for offload in (False, True):
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        model = make_model(GPTConfig.tiny()).to(device)
        model, optimizer = fsdp_mini.parallelize(model, "fsdp", units=list(model.blocks),
                                                 optimizer=OPTIMIZERS["adamw"], offload=offload)
        batch = lambda s: tuple(t.to(device) for t in gpt_batch(s, rank, world_size))  # noqa: E731
        training.train(model, optimizer, batch, 2)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        training.train(model, optimizer, batch, 1)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        devices = {t.device.type for p in model.fsdp_mini.optimizer_params()
                   for t in [p, *optimizer.state[p].values()] if isinstance(t, torch.Tensor)}
        out[offload] = {"kept": kept, "peak": torch.cuda.max_memory_allocated(),
                        "seconds": seconds, "devices": devices,
                        "state": {k: v.cpu() for k, v in fsdp_mini.full_state_dict(model).items()}}
        del model, optimizer
    return out


def bf16_on_gpu(rank: int, world_size: int):
    """fsdp with bf16 units and torch fully_shard with the same policy, on this rank's GPU."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    device = fsdp_mini.rank_device()
    batch = lambda s: tuple(t.to(device) for t in gpt_batch(s, rank, world_size))  # noqa: E731
    mine = make_model(GPTConfig.tiny()).to(device)
    mine, opt = fsdp_mini.parallelize(mine, "fsdp", units=list(mine.blocks), prefetch=True,
                                      optimizer=OPTIMIZERS["adamw"], param_dtype=torch.bfloat16)
    training.train(mine, opt, batch, 3)
    theirs = make_model(GPTConfig.tiny()).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in theirs.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(theirs, mp_policy=policy)
    training.train(theirs, OPTIMIZERS["adamw"](theirs.parameters()), batch, 3)
    return {"mine": {k: v.cpu() for k, v in fsdp_mini.full_state_dict(mine).items()},
            "theirs": {k: v.full_tensor().cpu() for k, v in theirs.state_dict().items()}}
