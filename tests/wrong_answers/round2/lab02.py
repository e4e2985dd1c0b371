"""Fresh wrong answers for lab 02 (collectives): the ring all-reduce exercise."""
import torch

from wrong_answers.round2 import Case
from fsdp_mini import labs


# 1. chunk() instead of tensor_split(): fewer / differently sized chunks when N does not divide
def ring_chunk(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).chunk(n)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], right)
        recv(chunks[inc], left)
        request.wait()


# 2. split into pieces of numel // N elements: the remainder is an extra chunk nobody reduces
def ring_split_floor(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    flat = tensor.view(-1)
    chunks = flat.split(flat.numel() // n)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], right)
        recv(chunks[inc], left)
        request.wait()


# 3. the ring runs the other way (send to rank-1, receive from rank+1); the sum is still right
def ring_reversed(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    for step in range(n - 1):
        out, inc = (rank + step) % n, (rank + step + 1) % n
        request = send(chunks[out], left)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, right)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank - 1 + step) % n, (rank + step) % n
        request = send(chunks[out], left)
        recv(chunks[inc], right)
        request.wait()


# 4. the all-gather phase adds what it receives instead of copying it
def ring_gather_adds(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)


# 5. never waits for its sends
def ring_no_wait(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        send(chunks[out], right)
        recv(chunks[inc], left)


# 6. keeps every request in a list and waits for them all only at the very end
def ring_wait_at_end(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    pending = []
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        pending.append(send(chunks[out], right))
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        pending.append(send(chunks[out], right))
        recv(chunks[inc], left)
    for request in pending:
        request.wait()


# 7. out-of-place add into a list of chunks: the sums land in new tensors, not in `tensor`
def ring_out_of_place(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = list(tensor.view(-1).tensor_split(n))
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc] = chunks[inc] + incoming
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], right)
        recv(chunks[inc], left)
        request.wait()


# 8. the all-gather phase starts from chunk (rank - step), the reduce-scatter's rule
def ring_gather_offset(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        recv(chunks[inc], left)
        request.wait()


# 9. receive buffer made with torch.empty(numel): float32 even when the tensor is bfloat16
def ring_float32_buffer(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    for step in range(n - 1):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty(chunks[inc].numel())
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], right)
        recv(chunks[inc], left)
        request.wait()


# 10. reduce-scatter runs N steps instead of N-1: one chunk gets added once too often
def ring_extra_step(tensor, rank, world_size, send, recv):
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    for step in range(n):
        out, inc = (rank - step) % n, (rank - step - 1) % n
        request = send(chunks[out], right)
        incoming = torch.empty_like(chunks[inc])
        recv(incoming, left)
        request.wait()
        chunks[inc].add_(incoming)
    for step in range(n - 1):
        out, inc = (rank + 1 - step) % n, (rank - step) % n
        request = send(chunks[out], right)
        recv(chunks[inc], left)
        request.wait()


EX = "02_ring_all_reduce"
CASES = [
    Case(EX, "cuts the tensor with chunk() instead of tensor_split()",
         lambda: labs.check_ring_all_reduce(ring_chunk)),
    Case(EX, "splits into pieces of numel // N elements: the remainder is never reduced",
         lambda: labs.check_ring_all_reduce(ring_split_floor)),
    Case(EX, "ring runs the wrong direction (sends to rank-1); sum still right",
         lambda: labs.check_ring_all_reduce(ring_reversed)),
    Case(EX, "all-gather phase adds the received chunk instead of copying it",
         lambda: labs.check_ring_all_reduce(ring_gather_adds)),
    Case(EX, "never waits for its send requests",
         lambda: labs.check_ring_all_reduce(ring_no_wait)),
    Case(EX, "waits for all send requests only at the very end",
         lambda: labs.check_ring_all_reduce(ring_wait_at_end)),
    Case(EX, "out-of-place add: summed chunks are new tensors, not written into the tensor",
         lambda: labs.check_ring_all_reduce(ring_out_of_place)),
    Case(EX, "all-gather phase sends chunk (rank - step) instead of (rank + 1 - step)",
         lambda: labs.check_ring_all_reduce(ring_gather_offset)),
    Case(EX, "receive buffer is float32 (torch.empty(numel)) whatever the tensor's dtype",
         lambda: labs.check_ring_all_reduce(ring_float32_buffer)),
    Case(EX, "reduce-scatter runs N steps instead of N-1",
         lambda: labs.check_ring_all_reduce(ring_extra_step)),
]
