"""Point-to-point messages that are written down, for code that sends and receives by hand.

    msgs = Messages(tensor, parts=tensor.view(-1).tensor_split(n), tag=7)   # on every rank
    request = msgs.send(chunk, to=1)      # non-blocking; request.wait() once the step is done
    msgs.recv(buffer, frm=3)              # blocks until it arrives
    msgs.finish()                         # the last step is over
    msgs.log      # [{"op": "send", "step": 1, "peer": "rank 1", "part": "chunk 0, elements
                  #   0-3", "dtype": "float32", "waited": True}, {"op": "recv", ..., "into":
                  #   "4 elements", "dtype": "float32"}]: words, not numbers to take ratios of

Each message names which of ``parts`` it is: by where it lies in ``tensor``, or, for a copy, by
what it holds (a copy of chunk 2 is chunk 2). Step k of a rank is its k-th send and k-th recv;
``on_step(k)`` is called when step k is over (its next send or recv begins, or ``finish``), and
a send's ``waited`` says whether its request was waited for by then (``"later"``: only after).
Each message goes after its size and dtype, so a recv into a tensor of another size is written
down (``into``, the elements received into) instead of aborting the process (gloo aborts then). ``tag`` keeps one run's
messages apart from the next's: a message never received stays under its own tag.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.float16, torch.int64, torch.int32)
_UNWAITED = []  # Note: sends never waited for keep their buffers alive while gloo holds them


class Messages:
    """``send`` and ``recv`` between the ranks of the default group, each written in ``log``."""

    def __init__(self, tensor, parts, tag: int = 0, name: str = "chunk", on_step=None):
        self.x, self.parts, self.tag, self.name = tensor, tuple(parts), tag, name
        self.on_step = on_step
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.log, self.requests, self.recvs, self.steps, self.sent_bytes = [], [], 0, 0, 0

    def _peer(self, peer, what: str) -> int:
        if isinstance(peer, int) and 0 <= peer < self.world_size and peer != self.rank:
            return peer
        raise ValueError(f"{what} rank {peer!r} from rank {self.rank}: peers are the other "
                         f"ranks 0..{self.world_size - 1} (use (rank + 1) % world_size)")

    def _step(self, k: int) -> None:
        """Step k is over (a send or recv number k + 1 begins)."""
        if k > self.steps:
            self.steps = k
            for m in self.log:
                if m["op"] == "send" and m["step"] == k:
                    m["waited"] = self.requests[k - 1].waited
            if self.on_step:
                self.on_step(k)

    def part(self, t) -> str:
        """Which part ``t`` is: "chunk 2, elements 8-11", "the whole tensor, ...", or neither."""
        base, m = self.x.storage_offset(), t.numel()
        spans = [(c.storage_offset() - base, c.numel()) for c in self.parts + (self.x,)]
        if t.untyped_storage().data_ptr() == self.x.untyped_storage().data_ptr():
            span = (t.storage_offset() - base, m)
        else:
            span = next((sp for c, sp in zip(self.parts + (self.x,), spans) if c.numel() == m
                         and torch.equal(c.reshape(-1), t.reshape(-1).to(c.dtype))), (None, m))
        words = f"a tensor of {m} elements, no {self.name}" if span[0] is None else \
            f"elements {span[0]}-{span[0] + m - 1}" if m else "no elements"
        return f"{self.name} {spans.index(span)}, {words}" if span in spans[:-1] else \
            f"the whole tensor, {words}" if span == spans[-1] else words

    def send(self, tensor: torch.Tensor, to: int) -> "Request":
        """Start sending ``tensor`` to rank ``to``; returns a request: call its ``.wait()``."""
        to = self._peer(to, "send to")
        self._step(len(self.requests))
        data = tensor.detach().reshape(-1).contiguous()
        if data.dtype not in DTYPES:
            raise ValueError(f"send a tensor of one of {[str(t)[6:] for t in DTYPES]}, "
                             f"not {data.dtype}")
        self.log.append({"op": "send", "step": len(self.requests) + 1, "peer": f"rank {to}",
                         "part": self.part(tensor), "dtype": str(data.dtype)[6:]})
        head = torch.tensor([data.numel(), DTYPES.index(data.dtype)])
        self.requests.append(Request(dist.isend(head, to, tag=self.tag + 1), dist.isend(
            data.view(torch.uint8), to, tag=self.tag), head, data))
        self.sent_bytes += data.numel() * data.element_size()
        return self.requests[-1]

    def recv(self, tensor: torch.Tensor, frm: int) -> None:
        """Receive into ``tensor`` what rank ``frm`` sent; blocks until it arrives."""
        frm, head = self._peer(frm, "recv from"), torch.zeros(2, dtype=torch.int64)
        self._step(self.recvs)
        self.recvs += 1
        self.log.append({"op": "recv", "step": self.recvs, "peer": f"rank {frm}",
                         "into": f"{tensor.numel()} element{'s' * (tensor.numel() != 1)}",
                         "dtype": str(tensor.dtype)[6:]})
        dist.irecv(head, frm, tag=self.tag + 1).wait()
        landing = torch.empty(int(head[0]), dtype=DTYPES[int(head[1])])
        dist.irecv(landing.view(torch.uint8), frm, tag=self.tag).wait()
        k = min(landing.numel(), tensor.numel())
        with torch.no_grad():
            (tensor.copy_(landing.view(tensor.shape)) if k == tensor.numel() == landing.numel()
             else tensor.view(-1)[:k].copy_(landing[:k]))

    def finish(self) -> None:
        """The last step is over. Sends never waited for keep their buffers while gloo may
        still read them (a gloo send is done only once its recv came)."""
        self._step(max(len(self.requests), self.recvs))
        _UNWAITED.extend(r for r in self.requests if not r.waited)
        for m in self.log:  # Note: waited for, but only after the next step began
            if m.get("waited") is False and self.requests[m["step"] - 1].waited:
                m["waited"] = "later"


class Request:
    """A send in flight; ``wait()`` may be called twice (gloo's own request hangs then)."""

    def __init__(self, *works_and_buffers):  # Note: buffers live until the send is done
        self.held, self.waited = works_and_buffers, False

    def wait(self) -> None:
        self.waited = self.waited or all(work.wait() or True for work in self.held[:2])

