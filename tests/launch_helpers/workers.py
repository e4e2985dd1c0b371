"""Worker functions run by fsdp_mini.launch in tests: each is called as fn(rank, world_size, *args)."""
import os
import signal
import time

import torch
import torch.distributed as dist


def all_reduce_rank(rank, world_size, scale=1.0):
    """Sum (rank + 1) * scale over ranks; return the tensor and some plain values; say hello."""
    print(f"hello from rank {rank}")
    os.write(2, f"fd-level stderr of rank {rank}\n".encode())  # like C++ code would
    t = torch.full((4,), (rank + 1) * scale)
    dist.all_reduce(t)
    return {"rank": rank, "world_size": world_size, "sum": t, "env_rank": int(os.environ["RANK"]),
            "threads": torch.get_num_threads()}


def read_env(rank, world_size, name):
    return os.environ.get(name)


def fail_on(rank, world_size, bad_rank):
    """bad_rank raises; the others wait in a collective and lose their peer."""
    print(f"rank {rank} starting")
    if rank == bad_rank:
        time.sleep(0.3)  # let the peers enter the collective first
        raise ValueError(f"rank {rank} exploded on purpose")
    dist.all_reduce(torch.ones(2))


def die_on(rank, world_size, bad_rank, how):
    """bad_rank dies without a Python exception (SIGKILL or os._exit(3)) while peers wait."""
    if rank == bad_rank:
        time.sleep(0.3)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)
    dist.all_reduce(torch.ones(2))


def sleep_forever(rank, world_size):
    time.sleep(1e6)


def hang_on(rank, world_size, bad_rank):
    """bad_rank never reaches the collective that the other ranks wait in."""
    if rank == bad_rank:
        sleep_forever(rank, world_size)
    dist.all_reduce(torch.ones(2))


def straggle(rank, world_size):
    """Rank 0 returns at once; rank 1 is stuck outside any collective."""
    if rank == 1:
        sleep_forever(rank, world_size)
    return rank


def record_pid_and_sleep(rank, world_size, pid_dir):
    with open(os.path.join(pid_dir, f"{rank}.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(pid_dir, f"{rank}.pid.tmp"), os.path.join(pid_dir, f"{rank}.pid"))
    sleep_forever(rank, world_size)


def busy_after_peers(rank, world_size, seconds):
    """Rank 0 returns at once; the others keep computing (using CPU) for `seconds`, then return."""
    if rank == 0:
        return 0
    until, spins = time.monotonic() + seconds, 0
    while time.monotonic() < until:
        spins += 1
    return spins


def busy_forever(rank, world_size):
    """Every rank computes forever: only a deadline ends this."""
    print("in the loop now", flush=True)  # the test reads it: this rank got here before the deadline
    spins = 0
    while True:
        spins += 1


def ignore_sigterm_and_sleep(rank, world_size, ready_dir):
    """Ignore SIGTERM (as some training loops do, to checkpoint), say so in ready_dir, sleep."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path = os.path.join(ready_dir, f"{rank}.ready")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    sleep_forever(rank, world_size)


def raise_timed_out_on(rank, world_size, bad_rank):
    """bad_rank raises its own error whose text says "timed out"; the others wait in a collective."""
    if rank == bad_rank:
        time.sleep(0.3)
        raise RuntimeError("request timed out")
    dist.all_reduce(torch.ones(2))


def one_extra_all_reduce_on(rank, world_size, extra_rank):
    """extra_rank issues one all_reduce more than its peers, which have returned by then."""
    dist.all_reduce(torch.ones(2))
    if rank == extra_rank:
        dist.all_reduce(torch.ones(2))  # the extra one
    return rank


def huge_line_then_raise(rank, world_size, line_bytes, message_bytes):
    """Print one enormous line, then raise an exception with an enormous message."""
    print("x" * line_bytes, flush=True)
    raise ValueError("y" * message_bytes)


def sleep_then_return(rank, world_size, seconds):
    time.sleep(seconds)
    return rank


def read_envs(rank, world_size, names):
    """The values of several environment variables (None where unset), in order."""
    return [os.environ.get(name) for name in names]
