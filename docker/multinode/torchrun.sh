#!/usr/bin/env bash
# HSDP on several nodes with plain torchrun: run this on EVERY node, the same way, e.g.
#
#   MASTER_ADDR=10.0.0.1 NNODES=2 NODE_RANK=0 docker/multinode/torchrun.sh --steps 20   # node 0
#   MASTER_ADDR=10.0.0.1 NNODES=2 NODE_RANK=1 docker/multinode/torchrun.sh --steps 20   # node 1
#
# MASTER_ADDR      an address of node 0 that every node can reach (the c10d rendezvous store)
# MASTER_PORT      a free TCP port there (default 29500)
# NNODES           how many nodes; NODE_RANK this node's number (0 .. NNODES-1)
# GPUS_PER_NODE    ranks per node (default: the GPUs nvidia-smi sees, else 2 CPU ranks on gloo)
# NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME   the network interface between nodes (`ip -br addr`:
#                  e.g. eth0, ens5, ib0); the default lets NCCL/gloo guess, which can pick docker0
# Every rank of a node forms one shard group: --shard-size = GPUS_PER_NODE.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${MASTER_ADDR:?set MASTER_ADDR to an address of node 0 that every node can reach}"
NNODES="${NNODES:-2}"
NODE_RANK="${NODE_RANK:?set NODE_RANK to the number of this node, 0 to NNODES-1}"
if [[ -z "${GPUS_PER_NODE:-}" ]]; then
    GPUS_PER_NODE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [[ "$GPUS_PER_NODE" -gt 0 ]] || GPUS_PER_NODE=2
fi
[[ -n "${NCCL_SOCKET_IFNAME:-}" ]] && export NCCL_SOCKET_IFNAME
[[ -n "${GLOO_SOCKET_IFNAME:-${NCCL_SOCKET_IFNAME:-}}" ]] && \
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$NCCL_SOCKET_IFNAME}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" \
    --rdzv-id "${RDZV_ID:-fsdp-mini-hsdp}" --max-restarts 0 \
    "$here/train.py" --shard-size "$GPUS_PER_NODE" "$@"
