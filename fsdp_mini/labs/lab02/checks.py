"""Lab 02's checker: your ring all-reduce beside the reference, message by message (the step,
the peer, which chunk, its dtype, whether waited for; :mod:`fsdp_mini.comm.p2p` writes them),
each rank's tensor after every step, the result, and the bytes sent: 2(N-1)/N x P per rank."""

import re

import torch

from ...comm.p2p import Messages
from ..common.differential import Check, Hint, near, spread
from ..common.exercise import load_solution, not_written_yet
from ..common.report import CheckResult, verdict_of_check

__all__ = ["check_ring_all_reduce", "ring_input"]

RING_SIZES = (12, 13, 3 * 4096)  # divisible by 2, 3 and 4; by none of them; a larger one
_ITEM = [0]  # Note: each run's messages under tags of their own


def ring_input(rank: int, world_size: int, size: int, dtype=torch.float32) -> torch.Tensor:
    """Rank ``rank``'s tensor: ``2**rank * (1 + i % 7)``, exact in bf16; no partial sum equal."""
    return ((2.0 ** rank) * (1 + torch.arange(size) % 7)).to(dtype)


def _where(k: int, n: int) -> dict:  # step k of a ring of n ranks: its phase, its step in it
    phase, s = ("reduce-scatter", k - 1) if k < n else ("all-gather", k - n) if k < 2 * n - 1 \
        else ("more", k - 2 * n + 1)
    return {"step": k, "phase": phase, "phase_step": s}


def _observe(fn, cfg, record) -> None:
    n, rank, end = cfg["world_size"], record.rank, {"step": 2 * cfg["world_size"] - 1}
    x = ring_input(rank, n, cfg["numel"], getattr(torch, cfg["dtype"]))
    _ITEM[0] += 1
    msgs = Messages(x, x.view(-1).tensor_split(n), tag=2 * _ITEM[0], on_step=lambda k:
                    record.see("after", _chunks(x, n, clone=True), **_where(k, n)))
    try:
        out = fn(x, rank, n, msgs.send, msgs.recv)
    finally:
        msgs.finish()
        for m in msgs.log:  # Note: compare orders them (step, then the order of WORDS)
            for key in set(m) - {"op", "step"}:
                record.see(f"{m['op']} {key}", m[key], **_where(m["step"], n))
    record.see("result", (out if isinstance(out, torch.Tensor) else x).detach().clone(), **end)
    record.see("sent_bytes", msgs.sent_bytes, **end)


def _index(label) -> int | None:  # "chunk 2, elements 6-8" -> 2
    return int(found.group(1)) if (found := re.match(r"chunk (\d+)", str(label))) else None


def _lesson(d, phase=None) -> int:
    """The chunk the lesson's ring sends at this step (in ``phase``, by default this one's)."""
    r, s, n = d.where["rank"], d.where["phase_step"], d.config["world_size"]
    return (r - s) % n if (phase or d.where["phase"]) == "reduce-scatter" else (r + 1 - s) % n


def _changed(d) -> tuple:
    """The chunks this step changed on the rank (yours, the reference's), and all before it."""
    (mine, want), n, k, r = d.table[d.config], d.config["world_size"], d.where["step"], d.where[
        "rank"]
    before = mine.get("after", rank=r, **_where(k - 1, n)) if k > 1 else _chunks(_input(d, r), n)
    return tuple(sorted(c for c, t in rec.get("after", rank=r, **_where(k, n)).items()
                        if not torch.equal(t, before[c])) for rec in (mine, want)) + (before,)


def _chunks(x, n, clone=False) -> dict:  # what "after" records: {"chunk 0": ..., ...}
    return {f"chunk {j}": c.clone() if clone else c for j, c in enumerate(x.tensor_split(n))}


def _input(d, r):
    return ring_input(r, (c := d.config)["world_size"], c["numel"], getattr(torch, c["dtype"]))


def _unchanged(d) -> bool:  # the answer's tensor never changed, on any rank, in any step
    seen = [(dict(w)["rank"], v) for (o, w), v in d.table[d.config][0].seen.items() if o == "after"]
    return bool(seen) and all(torch.equal(torch.cat([*v.values()]), _input(d, r)) for r, v in seen)


def _phase(d) -> str:  # the lesson's words for this step's phase
    return RS if d.where.get("phase") == "reduce-scatter" else AG


SPLIT = ("cut the tensor with tensor.view(-1).tensor_split(world_size): N views whose sizes "
         "differ by at most one element, none lost, some empty when the tensor has fewer than N "
         "elements (tensor.chunk and split(size // N) cut others)")
RS = ("in the reduce-scatter phase, at step s rank r sends chunk (r - s) % N to rank r+1, "
      "receives what rank r-1 sends into a fresh torch.empty_like(chunk) and adds it into its "
      "chunk (r - s - 1) % N")
AG = ("in the all-gather phase, at step s rank r sends chunk (r + 1 - s) % N to rank r+1 and "
      "receives into its chunk (r - s) % N what rank r-1 sends: a copy, no adding")
HINTS = [
    Hint(lambda d: d.raised[0] == "a hang", "a recv waits for a send that never comes: does "
         "every rank make the same number of steps, and does every send to rank r+1 meet a "
         "recv from rank r-1?"),
    Hint(lambda d: d.raised and d.config["world_size"] == 1, "at world size 1 there is no other "
         "rank: N-1 = 0 steps in each phase (range(world_size - 1)); the tensor is the sum"),
    Hint(lambda d: d.raised and d.config["numel"] < d.config["world_size"], "a tensor of "
         "{numel} elements on {world_size} ranks: " + SPLIT),
    Hint(lambda d: d.raised, "the line above says where"),
    Hint(lambda d: d.observable == "recv dtype", "rank {rank} received into a {mine} buffer "
         "where its chunk is {want}: make the buffer with torch.empty_like(chunk), the chunk's "
         "size and dtype (another dtype holds more bytes and rounds the sum twice)"),
    Hint(lambda d: d.observable.endswith("peer") and int(d.mine[5:]) == (2 * d.where["rank"] - int(
        d.want[5:])) % d.config["world_size"], "the ring runs the other way round from the one "
         "the chunk indices assume: send to (rank + 1) % world_size, recv from (rank - 1) % N"),
    Hint(lambda d: d.observable.endswith("peer") and d.mine is not None, "rank r sends only to "
         "rank r+1 and receives only from rank r-1, (rank + 1) % N and (rank - 1) % N"),
    Hint(lambda d: any(k[0] == "result" and v.numel() < d.config["numel"] for k, v in d.table[
        d.config][0].seen.items()), "your ring returned "
         "one chunk, this rank's shard of the sum, where the whole summed tensor was needed: the"
         " all-gather phase passes each summed chunk on; sum `tensor` in place, return nothing"),
    Hint(lambda d: d.observable.startswith(("send", "recv")) and d.mine is None, lambda d: "your"
         f" ring ends after step {d.where['step'] - 1} on rank {d.where['rank']}: the "
         f"{d.where['phase']} phase is missing" + (f" from its step {d.where['phase_step']}" if
         d.where["phase_step"] else "") + f" (N-1 = {d.config['world_size'] - 1} steps each). "
         + _phase(d)),
    Hint(lambda d: d.observable.startswith(("send", "recv")) and d.want is None, "more messages "
         "than a ring's 2(N-1): one chunk per step, N-1 steps in each of the two phases"),
    Hint(lambda d: str(d.mine).startswith("the whole"), "you sent the whole tensor: to every "
         "other rank that costs (N-1) x P bytes per rank; a ring sends one chunk of P/N per "
         "step, 2(N-1)/N x P in all"),
    Hint(lambda d: d.observable == "send part" and _index(d.mine) is None, "rank {rank} sent "
         "none of the chunks the ring cuts ({want}): " + SPLIT),
    Hint(lambda d: d.observable == "send part", lambda d: _phase(d) + f": here (rank "
         f"{d.where['rank']}, step {d.where['phase_step']}) chunk {_lesson(d)}, yours chunk "
         f"{_index(d.mine)}" + (", the index of the other phase" if _index(d.mine) == _lesson(
             d, ({"reduce-scatter", "all-gather"} - {d.where["phase"]}).pop()) else "")),
    Hint(lambda d: d.observable == "send dtype", "send each chunk as it is ({want}): a "
         "converted one sends other bytes"),
    Hint(lambda d: d.observable == "recv into", "rank {rank} received into {mine}, the ring "
         "into {want}: a send and its recv are the same chunk. " + RS),
    Hint(_unchanged, "the tensor passed in is unchanged on every rank, in every step: your ring "
         "summed a copy (a clone, a torch.cat, a .flatten() copy), not the tensor. Sum it in "
         "place: the chunks of tensor.view(-1).tensor_split(world_size) are views into it"),
    Hint(lambda d: near(d.ratio, 1 / d.config["world_size"]), "every rank holds the mean, not "
         "the sum: an all-reduce sums (DDP divides the summed gradient by N itself)"),
    Hint(lambda d: d.where["phase"] == "all-gather" and torch.equal(d.mine, d.want + _changed(d)[
        2][d.path.strip("'")]), "the all-gather phase adds what arrives: copy it (recv straight "
         "into the chunk); it is already the full sum"),
    Hint(lambda d: d.observable == "after" and _changed(d)[0] != _changed(d)[1], lambda d:
         f"in this step rank {d.where['rank']} changed {', '.join(_changed(d)[0]) or 'nothing'}"
         f"; the ring changes {', '.join(_changed(d)[1])}: " + _phase(d)),
    Hint(lambda d: d.observable == "after", lambda d: f"{d.path} does not hold what the ring "
         "puts there: " + _phase(d) + " (a recv straight into the chunk overwrites what it held)"),
    Hint(lambda d: d.observable == "send waited", lambda d: f"rank {d.where['rank']} " + (
         "waited for its send only after the next step began" if d.mine else "never called "
         ".wait() on the request its send returned") + ": send only starts a message, and until "
         "request.wait() returns it may still be reading your chunk. Wait once that step's recv "
         "is done"),
    Hint(lambda d: d.observable == "sent_bytes", lambda d: "a ring of P = {0:g} B on {1} ranks "
         "sends 2(N-1)/N x P = {2:g} B per rank (on average when N does not divide it)".format(
             p := d.config["numel"] * getattr(torch, d.config["dtype"]).itemsize, n := d.config[
                 "world_size"], 2 * (n - 1) / n * p)),
]
WORDS = {"send peer": "the peer rank {rank} sent to", "send part": "what rank {rank} sent",
         "send dtype": "the dtype rank {rank} sent", "recv peer": "the peer rank {rank} "
         "received from", "recv into": "what rank {rank} received into", "after": "rank {rank}'s "
         "tensor at the end of", "send waited": "whether rank {rank} waited for its send of"}
WORDS = {k: v + f"{'' if k in ('after', 'send waited') else ' in'} step {{step}} ({{phase}} "
         "step {phase_step})" for k, v in WORDS.items()} | {
    "result": "rank {rank}'s tensor at the end", "sent_bytes": "the bytes rank {rank} sent"}
CHECK = Check("your ring all-reduce", _observe, [], tuple(WORDS), words=WORDS, hints=HINTS,
              on_ranks=True, agreed="every message as the reference's (to rank r+1, from r-1, "
              "the same chunk each step, waited for), each step's tensor, the sum, the bytes")


def _configs(world_sizes, sizes) -> tuple[list, list]:
    """1 to 4 ranks, sizes N does not divide and below N, two dtypes; then the lab's own."""
    own = spread(world_size=sorted(world_sizes), numel=list(sizes), dtype=["float32"])
    return [c for c in spread(world_size=[1, 2, 3, 4], numel=[3, 13], dtype=[
        "float32", "bfloat16"]) if c not in own] + own, own


def _reference():
    return load_solution("02_ring_all_reduce", "ring_all_reduce")


JUDGES = {"02_ring_all_reduce": lambda fns: CHECK.judge_many(fns, _reference(), _configs(
    (2, 3), RING_SIZES)[0])}


@verdict_of_check
def check_ring_all_reduce(fn, world_sizes=(2, 3), sizes=RING_SIZES, timeout=20) -> CheckResult:
    """``fn(tensor, rank, world_size, send, recv)`` beside the reference (see ``_configs``):
    every message, every step's tensor, the sum, the bytes each rank sent."""
    if not world_sizes or min(world_sizes) < 1:
        raise ValueError(f"world_sizes must be 1 or more ranks each, got {world_sizes}")
    result, (configs, own) = CheckResult(CHECK.what), _configs(world_sizes, sizes)
    if not_written_yet(fn):
        return result.wrong("not written yet: replace the `...` with your ring, then run this "
                            "cell", hint="labs.show_solution('02_ring_all_reduce')").finish()
    CHECK.timeout = timeout
    CHECK(fn, _reference(), result, configs=configs)
    result.facts["sent_bytes"] = {(c["world_size"], c["numel"]): [mine.get(
        "sent_bytes", rank=r, step=2 * c["world_size"] - 1) for r in range(c["world_size"])]
        for c, (mine, _) in result.facts["records"].items() if c in own}
    return result.finish()
