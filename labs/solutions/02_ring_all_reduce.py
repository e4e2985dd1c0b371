"""Reference solution of lab 02's exercise: a ring all-reduce from point-to-point messages."""

import torch


def ring_all_reduce(tensor, rank, world_size, send, recv):
    """Sum ``tensor`` over all ranks, in place, with 2(N-1) messages of one chunk each.

    ``send(t, to)`` starts sending t to rank ``to`` (it returns a request to wait on);
    ``recv(t, frm)`` receives into t what rank ``frm`` sent (it blocks until it arrives).
    """
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)  # views: sizes differ by at most one element
    # Phase 1, reduce-scatter: after N-1 steps, chunk (rank + 1) % N holds the full sum here.
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)
    # Phase 2, all-gather: pass each summed chunk on around the ring (copy, do not add).
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], right)
        recv(chunks[inc], left)
        request.wait()
