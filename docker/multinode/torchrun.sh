#!/usr/bin/env bash
# HSDP on several nodes with torchrun: run this on EVERY node with the same variables, e.g.
#
#   RDZV_HOST=10.0.0.1 RDZV_ID=run-0612 NNODES=2 docker/multinode/torchrun.sh --steps 20
#
# RDZV_HOST      an address of one node (any) that every node reaches; its agent hosts the
#                c10d rendezvous store on RDZV_PORT (default 29400, torchrun's own default)
# RDZV_ID        one id per job, the same on every node, new for each job (SLURM: the job id):
#                agents with the same id and endpoint form one job
# NNODES         N nodes; or MIN:MAX, elastic: the job starts with MIN and takes up to MAX
# GPUS_PER_NODE  ranks per node (default: the GPUs nvidia-smi sees, else 2 CPU ranks on gloo)
# MAX_RESTARTS   times the ranks are all restarted after a failure (default 3), each time
#                resuming from CKPT_DIR; 0: the first failure ends the job
# CKPT_DIR       the checkpoint folder, on a file system every node sees (default
#                checkpoints/$RDZV_ID): saved every few steps, resumed from when it exists
# LOCAL_ADDR     this node's address as the other nodes reach it (default: torchrun's guess,
#                the node's FQDN)
# NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME   the network interface between nodes (`ip -br addr`:
#                e.g. eth0, ens5, ib0); unset, NCCL and gloo guess and can pick docker0 or lo
# Arguments go to train.py (--steps, --tiny, --save-every). Every node is one shard group.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "torchrun.sh: $*" >&2; exit 2; }
[[ -n "${RDZV_HOST:-}" ]] || die "set RDZV_HOST to an address of one node that every node reaches"
[[ -n "${RDZV_ID:-}" ]] || die "set RDZV_ID to an id of this job, the same on every node and" \
    "new for each job, e.g. RDZV_ID=run-\$(date +%m%d-%H%M) chosen once (a reused id resumes" \
    "that job's checkpoint)"
NNODES="${NNODES:-2}"
MAX_RESTARTS="${MAX_RESTARTS:-3}"
CKPT_DIR="${CKPT_DIR:-checkpoints/$RDZV_ID}"
[[ "$NNODES" =~ ^[1-9][0-9]*(:[1-9][0-9]*)?$ ]] || \
    die "NNODES is '$NNODES': give a number of nodes (2) or a range MIN:MAX (1:4)"
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS is '$MAX_RESTARTS': give 0 or more"
if [[ -z "${GPUS_PER_NODE:-}" ]]; then
    GPUS_PER_NODE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [[ "$GPUS_PER_NODE" -gt 0 ]] || GPUS_PER_NODE=2
fi
if [[ -n "${NCCL_SOCKET_IFNAME:-}" ]]; then
    export NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$NCCL_SOCKET_IFNAME}"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Note: by default the ranks share the agents' store across restarts, and a restart's ranks can
# read the keys of the ranks before it (their dead addresses: "Connection refused"; pytorch
# issues 135712, 167288). Opting out, rank 0 hosts a new store at each start.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
# What each option means (torchrun's documentation, torch/distributed/run.py):
#   --nnodes          N, or MIN:MAX: the rendezvous waits for MIN agents and admits up to MAX
#   --nproc-per-node  the ranks this agent starts, one per GPU
#   --rdzv-backend c10d --rdzv-endpoint   the agents meet in a store that RDZV_HOST's agent
#                     hosts, and the rendezvous numbers the nodes (GROUP_RANK); so no
#                     --node-rank: that (with --master-addr/--master-port) is the static
#                     launch's, where each node is told its number
#   --rdzv-id         the job an agent joins, one per job: an agent given the id of a job that
#                     still runs joins that job (and, with CKPT_DIR's default, a job started
#                     later with an old id resumes that job's checkpoint)
#   --max-restarts    on a rank's failure (or a node joining or leaving) torchrun stops every
#                     rank and starts them all again, at most this many times; train.py then
#                     resumes from --checkpoint (it refuses restarts without one)
#   --local-addr      only where set: the address the other nodes reach this one at
exec torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:${RDZV_PORT:-29400}" --rdzv-id "$RDZV_ID" \
    --max-restarts "$MAX_RESTARTS" ${LOCAL_ADDR:+--local-addr "$LOCAL_ADDR"} \
    "$here/train.py" --shard-size "$GPUS_PER_NODE" --checkpoint "$CKPT_DIR" "$@"
