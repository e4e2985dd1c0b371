"""One rank of the two-node test (tests/test_hsdp.py): started by torchrun, as on a cluster::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \
             --rdzv-id JOB_ID tests/multinode_train.py OUT_DIR

(the same line on every node: the rendezvous numbers the nodes). HSDP with one shard group per
node (shard_size = the node's ranks): the same training function the single-node tests launch.
Each rank saves what it got in OUT_DIR/rank{r}.pt. docker/multinode/ holds the scripts for a
real cluster, tested by tests/test_multinode.py.
"""

import ctypes
import os
import signal
import sys

import hsdp_workers
import torch

import fsdp_mini


def train(rank: int, world_size: int, out_dir: str) -> None:
    shard_size = int(os.environ["LOCAL_WORLD_SIZE"])  # the GPUs (here: ranks) of one node
    result = hsdp_workers.train_hsdp(rank, world_size, "hsdp", {"shard_size": shard_size},
                                     "adamw")
    result.update(world_size=world_size, shard_size=shard_size,
                  node=int(os.environ["GROUP_RANK"]))
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    out = sys.argv[1]
    # Note: torchrun starts each rank in a session of its own; the test kills leftovers by pid,
    # and a rank whose agent dies dies with it.
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    with open(os.path.join(out, f"pid{os.environ['RANK']}.txt"), "w") as f:
        f.write(str(os.getpid()))
    torch.set_num_threads(1)
    fsdp_mini.run_with_torchrun(train, out, backend="gloo", timeout=60)
