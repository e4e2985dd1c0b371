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
# Every variable is checked here, before torchrun starts: a bad one is one line on stderr naming
# it, what it holds and what it should hold, and exit status 2. Set but empty is not unset.
die() { echo "torchrun.sh: $*" >&2; exit 2; }
shown() {  # a value as the messages show it: quoted, a control character escaped
    if [[ "$1" =~ ^[[:print:]]*$ ]]; then printf "'%s'" "$1"; else printf '%q' "$1"; fi
}
# whole NAME LEAST MOST WANT...: $NAME holds a whole number from LEAST to MOST (leading zeros
# read as decimal, and dropped), else die saying WANT
whole() {
    local value=${!1}
    if ! [[ "$value" =~ ^[0-9]{1,9}$ ]] || (( 10#$value < $2 || 10#$value > $3 )); then
        die "$1 is $(shown "$value"): ${*:4}"
    fi
    printf -v "$1" '%d' "$((10#$value))"
}
# address NAME: $NAME is a host name, an IPv4 address or an IPv6 one (in brackets or not), alone
address() {
    local value=${!1}
    if [[ "$value" =~ ^[A-Za-z0-9_]([A-Za-z0-9_.-]*)$ ]]; then return; fi
    if [[ "$value" =~ ^(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+)$ && "$value" == *:*:* ]]; then return; fi
    if [[ "$value" =~ ^[^:]+:[0-9]*$ || "$value" =~ ^\[.*\]:[0-9]*$ ]]; then
        die "$1 is $(shown "$value"): give the address alone, without a port (the" \
            "rendezvous port is RDZV_PORT, default 29400)"
    fi
    die "$1 is $(shown "$value"): give a host name (node-a), an IPv4 address (10.0.0.1) or an" \
        "IPv6 one (fd00::1)"
}
if [[ -z "${RDZV_HOST:-}" ]]; then
    [[ -z "${MASTER_ADDR:-}" ]] || die "set RDZV_HOST to an address of one node that every node" \
        "reaches (not MASTER_ADDR: that is for a static launch, this script meets in a rendezvous)"
    die "set RDZV_HOST to an address of one node that every node reaches"
fi
address RDZV_HOST
[[ -n "${RDZV_ID:-}" ]] || die "set RDZV_ID to an id of this job, the same on every node and" \
    "new for each job, e.g. RDZV_ID=run-\$(date +%m%d-%H%M) chosen once (a reused id resumes" \
    "that job's checkpoint)"
# Note: the id names the checkpoint folder (checkpoints/$RDZV_ID) and follows --rdzv-id: no
# '/', no leading '.' or '-' (an option to torchrun)
[[ "$RDZV_ID" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || \
    die "RDZV_ID is $(shown "$RDZV_ID"): give letters, digits, '_', '.' or '-', starting with a" \
        "letter, digit or '_' (it names the job and its checkpoint folder), e.g. run-0612a"
NNODES="${NNODES-2}"
if ! [[ "$NNODES" =~ ^([0-9]{1,9})(:([0-9]{1,9}))?$ ]] || (( 10#${BASH_REMATCH[1]} < 1 )) \
        || (( 10#${BASH_REMATCH[3]:-1} < 1 )); then
    die "NNODES is $(shown "$NNODES"): give a number of nodes (2) or a range MIN:MAX (1:4)," \
        "whole numbers of 1 or more (unset, it is 2)"
fi
if [[ -n "${BASH_REMATCH[3]}" ]]; then
    min=$((10#${BASH_REMATCH[1]})) max=$((10#${BASH_REMATCH[3]}))
    (( min <= max )) || die "NNODES is '$NNODES': in a range MIN:MAX, MIN must not exceed MAX" \
        "(the job starts with MIN nodes and admits up to MAX): did you mean $max:$min?"
    NNODES="$min:$max"
else
    NNODES=$((10#$NNODES))
fi
MAX_RESTARTS="${MAX_RESTARTS-3}"
whole MAX_RESTARTS 0 999999999 "give 0 or more (a whole number: the times every rank is" \
    "restarted after a failure; unset, it is 3)"
if [[ -z "${GPUS_PER_NODE+set}" ]]; then
    GPUS_PER_NODE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [[ "$GPUS_PER_NODE" -gt 0 ]] || GPUS_PER_NODE=2
fi
whole GPUS_PER_NODE 1 999999999 "give a whole number of 1 or more (the ranks on this node, one" \
    "per GPU; unset, the GPUs nvidia-smi sees, else 2)"
RDZV_PORT="${RDZV_PORT-29400}"
whole RDZV_PORT 1 65535 "give a TCP port from 1 to 65535 (the rendezvous store's, on" \
    "RDZV_HOST; unset, it is 29400)"
CKPT_DIR="${CKPT_DIR-checkpoints/$RDZV_ID}"
if [[ -z "$CKPT_DIR" || "$CKPT_DIR" == -* || ! "$CKPT_DIR" =~ ^[^[:cntrl:]]*$ ]]; then
    die "CKPT_DIR is $(shown "$CKPT_DIR"): give a folder every node sees, with no control" \
        "character and not starting with '-' (an option to train.py; ./-name is a folder)" \
        "(unset, it is checkpoints/$RDZV_ID)"
fi
if [[ -n "${LOCAL_ADDR+set}" ]]; then
    [[ -n "$LOCAL_ADDR" ]] || die "LOCAL_ADDR is '': give this node's address as the others" \
        "reach it, or unset it for torchrun's guess (the node's FQDN)"
    address LOCAL_ADDR
fi
if [[ -n "${OMP_NUM_THREADS+set}" ]]; then
    whole OMP_NUM_THREADS 1 999999999 "give a whole number of 1 or more (the CPU threads of" \
        "each rank; unset, it is 1)"
fi
if [[ -n "${TORCH_DISABLE_SHARE_RDZV_TCP_STORE+set}" ]]; then
    [[ "$TORCH_DISABLE_SHARE_RDZV_TCP_STORE" =~ ^[01]$ ]] || \
        die "TORCH_DISABLE_SHARE_RDZV_TCP_STORE is" \
            "$(shown "$TORCH_DISABLE_SHARE_RDZV_TCP_STORE"): give 1 (each start of the ranks" \
            "gets a store of its own) or 0 (torch's sharing; unset, it is 1)"
fi
# The interfaces: NCCL takes a list of name prefixes, '^' before it excluding them, '=' exact
# names; gloo takes a list of exact names. Empty: unset (NCCL and gloo guess).
ifname='[A-Za-z0-9_.:@-]+' gloo_from=""
if [[ -n "${NCCL_SOCKET_IFNAME:-}" ]]; then
    [[ "$NCCL_SOCKET_IFNAME" =~ ^\^?=?$ifname(,$ifname)*$ ]] || \
        die "NCCL_SOCKET_IFNAME is $(shown "$NCCL_SOCKET_IFNAME"): give network interfaces," \
            "comma-separated (eth0, or ib0,ib1; '^docker,lo' excludes), as \`ip -br addr\`" \
            "names them"
    if [[ -z "${GLOO_SOCKET_IFNAME:-}" ]]; then
        [[ "$NCCL_SOCKET_IFNAME" != ^* ]] || die "GLOO_SOCKET_IFNAME is unset and" \
            "NCCL_SOCKET_IFNAME is '$NCCL_SOCKET_IFNAME', which excludes interfaces: gloo" \
            "takes only names; set GLOO_SOCKET_IFNAME to the interface between nodes (eth0)"
        GLOO_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME#=}" gloo_from=" (from NCCL_SOCKET_IFNAME)"
    fi
    export NCCL_SOCKET_IFNAME
fi
if [[ -n "${GLOO_SOCKET_IFNAME:-}" ]]; then
    [[ "$GLOO_SOCKET_IFNAME" =~ ^$ifname(,$ifname)*$ ]] || \
        die "GLOO_SOCKET_IFNAME is $(shown "$GLOO_SOCKET_IFNAME"): give network interfaces by" \
            "name, comma-separated (eth0, or eth0,eth1), as \`ip -br addr\` names them"
    if [[ -d /sys/class/net ]]; then  # Note: gloo fails on a name this node lacks: say so here
        IFS=, read -ra names <<< "$GLOO_SOCKET_IFNAME"
        present=(/sys/class/net/*)
        for name in "${names[@]}"; do
            [[ -e "/sys/class/net/$name" ]] || die "GLOO_SOCKET_IFNAME is" \
                "'$GLOO_SOCKET_IFNAME'${gloo_from:-}: this node has no interface '$name' (it" \
                "has: ${present[*]##*/}); gloo takes whole names, where NCCL takes prefixes"
        done
    fi
    export GLOO_SOCKET_IFNAME
fi
# Note: slurm.sbatch runs these checks once before srun (FSDP_MINI_CHECK_ONLY=1), and stops there
[[ "${FSDP_MINI_CHECK_ONLY:-}" != 1 ]] || exit 0
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
    --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:$RDZV_PORT" --rdzv-id "$RDZV_ID" \
    --max-restarts "$MAX_RESTARTS" ${LOCAL_ADDR:+--local-addr "$LOCAL_ADDR"} \
    "$here/train.py" --shard-size "$GPUS_PER_NODE" --checkpoint "$CKPT_DIR" "$@"
