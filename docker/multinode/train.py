"""HSDP across nodes: one shard group per node, replicated over the nodes.

Started on every node by torchrun (see torchrun.sh and slurm.sbatch beside this file)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
             --rdzv-id job1 docker/multinode/train.py --steps 20

Inside a node the model is sharded over its GPUs (fast links: NVLink); between nodes only the
all-reduce of each rank's gradient shard goes over the network, 2(G−1)/G x 4Ψ/S bytes per rank
and step with G nodes of S GPUs. The same ``train`` function runs in a notebook with
``fsdp_mini.launch(train, 4, 20, 2)``.
"""

import argparse
import os

import fsdp_mini
from fsdp_mini import training
from fsdp_mini.models import GPTConfig, SyntheticText, make_model


def train(rank: int, world_size: int, steps: int, shard_size: int, tiny: bool = False):
    device = fsdp_mini.rank_device()  # this rank's GPU under NCCL, the CPU under gloo
    cfg = GPTConfig.tiny() if tiny else GPTConfig()
    model = make_model(cfg).to(device)
    model, optimizer = fsdp_mini.parallelize(model, "hsdp", units=list(model.blocks),
                                             shard_size=shard_size)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    run = training.train(model, optimizer, lambda step: tuple(
        t.to(device) for t in data.local_batch(step, 4 * world_size, rank, world_size)), steps)
    ledger = model.fsdp_mini.comm.ledger
    last = [r for r in ledger.records if r.step == ledger.step]
    by_group = {g: sum(r.sent_bytes for r in last if r.group == g) for g in ("shard", "replicate")}
    if rank == 0:
        print(f"world size {world_size} = {world_size // shard_size} groups x {shard_size}; "
              f"losses {[round(x, 4) for x in run.losses]}")
        print(f"last step, rank 0 sent {by_group['shard'] / 2**20:.2f} MiB inside its group, "
              f"{by_group['replicate'] / 2**20:.2f} MiB across groups; formula "
              f"{fsdp_mini.expected_costs(model)['sent_bytes_per_step'] / 2**20:.2f} MiB in all")
    return run.losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shard-size", type=int, default=None,
                        help="ranks per shard group (default: this node's, LOCAL_WORLD_SIZE)")
    parser.add_argument("--tiny", action="store_true", help="the 28k-parameter GPT (a quick try)")
    args = parser.parse_args()
    shard = args.shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    fsdp_mini.run_with_torchrun(train, args.steps, shard, args.tiny)
