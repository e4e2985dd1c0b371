"""Lab 02's wrong rings: what a learner writes for ``ring_all_reduce``, and the words its checker
must use. Rings that finish are judged together from one launch (``lab02._check_rings``, the code
path of ``check_ring_all_reduce``, each judged alone); rings that raise or hang get a launch each.
"""

from functools import cache

import torch

from fsdp_mini import labs
from fsdp_mini.labs.lab02 import checks as lab02
from wrong_answers import Wrong

reference = labs.load_solution("02_ring_all_reduce", "ring_all_reduce")


def _reduce_scatter_phase(chunks, rank, n, send, recv):
    """The right first phase of the ring: afterwards rank r holds the sum of chunk r+1."""
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], (rank + 1) % n)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, (rank - 1) % n)
        request.wait()
        chunks[inc].add_(incoming)


def _all_gather_phase(chunks, rank, n, send, recv):
    """The right second phase: each summed chunk travels once round the ring."""
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], (rank + 1) % n)
        recv(chunks[inc], (rank - 1) % n)
        request.wait()


def returns_its_shard(tensor, rank, world_size, send, recv):
    """Stops after the reduce-scatter and returns the chunk it summed: a shard, not the whole."""
    chunks = tensor.view(-1).tensor_split(world_size)
    _reduce_scatter_phase(chunks, rank, world_size, send, recv)
    return chunks[(rank + 1) % world_size]


def naive_all_to_all(tensor, rank, world_size, send, recv):
    """Sends the whole tensor to every other rank: right sums, (N-1) x P bytes."""
    total = tensor.clone()
    for step in range(1, world_size):
        request = send(tensor, (rank + step) % world_size)
        incoming = torch.empty_like(tensor)
        recv(incoming, (rank - step) % world_size)
        request.wait()
        total += incoming
    tensor.copy_(total)


def no_all_gather(tensor, rank, world_size, send, recv):
    _reduce_scatter_phase(tensor.view(-1).tensor_split(world_size), rank, world_size, send, recv)


def off_by_one(tensor, rank, world_size, send, recv):
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step) % n  # receives into the chunk it sent
        request = send(chunks[out].clone(), (rank + 1) % n)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, (rank - 1) % n)
        request.wait()
        chunks[inc].add_(incoming)
    _all_gather_phase(chunks, rank, n, send, recv)


def all_gather_off_by_one(tensor, rank, world_size, send, recv):
    """The reduce-scatter is right; the all-gather sends chunk (r - s) instead of (r + 1 - s)."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    _reduce_scatter_phase(chunks, rank, n, send, recv)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n  # the reduce-scatter's indices
        request = send(chunks[out], (rank + 1) % n)
        recv(chunks[inc], (rank - 1) % n)
        request.wait()


def all_gather_one_step_short(tensor, rank, world_size, send, recv):
    """range(n - 2) in the all-gather: the last summed chunk never arrives (N = 3)."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    _reduce_scatter_phase(chunks, rank, n, send, recv)
    for step in range(max(n - 2, 1)):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], (rank + 1) % n)
        recv(chunks[inc], (rank - 1) % n)
        request.wait()


def adds_in_all_gather(tensor, rank, world_size, send, recv):
    """Both phases add what arrives: the all-gather phase is there, but it adds."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for phase in (0, 1):
        for step in range(n - 1):
            out, inc = (rank + phase - step) % n, (rank + phase - step - 1) % n
            request = send(chunks[out], (rank + 1) % n)
            incoming = torch.empty_like(chunks[inc])
            recv(incoming, (rank - 1) % n)
            request.wait()
            chunks[inc].add_(incoming)


def recv_into_the_chunk_then_add(tensor, rank, world_size, send, recv):
    """The view kept instead of a fresh buffer: recv overwrites the chunk, then adds it to itself."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], (rank + 1) % n)
        recv(chunks[inc], (rank - 1) % n)           # the own partial sum is lost here
        request.wait()
        chunks[inc].add_(chunks[inc])
    _all_gather_phase(chunks, rank, n, send, recv)


def works_on_a_copy(tensor, rank, world_size, send, recv):
    """The ring runs on a copy (tensor.flatten().clone()): the caller's tensor never changes."""
    reference(tensor.flatten().clone(), rank, world_size, send, recv)


def never_waits(tensor, rank, world_size, send, recv):
    """The reference, without request.wait(): right sums here, but a race on a real network."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        send(chunks[out], (rank + 1) % n)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, (rank - 1) % n)
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        send(chunks[(rank + 1 - step) % n], (rank + 1) % n)
        recv(chunks[(rank - step) % n], (rank - 1) % n)


def floor_division_chunks(tensor, rank, world_size, send, recv):
    """Chunks of size // N: the last elements of a size not divisible by N are never summed."""
    n = world_size
    chunks = tensor.view(-1).split(tensor.numel() // n)[:n]
    _reduce_scatter_phase(chunks, rank, n, send, recv)
    _all_gather_phase(chunks, rank, n, send, recv)


def averaging(tensor, rank, world_size, send, recv):
    reference(tensor, rank, world_size, send, recv)
    tensor /= world_size


def reversed_ring_same_indices(tensor, rank, world_size, send, recv):
    """Sends left and receives from the right, with the indices of a ring that goes right."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for phase in (0, 1):
        for step in range(n - 1):
            out = (rank - step) % n if phase == 0 else (rank + 1 - step) % n
            inc = (rank - step - 1) % n if phase == 0 else (rank - step) % n
            request = send(chunks[out], (rank - 1) % n)
            incoming = torch.empty_like(chunks[inc])
            recv(incoming, (rank + 1) % n)
            request.wait()
            chunks[inc].add_(incoming) if phase == 0 else chunks[inc].copy_(incoming)


def no_modulo(tensor, rank, world_size, send, recv):
    send(tensor, (rank + 1) % world_size)
    recv(tensor, rank - 1)  # rank 0 has no rank -1


def rank_0_never_sends(tensor, rank, world_size, send, recv):
    if rank != 0:  # rank 1 waits for a message from rank 0 that never comes
        reference(tensor, rank, world_size, send, recv)


def one_rank_skips_the_all_gather(tensor, rank, world_size, send, recv):
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    _reduce_scatter_phase(chunks, rank, n, send, recv)
    if rank != n - 1:  # the last rank thinks it is done
        _all_gather_phase(chunks, rank, n, send, recv)


BATCH = (returns_its_shard, naive_all_to_all, no_all_gather, off_by_one, all_gather_off_by_one,
         all_gather_one_step_short, adds_in_all_gather, recv_into_the_chunk_then_add,
         works_on_a_copy, never_waits, floor_division_chunks, averaging,
         reversed_ring_same_indices)


@cache
def _judged():
    return dict(zip(BATCH, lab02._check_rings(list(BATCH))))


def batched(fn):
    return lambda: _judged()[fn].finish()


def alone(fn, **kw):
    return lambda: labs.check_ring_all_reduce(fn, **kw)


EX = "02_ring_all_reduce"
WRONG = [
    Wrong(EX, "sends the whole tensor to every rank", batched(naive_all_to_all),
          ("did you send the whole tensor to every other rank",)),
    Wrong(EX, "returns its summed chunk (a shard where the whole was needed)",
          batched(returns_its_shard), ("one chunk, this rank's shard", "the whole summed tensor")),
    Wrong(EX, "no all-gather phase", batched(no_all_gather),
          ("only one chunk per rank holds the full sum", "all-gather phase is missing")),
    Wrong(EX, "reduce-scatter off by one (receives into the chunk it sent)", batched(off_by_one),
          ("reduce-scatter phase", "chunk (r - s - 1) % n")),
    Wrong(EX, "all-gather off by one (the reduce-scatter's indices)",
          batched(all_gather_off_by_one),
          ("the reduce-scatter phase is right", "all-gather phase", "(r + 1 - s) % n")),
    Wrong(EX, "all-gather one step short (range(n - 2))", batched(all_gather_one_step_short),
          ("the reduce-scatter phase is right", "all-gather phase")),
    Wrong(EX, "all-gather adds what arrives", batched(adds_in_all_gather),
          ("the all-gather phase adds", "copy what arrives")),
    Wrong(EX, "recv into the chunk itself, then adds it to itself (no fresh buffer)",
          batched(recv_into_the_chunk_then_add),
          ("reduce-scatter phase", "torch.empty_like")),
    Wrong(EX, "ring run on a copy: the tensor passed in is unchanged",
          batched(works_on_a_copy), ("unchanged", "in place")),
    Wrong(EX, "never waits for its sends", batched(never_waits),
          ("never called .wait()", "until request.wait() returns")),
    Wrong(EX, "chunks of size // N (the rest lost)", batched(floor_division_chunks),
          ("right when the size divides by n", "tensor_split")),
    Wrong(EX, "divides by N (the mean, not the sum)", batched(averaging),
          ("every rank holds the mean, not the sum",)),
    Wrong(EX, "ring reversed, indices of the forward ring", batched(reversed_ring_same_indices),
          ("sends to rank r-1", "(rank + 1) % world_size")),
    Wrong(EX, "rank - 1 without modulo", alone(no_modulo),
          ("your code raised on rank", "recv from rank -1")),
    Wrong(EX, "rank 0 skips the ring (hang)",
          alone(rank_0_never_sends, world_sizes=(2,), sizes=(12,), timeout=3),
          ("the ranks did not finish", "every send to rank r+1 meet a recv from rank r-1")),
    Wrong(EX, "the last rank skips the all-gather (hang)",
          alone(one_rank_skips_the_all_gather, world_sizes=(3,), sizes=(12,), timeout=3),
          ("the ranks did not finish", "same number of steps")),
]
