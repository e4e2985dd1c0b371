"""HSDP across nodes: one shard group per node, replicated over the nodes; resumes on a restart.

Started on every node by torchrun (torchrun.sh and slurm.sbatch beside this file say how)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
             --rdzv-id JOB_ID --max-restarts 3 docker/multinode/train.py \
             --checkpoint checkpoints/JOB_ID --steps 20

Inside a node the model is sharded over its GPUs (fast links: NVLink); between nodes only the
all-reduce of each rank's gradient shard goes over the network, 2(G−1)/G x 4Ψ/S bytes per rank
and step with G nodes of S GPUs.

Restarts: on a failure torchrun stops every rank and, while ``--max-restarts`` allows, starts
them all again from the top of this script. They then load the last checkpoint of
``--checkpoint`` (saved every ``--save-every`` steps, atomically, loadable at any world size)
and go on from its step; without a checkpoint a restart would quietly start again from step 0,
so restarts without ``--checkpoint`` are refused. At one world size the data of step k is the
same whoever runs it, so a resumed run trains as an uninterrupted one. The same ``train``
function runs in a notebook with ``fsdp_mini.launch(train, 4, 20, 2)``.
"""

import argparse
import os
import socket
from pathlib import Path

import torch.distributed as dist

import fsdp_mini
from fsdp_mini import training
from fsdp_mini.models import GPTConfig, SyntheticText, make_model


def train(rank: int, world_size: int, steps: int, shard_size: int, tiny: bool = False,
          checkpoint: str | None = None, save_every: int = 5):
    device = fsdp_mini.rank_device()  # this rank's GPU under NCCL, the CPU under gloo
    cfg = GPTConfig.tiny() if tiny else GPTConfig()
    model = make_model(cfg).to(device)
    model, optimizer = fsdp_mini.parallelize(model, "hsdp", units=list(model.blocks),
                                             shard_size=shard_size)
    folder = Path(checkpoint) if checkpoint else None
    start = resume(model, optimizer, folder) if folder else 0
    report_layout(rank, world_size, shard_size, model, start, steps)
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    every = save_every if folder else max(steps, 1)  # Note: no folder, no pause to save
    losses = []
    for first in range(start, steps, every):
        count = min(every, steps - first)
        run = training.train(model, optimizer, lambda s, first=first: tuple(
            t.to(device) for t in data.local_batch(first + s, 4 * world_size, rank, world_size)),
            count)
        losses += run.losses
        if folder:
            fsdp_mini.save_checkpoint(model, optimizer, folder, step=first + count)
        if rank == 0:
            print(f"step {first + count}/{steps}: loss {run.losses[-1]:.4f}"
                  + (f", saved to {folder}" if folder else ""), flush=True)
    if rank == 0 and losses:
        report_bytes(model)
    return losses


def resume(model, optimizer, folder: Path) -> int:
    """The step to go on from: the checkpoint's, or 0 where none was saved yet."""
    # Note: a folder ckpt.old-<id> beside an absent ckpt is a save cut between its two renames;
    # load_checkpoint then says what to do, rather than this run starting again from step 0.
    if not folder.exists() and not any(folder.parent.glob(f"{folder.name}.old-*")):
        return 0
    return fsdp_mini.load_checkpoint(model, optimizer, folder)["step"]


def report_layout(rank, world_size, shard_size, model, start, steps):
    """One line per node (its shard group, its agent's restarts), one for the job."""
    # Note: torchrun counts restarts per agent, and only those after a failure of its own
    # ranks; an agent restarted because another node's ranks failed still counts 0.
    if int(os.environ.get("LOCAL_RANK", rank)) == 0:
        print(f"node {os.environ.get('GROUP_RANK', 0)} ({socket.gethostname()}): ranks "
              f"{shard_ranks(model)} form its shard group; its agent's restarts "
              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)} of "
              f"{os.environ.get('TORCHELASTIC_MAX_RESTARTS', 0)}", flush=True)
    if rank == 0:
        print(f"world size {world_size} = {world_size // shard_size} groups x {shard_size}; "
              + (f"resumed from step {start}" if start else "starting at step 0")
              + f", {steps} steps in all", flush=True)


def shard_ranks(model) -> list[int]:
    group = model.fsdp_mini.comm.group
    return dist.get_process_group_ranks(group) if group is not None else [0]


def report_bytes(model):
    ledger = model.fsdp_mini.comm.ledger
    last = [r for r in ledger.records if r.step == ledger.step]
    by_group = {g: sum(r.sent_bytes for r in last if r.group == g) for g in ("shard", "replicate")}
    print(f"last step, rank 0 sent {by_group['shard'] / 2**20:.2f} MiB inside its group, "
          f"{by_group['replicate'] / 2**20:.2f} MiB across groups; formula "
          f"{fsdp_mini.expected_costs(model)['sent_bytes_per_step'] / 2**20:.2f} MiB in all")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shard-size", type=int, default=None,
                        help="ranks per shard group (default: this node's, LOCAL_WORLD_SIZE)")
    parser.add_argument("--tiny", action="store_true", help="the 28k-parameter GPT (a quick try)")
    parser.add_argument("--checkpoint", default=None,
                        help="checkpoint folder, on a file system every node sees: resumed from "
                             "when it exists, saved every --save-every steps")
    parser.add_argument("--save-every", type=int, default=5, help="steps between checkpoints")
    args = parser.parse_args()
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts > 0 and not args.checkpoint:
        parser.error(f"torchrun may restart this job {restarts} time(s) (--max-restarts), but "
                     f"there is no --checkpoint to resume from: a restart would train again from "
                     f"step 0. Pass --checkpoint DIR (a folder every node sees), or run torchrun "
                     f"with --max-restarts 0")
    if args.save_every < 1 or args.steps < 0:
        parser.error(f"--save-every must be >= 1 and --steps >= 0, got {args.save_every} and "
                     f"{args.steps}")
    return args


if __name__ == "__main__":
    args = parse_args()
    shard = args.shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    fsdp_mini.run_with_torchrun(train, args.steps, shard, args.tiny, args.checkpoint,
                                args.save_every)
