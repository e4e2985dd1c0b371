"""Lab 02's wrong rings: what a learner writes for ``ring_all_reduce``, and the words its checker
must use. All are judged together by ``JUDGES["02_ring_all_reduce"]`` (the code path of
``check_ring_all_reduce``, in one launch per world size; one that raises or hangs ends its own).
"""

import torch

from fsdp_mini import labs
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


def uses_chunk(tensor, rank, world_size, send, recv):
    """tensor.chunk(N): sizes ceil(size / N), not tensor_split's (and fewer than N chunks for a
    tensor smaller than N)."""
    n, chunks = world_size, tensor.view(-1).chunk(world_size)
    _reduce_scatter_phase(chunks, rank, n, send, recv)
    _all_gather_phase(chunks, rank, n, send, recv)


def waits_at_the_end(tensor, rank, world_size, send, recv):
    """Keeps every request and waits for them all once the ring is done."""
    n, chunks, requests = world_size, tensor.view(-1).tensor_split(world_size), []
    for phase in (0, 1):
        for step in range(n - 1):
            out, inc = (rank + phase - step) % n, (rank + phase - step - 1) % n
            requests.append(send(chunks[out], (rank + 1) % n))
            incoming = torch.empty_like(chunks[inc])
            recv(incoming, (rank - 1) % n)
            chunks[inc].add_(incoming) if phase == 0 else chunks[inc].copy_(incoming)
    for request in requests:
        request.wait()


def sends_as_float(tensor, rank, world_size, send, recv):
    """Each chunk converted to float32 before it goes: other bytes for a bf16 tensor."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for phase in (0, 1):
        for step in range(n - 1):
            out, inc = (rank + phase - step) % n, (rank + phase - step - 1) % n
            request = send(chunks[out].float(), (rank + 1) % n)
            incoming = torch.empty(chunks[inc].numel())
            recv(incoming, (rank - 1) % n)
            request.wait()
            chunks[inc].add_(incoming.to(tensor.dtype)) if phase == 0 else chunks[inc].copy_(
                incoming)


def one_more_step(tensor, rank, world_size, send, recv):
    """The ring, then one more step passing a chunk on (range(n) in the all-gather)."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    _reduce_scatter_phase(chunks, rank, n, send, recv)
    for step in range(n if n > 1 else 0):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], (rank + 1) % n)
        recv(chunks[inc], (rank - 1) % n)
        request.wait()


def reduce_scatter_plus_step(tensor, rank, world_size, send, recv):
    """The reduce-scatter sends chunk (r + s) % N: right at step 0, wrong from step 1 (N > 2)."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    for step in range(n - 1):
        out, inc = (rank + step) % n, (rank + step - 1) % n
        request = send(chunks[out], (rank + 1) % n)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, (rank - 1) % n)
        request.wait()
        chunks[inc].add_(incoming)
    _all_gather_phase(chunks, rank, n, send, recv)


def all_gather_into_the_wrong_chunk(tensor, rank, world_size, send, recv):
    """The all-gather receives into chunk (r - s - 1) % N, the one it sends from next."""
    n, chunks = world_size, tensor.view(-1).tensor_split(world_size)
    _reduce_scatter_phase(chunks, rank, n, send, recv)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step - 1) % n
        request = send(chunks[out], (rank + 1) % n)
        incoming = torch.empty_like(chunks[(rank - step) % n])
        recv(incoming, (rank - 1) % n)
        request.wait()
        chunks[inc][:min(len(incoming), len(chunks[inc]))].copy_(incoming[:len(chunks[inc])])


def returns_a_new_sum(tensor, rank, world_size, send, recv):
    """The right ring on a copy, returned: the caller's tensor never changes."""
    total = tensor.clone()
    reference(total, rank, world_size, send, recv)
    return total


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


# A ring written otherwise than the reference, that the check must pass (tests/test_lab02.py)
def copies_and_flips(tensor, rank, world_size, send, recv):
    """A ring written otherwise: odd ranks receive first, sends are copies, the all-gather
    receives into a buffer and copies it, the tensor itself is returned."""
    n, chunks = world_size, tensor.reshape(-1).tensor_split(world_size)
    for phase in (0, 1):
        for step in range(n - 1):
            out, inc = (rank + phase - step) % n, (rank + phase - step - 1) % n
            incoming = torch.empty_like(chunks[inc])
            if rank % 2:
                recv(incoming, (rank - 1) % n)
                request = send(chunks[out].clone(), (rank + 1) % n)
            else:
                request = send(chunks[out].clone(), (rank + 1) % n)
                recv(incoming, (rank - 1) % n)
            request.wait()
            chunks[inc].add_(incoming) if phase == 0 else chunks[inc].copy_(incoming)
    return tensor


RIGHT = (copies_and_flips,)

EX = "02_ring_all_reduce"
WRONG = [
    Wrong(EX, "sends the whole tensor to every rank", naive_all_to_all,
          ("yours 'the whole tensor", "the reference 'chunk 0", "(n-1) x p bytes")),
    Wrong(EX, "returns its summed chunk (a shard where the whole was needed)", returns_its_shard,
          ("in step 2 (all-gather step 0)", "yours has none", "one chunk, this rank's shard",
           "the whole summed tensor")),
    Wrong(EX, "no all-gather phase", no_all_gather,
          ("in step 2 (all-gather step 0)", "yours has none", "the all-gather phase is missing")),
    Wrong(EX, "reduce-scatter off by one (receives into the chunk it sent)", off_by_one,
          ("received into in step 1 (reduce-scatter step 0)", "yours '2 elements', the "
           "reference '1 element'", "same chunk", "(r - s - 1) % n")),
    Wrong(EX, "all-gather off by one (the reduce-scatter's indices)", all_gather_off_by_one,
          ("sent in step 2 (all-gather step 0)", "yours 'chunk 0", "the reference 'chunk 1",
           "(r + 1 - s) % n", "the index of the other phase")),
    Wrong(EX, "all-gather one step short (range(max(n - 2, 1)): one step at N = 1)",
          all_gather_one_step_short, ("at world size 1", "send to rank 0 from rank 0",
                                      "n-1 = 0 steps in each phase")),
    Wrong(EX, "all-gather adds what arrives", adds_in_all_gather,
          ("at the end of step 2 (all-gather step 0)", "the all-gather phase adds what arrives",
           "copy it")),
    Wrong(EX, "recv into the chunk itself, then adds it to itself (no fresh buffer)",
          recv_into_the_chunk_then_add, ("at the end of step 1 (reduce-scatter step 0)",
                                         "in the reduce-scatter phase", "torch.empty_like")),
    Wrong(EX, "ring run on a copy: the tensor passed in is unchanged", works_on_a_copy,
          ("unchanged on every rank", "in place")),
    Wrong(EX, "never waits for its sends", never_waits,
          ("waited for its send of step 1", "yours false", "never called .wait()",
           "until request.wait() returns")),
    Wrong(EX, "chunks of size // N (the rest lost)", floor_division_chunks,
          ("yours 'elements 0-0', the reference 'chunk 0, elements 0-1'", "tensor_split")),
    Wrong(EX, "divides by N (the mean, not the sum)", averaging,
          ("(0.5x)", "every rank holds the mean, not the sum")),
    Wrong(EX, "ring reversed, indices of the forward ring", reversed_ring_same_indices,
          ("at world size 3", "yours 'rank 2', the reference 'rank 1'", "other way round",
           "(rank + 1) % world_size")),
    Wrong(EX, "one send, then a recv from rank - 1 without modulo (not a ring at all)", no_modulo,
          ("at world size 1", "send to rank 0 from rank 0", "n-1 = 0 steps in each phase")),
    Wrong(EX, "rank 0 skips the ring (hang)", rank_0_never_sends,
          ("at world size 2", "the ranks hung", "every send to rank r+1 meet a recv from rank "
           "r-1")),
    Wrong(EX, "the last rank skips the all-gather (hang)", one_rank_skips_the_all_gather,
          ("at world size 2", "the ranks hung", "same number of steps")),
    Wrong(EX, "tensor.chunk(N), not tensor_split", uses_chunk,
          ("at world size 3, numel 13", "yours 'elements 5-9', the reference 'chunk 1, "
           "elements 5-8'", "tensor_split", "tensor.chunk")),
    Wrong(EX, "waits for every send only at the end", waits_at_the_end,
          ("waited for its send of step 1", "yours 'later', the reference true",
           "only after the next step began")),
    Wrong(EX, "sends each chunk as float32", sends_as_float,
          ("yours 'float32', the reference 'bfloat16'", "right with dtype 'float32', wrong "
           "with 'bfloat16'", "send each chunk as it is")),
    Wrong(EX, "one all-gather step too many (range(n))", one_more_step,
          ("the bytes rank 0 sent: yours 20, the reference 12", "2(n-1)/n x p = 12 b")),
    Wrong(EX, "reduce-scatter sends chunk (r + s) % N", reduce_scatter_plus_step,
          ("at world size 3", "sent in step 2 (reduce-scatter step 1)", "yours 'chunk 1",
           "the reference 'chunk 2", "sends chunk (r - s) % n")),
    Wrong(EX, "all-gather receives into chunk (r - s - 1) % N", all_gather_into_the_wrong_chunk,
          ("at the end of step 2 (all-gather step 0)", "changed chunk 1; the ring changes "
           "chunk 0", "receives into its chunk (r - s) % n")),
    Wrong(EX, "the right ring on a copy, returned", returns_a_new_sum,
          ("unchanged on every rank, in every step", "in place")),
]


# The second round (tests/wrong_answers/round2/): written from the notebook and solution only
from wrong_answers.round2 import round2  # noqa: E402

WRONG += round2("02")
