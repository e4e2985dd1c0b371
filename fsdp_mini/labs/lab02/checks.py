"""Lab 02, collectives by hand: what each rank holds before and after, a ring all-reduce written
with point-to-point messages, and bandwidth against message size.

    labs.show_collective("all-reduce", before, after)     # rank -> before -> after, a table
    labs.check_ring_all_reduce(ring_all_reduce)           # your ring, on 2 and 3 ranks
    rows = ranks.run(labs.all_reduce_sweep, sizes)        # time all-reduces of many sizes
    labs.bandwidth_summary(rows)                          # latency floor, half-bandwidth size

A ring all-reduce of P bytes on N ranks sends 2(N-1)/N x P per rank: N = 3, P = 12 B, chunks
of 4 B; reduce-scatter 2 steps x 4 B, all-gather 2 steps x 4 B: 16 B = 2(3-1)/3 x 12 B.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ...launcher import LaunchError, launch
from ...telemetry.units import fmt_bytes
from ..common.checking import explain_failure, forget_logs
from ..common.exercise import not_written_yet
from ..common.report import CheckResult
from .bandwidth import all_reduce_sweep, bandwidth_summary, plot_bandwidth

__all__ = ["all_reduce_sweep", "bandwidth_summary", "check_ring_all_reduce", "plot_bandwidth",
           "ring_input", "show_collective"]

RING_SIZES = (12, 13, 3 * 4096)  # divisible by 2, 3 and 4; by none of them; a larger one


def show_collective(title: str, before: list, after: list) -> None:
    """Print one row per rank: what it held before the collective, and after it."""
    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} ranks, after {len(after)}: one value each")
    short = [["[" + " ".join(f"{v:g}" for v in torch.as_tensor(t).flatten().tolist()) + "]"
              for t in pair] for pair in zip(before, after)]
    w = max(len("before"), *(len(b) for b, _ in short))
    print(f"{title}\n  rank  {'before':<{w}}  after")
    for r, (b, a) in enumerate(short):
        print(f"  {r:<4}  {b:<{w}}  {a}")


# -- the ring all-reduce exercise ---------------------------------------------------------------

class ExerciseRaised(RuntimeError):
    """The learner's function raised inside a rank (the message says where)."""


class _Messages:
    """The ``send`` and ``recv`` a learner's ring gets: point-to-point calls (ranks 0..n-1 of
    the ring being checked) that count the bytes this rank sends, and the sends not waited for.

    Note: each message is preceded by its size (not counted), so a recv into a tensor of another
    size is recorded in ``mismatch`` instead of aborting the process (gloo aborts then)."""

    def __init__(self, rank: int, world_size: int, tensor: torch.Tensor | None = None):
        self.rank, self.world_size, self.sent_bytes, self.mismatch = rank, world_size, 0, ""
        self.requests: list[_Request] = []
        self.tensor, self.halfway = tensor, None  # the tensor when the N-th send starts
        self.peers: set[tuple[str, int]] = set()  # ("to", r) and ("from", r) relative offsets

    def _peer(self, peer, what: str) -> int:
        if isinstance(peer, int) and 0 <= peer < self.world_size and peer != self.rank:
            return peer
        raise ValueError(f"{what} rank {peer!r} from rank {self.rank}: peers are the other "
                         f"ranks 0..{self.world_size - 1} (use (rank + 1) % world_size)")

    def send(self, tensor: torch.Tensor, to: int):
        """Start sending ``tensor`` to rank ``to``; returns a request: call its ``.wait()``."""
        # Note: non-blocking (isend), so every rank can send first and receive second.
        to, data = self._peer(to, "send to"), tensor.detach().contiguous()
        if len(self.requests) == self.world_size - 1 and self.tensor is not None:
            self.halfway = self.tensor.detach().clone()  # Note: after N-1 steps of a ring
        self.peers.add(("to", (to - self.rank) % self.world_size))
        size = torch.tensor([data.numel()], dtype=torch.int64)
        request = _Request(dist.isend(size, to, tag=1), dist.isend(data, to, tag=0), size, data)
        self.sent_bytes += data.numel() * data.element_size()
        self.requests.append(request)
        return request

    def recv(self, tensor: torch.Tensor, frm: int) -> None:
        """Receive into ``tensor`` what rank ``frm`` sent; blocks until it arrives."""
        frm, size = self._peer(frm, "recv from"), torch.zeros(1, dtype=torch.int64)
        self.peers.add(("from", (frm - self.rank) % self.world_size))
        if not tensor.is_contiguous():
            raise ValueError("recv needs a contiguous tensor (a chunk of a 1-D tensor is one)")
        dist.irecv(size, frm, tag=1).wait()
        sent, k = int(size), min(int(size), tensor.numel())
        landing = tensor if sent == tensor.numel() else torch.empty(sent, dtype=tensor.dtype)
        dist.irecv(landing, frm, tag=0).wait()
        if landing is not tensor:
            tensor.view(-1)[:k].copy_(landing[:k])  # Note: wrong on purpose; the checker says why
            self.mismatch = self.mismatch or (f"rank {frm} sent {sent} elements, rank "
                                              f"{self.rank} received them into {tensor.numel()}")

    def finish(self) -> int:
        """Wait for the sends still in flight; return how many the learner never waited for."""
        unwaited = sum(not request.waited for request in self.requests)
        for request in self.requests:
            request.wait()
        return unwaited


class _Request:
    """A send in flight; ``wait()`` may be called twice (gloo's own request hangs then)."""

    def __init__(self, *works_and_buffers):  # Note: buffers live until the send is done
        self._held, self.waited = works_and_buffers, False

    def wait(self) -> None:
        for work in self._held[:2]:
            work.wait()
        self._held, self.waited = (), True


def ring_input(rank: int, world_size: int, size: int) -> torch.Tensor:
    """What rank ``rank`` holds in the checker: ``2**rank * (1 + i % 7)``, exact in float32, so
    a partial sum (some ranks missing) never equals the full sum."""
    return (2.0 ** rank) * (1 + torch.arange(size) % 7).float()


def _ring_on_rank(rank, world, fns, world_sizes, sizes):
    out = [[] for _ in fns]
    for k, fn in enumerate(fns):
        for n in world_sizes:
            for size in sizes:
                if rank < n:  # Note: the first n ranks form the ring; the others wait below
                    x = ring_input(rank, n, size)
                    messages = _Messages(rank, n, x)
                    try:
                        returned = fn(x, rank, n, messages.send, messages.recv)
                        unwaited = messages.finish()
                    except Exception as e:  # noqa: BLE001  (named by _explain_failure)
                        raise ExerciseRaised(f"[{n} ranks, {size} elements] "
                                             f"{type(e).__name__}: {e}") from None
                    got = returned if isinstance(returned, torch.Tensor) else x
                    halfway = x.detach().clone() if messages.halfway is None else messages.halfway
                    out[k].append({"n": n, "size": size, "got": got.detach().float().clone(),
                                   "halfway": halfway, "peers": sorted(messages.peers),
                                   "unchanged": torch.equal(got.detach().float(),
                                                            ring_input(rank, n, size)),
                                   "sent": messages.sent_bytes, "mismatch": messages.mismatch,
                                   "unwaited": unwaited, "sends": len(messages.requests)})
                dist.barrier()
    return out


def check_ring_all_reduce(fn, world_sizes=(2, 3), sizes=RING_SIZES, timeout=20) -> CheckResult:
    """Run ``fn(tensor, rank, world_size, send, recv)`` on each world size and tensor size; check
    that every rank ends with the sum, sends 2(N-1)/N x the payload (as a ring does) and waits
    for each of its sends."""
    return _check_rings([fn], world_sizes, sizes, timeout)[0].finish()


def _check_rings(fns, world_sizes=(2, 3), sizes=RING_SIZES, timeout=20) -> list[CheckResult]:
    """Several rings judged from one launch (each judged alone; the tests use it for speed)."""
    results, world_sizes = [CheckResult("your ring all-reduce") for _ in fns], sorted(world_sizes)
    if not world_sizes or world_sizes[0] < 2:
        raise ValueError(f"world_sizes must be 2 or more ranks each, got {world_sizes}")
    todo = [k for k, fn in enumerate(fns) if not not_written_yet(fn)]
    for k in sorted(set(range(len(fns))) - set(todo)):
        results[k].wrong("not written yet: replace the `...` with your ring, then run this "
                         "cell again", hint="labs.show_solution('02_ring_all_reduce') shows one")
    try:
        per_rank = launch(_ring_on_rank, world_sizes[-1], [fns[k] for k in todo], world_sizes,
                          tuple(sizes), backend="gloo", timeout=timeout) if todo else []
    except LaunchError as err:
        for k in todo:
            explain_failure(results[k], err, timeout, "a recv waits for a send that never "
                             "comes: does every rank make the same number of steps, and does "
                             "every send to rank r+1 meet a recv from rank r-1?")
        forget_logs(err)
        return results
    for j, k in enumerate(todo):
        cases: dict = {}  # (ranks, elements) -> what each rank of that ring did, by rank
        for c in (c for rank_out in per_rank for c in rank_out[j]):
            cases.setdefault((c["n"], c["size"]), []).append(c)
        for (n, size), what in [(key, c["mismatch"]) for key, v in cases.items() for c in v
                                if c["mismatch"]][:1]:
            results[k].wrong(f"a send and its recv differ in size ({size} elements on {n} "
                             f"ranks: {what})", hint="both sides must use the same chunk index")
        _check_sums(results[k], cases)
        _check_bytes(results[k], cases)
        _check_waits(results[k], cases)
        results[k].facts["sent_bytes"] = {key: [c["sent"] for c in v] for key, v in cases.items()}
    return results


def _check_sums(result, cases) -> None:
    expected = {k: sum(ring_input(r, k[0], k[1]) for r in range(k[0])) for k in cases}
    right = {k: all(torch.equal(c["got"], expected[k]) for c in v) for k, v in cases.items()}
    if all(right.values()):
        result.ok(f"every rank holds the sum of all ranks' tensors, on "
                  f"{' and '.join(str(n) for n in sorted({k[0] for k in cases}))} ranks, for "
                  f"{', '.join(str(s) for s in sorted({k[1] for k in cases}))} elements")
        return
    wrong = [k for k, ok in right.items() if not ok]
    (n, size), want = wrong[0], expected[wrong[0]]
    got, where = [c["got"] for c in cases[wrong[0]]], f"{size} elements on {n} ranks"
    same_shape = all(g.shape == want.shape for g in got)
    if all(c["unchanged"] for c in cases[wrong[0]]):
        result.wrong(f"the tensor passed in is unchanged on every rank ({where}): your ring "
                     f"summed a copy (a clone, a torch.cat, a .flatten() copy), not the tensor",
                     hint="sum it in place: chunks = tensor.view(-1).tensor_split(world_size) "
                          "are views, and writing into them writes into tensor")
    elif not same_shape and all(g.numel() <= math.ceil(size / n) for g in got):
        result.wrong(f"your ring returned {got[0].numel()} of the {size} elements on rank 0 "
                     f"({where}): one chunk, this rank's shard of the sum, where the whole summed "
                     f"tensor was needed", hint="an all-reduce leaves the whole sum on every "
                     "rank: after the reduce-scatter phase, the all-gather phase passes each "
                     "summed chunk on; sum `tensor` in place and return nothing")
    elif same_shape and all(torch.allclose(g, want / n) for g in got):
        result.wrong(f"every rank holds the mean, not the sum ({where}): an all-reduce sums",
                     hint="remove the division (DDP divides the summed gradient by N itself)")
    elif all(s % m for m, s in wrong) and all(right[k] for k in cases if k[1] % k[0] == 0):
        result.wrong(f"right when the size divides by N, wrong for {where}",
                     hint="cut the tensor with tensor.tensor_split(world_size): chunks that "
                          "differ by at most one element, none lost")
    elif same_shape and all(0 < int((g == want).sum()) <= math.ceil(size / n) for g in got):
        owned = ", ".join(f"rank {r} elements {o[0]}-{o[-1]}" for r, o in enumerate(
            (g == want).nonzero().flatten().tolist() for g in got))
        # Note: every input is positive, so a partial sum is below the sum and sum + more above
        if all(bool((g >= want).all()) for g in got):
            result.wrong(f"only one chunk per rank holds the full sum ({where}: {owned}); the "
                         f"other chunks hold more than the sum: the all-gather phase adds what "
                         f"arrives", hint="in the all-gather phase, copy what arrives (recv "
                         "straight into the chunk); do not add it: it is already the full sum")
        else:
            result.wrong(f"only one chunk per rank holds the full sum ({where}: {owned}): that "
                         f"is where the reduce-scatter phase leaves it",
                         hint="add the all-gather phase: N-1 more steps passing each summed "
                              "chunk on around the ring, copying (not adding) what arrives")
    else:
        bad = [r for r, g in enumerate(got) if not torch.equal(g, want)]
        g = got[bad[0]].flatten()
        i = int((g != want).nonzero()[0]) if g.shape == want.shape else 0
        seen = f"got {g[i].item():g}" if g.numel() > i else f"got shape {tuple(g.shape)}"
        sums = f"wrong sums on rank(s) {', '.join(map(str, bad))} ({where}; element {i}: {seen}, " \
               f"expected {want[i].item():g})"
        steps = [c["peers"] for c in cases[wrong[0]]]
        if n > 2 and all(("to", n - 1) in p for p in steps):
            result.wrong(f"{sums}: each rank sends to rank r-1 and receives from rank r+1, the "
                         f"other way round the ring from the one your chunk indices assume",
                         hint="send to (rank + 1) % world_size and receive from (rank - 1) % "
                              "world_size, as the indices (r - s) % N assume")
        elif _reduce_scatter_right(cases[wrong[0]], want):
            result.wrong(f"{sums}: the reduce-scatter phase is right (after its N-1 steps every "
                         f"rank held one fully summed chunk); the all-gather phase is wrong",
                         hint="in the all-gather phase, N-1 steps: at step s rank r sends chunk "
                              "(r + 1 - s) % N to rank r+1 and receives into chunk (r - s) % N "
                              "what rank r-1 sends (copy, no adding)")
        else:
            result.wrong(f"{sums}: the reduce-scatter phase is wrong (after its N-1 steps no "
                         f"rank held a fully summed chunk where the ring puts it)",
                         hint="in the reduce-scatter phase, at step s rank r sends chunk "
                              "(r - s) % N to rank r+1, receives what rank r-1 sends into a "
                              "fresh torch.empty_like(chunk), and adds it into chunk "
                              "(r - s - 1) % N")


def _reduce_scatter_right(per_rank, want) -> bool:
    """After the first N-1 steps, did every rank hold a distinct chunk that is the full sum?"""
    n, owned = len(per_rank), set()
    parts = want.tensor_split(n)
    for c in per_rank:
        mine = c["halfway"].float().flatten().tensor_split(n)
        full = [j for j in range(n) if mine[j].shape == parts[j].shape
                and torch.equal(mine[j], parts[j])]
        if not full:
            return False
        owned.update(full)
    return len(owned) == n


def _check_bytes(result, cases) -> None:
    for (n, size), per_rank in sorted(cases.items()):
        payload = 4 * math.ceil(size / n) * n  # Note: padded to a multiple of N if uneven
        ring = 2 * (n - 1) / n * payload
        worst = max(per_rank, key=lambda c: abs(c["sent"] - ring))
        if worst["sent"] == ring if size % n == 0 else worst["sent"] <= ring:
            continue
        ratio, r = worst["sent"] / ring, per_rank.index(worst)
        hint = "each message should be one chunk of size/N, N-1 of them in each of two phases"
        if math.isclose(worst["sent"], (n - 1) * 4 * size):
            hint = ("did you send the whole tensor to every other rank? That costs (N-1) x P; "
                    "a ring sends one chunk per step")
        elif math.isclose(ratio, 0.5):
            hint = "half the ring's bytes: the all-gather phase is missing"
        result.wrong(f"rank {r} sent {fmt_bytes(worst['sent'])} for {size} elements on {n} "
                     f"ranks; a ring sends 2(N-1)/N x {fmt_bytes(payload)} = "
                     f"{fmt_bytes(ring)} ({ratio:.2f}x that)", hint=hint)
        return
    big = max(cases, key=lambda k: (k[1] % k[0] == 0, k[1], k[0]))
    result.ok(f"each rank sent 2(N-1)/N x the payload, e.g. {fmt_bytes(cases[big][0]['sent'])} "
              f"for {fmt_bytes(4 * big[1])} on {big[0]} ranks, as a ring does")


def _check_waits(result, cases) -> None:
    late = [(r, c) for _, v in sorted(cases.items()) for r, c in enumerate(v) if c["unwaited"]]
    if not late:
        return result.ok("every rank waited for each of its sends (request.wait())")
    r, c = late[0]
    result.wrong(f"rank {r} never called .wait() on {c['unwaited']} of the {c['sends']} requests "
                 f"its sends returned ({c['size']} elements on {c['n']} ranks)",
                 hint="send only starts a message: until request.wait() returns it may still be "
                      "reading your chunk, and a chunk changed meanwhile sends wrong numbers. "
                      "Wait for each send once that step's recv is done")
