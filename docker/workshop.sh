#!/usr/bin/env bash
# The workshop's boxes from the instructor's laptop: one GPU box per team, with SkyPilot.
# Run from anywhere; it works from the repository root (docker/sky.yaml's workdir).
#
#   docker/workshop.sh up [--gpus L4:4] [--hours 5] team1 team2 ...   launch (a token each)
#   docker/workshop.sh keys team1 team1.pub      the team's SSH public keys: a tunnel-only login
#   docker/workshop.sh handout team1             the team's handout, filled in (its token too)
#   docker/workshop.sh check team1 ...           the box's safety, the container's doctor
#   docker/workshop.sh gpu-check team1 ...       benchmarks/gpu_check.sh in the image, on the box
#   docker/workshop.sh status [team1 ...]        SkyPilot's status and whether JupyterLab answers
#   docker/workshop.sh collect team1 ...         the assessment reports and the work, to the laptop
#   docker/workshop.sh down [--no-collect] team1 ...   collect, then delete the boxes
#
# FSDP_MINI_WORKSHOP_DIR (default ~/.fsdp-mini-workshop, mode 0700) holds the tokens (tokens/TEAM,
# mode 0600), the team list (teams), the teams' public keys (keys/TEAM.pub, put on a relaunched
# box by `up`), the filled-in handouts and what was collected. It must lie
# outside the repository: the repository is copied to every box on every launch.
# The commands it runs: sky (SkyPilot, in its own virtualenv), ssh and, on the box, docker.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname "$here")
LAB_PORT=8888
CONTAINER=fsdp-mini-lab

die() { echo "workshop: error: $*" >&2; exit 2; }
say() { echo "workshop: $*"; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

workshop_dir() {
    local dir="${FSDP_MINI_WORKSHOP_DIR:-$HOME/.fsdp-mini-workshop}" abs created=no
    [ -n "$dir" ] || die "FSDP_MINI_WORKSHOP_DIR is empty: name a folder outside the repository"
    if [ ! -d "$dir" ]; then
        mkdir -p "$dir"
        created=yes
    fi
    abs=$(cd "$dir" && pwd -P)
    case "$abs/" in
        "$repo/"*)
            if [ "$created" = yes ]; then rmdir "$dir"; fi
            die "FSDP_MINI_WORKSHOP_DIR=$dir is inside the repository ($repo), which SkyPilot copies to every box: keep the tokens elsewhere (the default is ~/.fsdp-mini-workshop)" ;;
    esac
    chmod 0700 "$abs"
    mkdir -p "$abs/tokens" "$abs/keys" "$abs/handouts" "$abs/collected"
    chmod 0700 "$abs/tokens" "$abs/keys" "$abs/handouts" "$abs/collected"
    echo "$abs"
}

check_team() {
    case "$1" in
        "" | *[!a-z0-9-]* | [!a-z]*) die "team name '$1': a cluster name, lowercase letters, digits and '-', starting with a letter (team1, team-b, spare)" ;;
    esac
    [ "${#1}" -le 30 ] || die "team name '$1' is longer than 30 characters"
}

need_teams() {
    [ "$#" -gt 0 ] || die "name at least one team, e.g. $0 $command team1 team2"
    for team in "$@"; do check_team "$team"; done
}

new_token() {
    if command -v openssl >/dev/null 2>&1; then
        openssl rand -hex 24
    else
        od -An -tx1 -N24 /dev/urandom | tr -d ' \n'
    fi
}

token_of() {  # dir, team: the team's token, made once
    local file="$1/tokens/$2"
    if [ ! -s "$file" ]; then
        (umask 077 && new_token >"$file")
    fi
    chmod 0600 "$file"
    tr -d '\n' <"$file"
}

sky_() {  # sky, with the workshop's configuration: no cloud credentials copied to the boxes
    SKYPILOT_PROJECT_CONFIG="$repo/docker/sky-config.yaml" sky "$@"
}

cmd_up() {
    local gpus="" hours=12
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --gpus) [ "$#" -ge 2 ] || die "--gpus needs a value, e.g. --gpus L4:4"; gpus="$2"; shift 2 ;;
            --gpus=*) gpus="${1#--gpus=}"; shift ;;
            --hours) [ "$#" -ge 2 ] || die "--hours needs a value, e.g. --hours 5"; hours="$2"; shift 2 ;;
            --hours=*) hours="${1#--hours=}"; shift ;;
            -*) die "up: unknown option $1 (--gpus, --hours)" ;;
            *) break ;;
        esac
    done
    case "$hours" in
        "" | *[!0-9]* | ???*) die "--hours '$hours': whole hours from 1 to 72 until the box powers itself off" ;;
    esac
    { [ "$hours" -ge 1 ] && [ "$hours" -le 72 ]; } ||
        die "--hours '$hours': whole hours from 1 to 72 until the box powers itself off"
    case "$gpus" in
        "" | [A-Za-z]*:[1-8]) ;;
        *) die "--gpus '$gpus': an accelerator and a count, e.g. L4:4 or A100:2" ;;
    esac
    need_teams "$@"
    local dir
    dir=$(workshop_dir)
    cd "$repo"
    for team in "$@"; do
        local token
        token=$(token_of "$dir" "$team")
        say "$team: launching (docker/sky.yaml${gpus:+, --gpus $gpus}, powers off after $hours h)"
        # Note: the token travels in the environment (--env NAME without a value), never on a
        # command line that ps would show.
        JUPYTER_TOKEN="$token" sky_ launch -y -d -c "$team" docker/sky.yaml \
            --env JUPYTER_TOKEN --env "BOX_HOURS=$hours" ${gpus:+--gpus "$gpus"}
        grep -v "^$team " "$dir/teams" 2>/dev/null >"$dir/teams.new" || true
        echo "$team ${gpus:-docker/sky.yaml} $hours h $(date -u '+%Y-%m-%dT%H:%MZ')" >>"$dir/teams.new"
        mv "$dir/teams.new" "$dir/teams"
        chmod 0600 "$dir/teams"
        if [ -s "$dir/keys/$team.pub" ]; then
            add_keys "$team" "$dir/keys/$team.pub"
        fi
    done
    say "next: $0 keys TEAM TEAM.pub, then $0 handout TEAM, for each team"
}

cmd_keys() {
    [ "$#" = 2 ] || die "keys: name a team and its public key file, e.g. $0 keys team1 team1.pub"
    check_team "$1"
    [ -r "$2" ] || die "keys: $2 cannot be read"
    local dir
    dir=$(workshop_dir)
    add_keys "$1" "$2"
    # Note: a copy for `up`, which puts them on a relaunched box (a new box has none).
    (umask 077 && cp "$2" "$dir/keys/$1.pub.new" && mv "$dir/keys/$1.pub.new" "$dir/keys/$1.pub")
}

add_keys() {  # team, file
    # Note: every word is a plain word (no quoting for the box's shell), the keys go on stdin.
    ssh "$1" sudo bash sky_workdir/docker/box_setup.sh add-key <"$2"
}

cmd_handout() {
    [ "$#" = 1 ] || die "handout: name one team, e.g. $0 handout team1"
    check_team "$1"
    local dir address token template out
    dir=$(workshop_dir)
    [ -s "$dir/tokens/$1" ] || die "handout: no token for $1 in $dir/tokens: launch it with $0 up $1"
    token=$(token_of "$dir" "$1")
    address=$(sky_ status --ip "$1" | tail -n 1 | tr -d '[:space:]')
    case "$address" in
        "" | *[!0-9A-Za-z.:-]*) die "handout: sky status --ip $1 gave no address ('$address'): is the box up?" ;;
    esac
    template="$repo/slides/handout.md"
    out="$dir/handouts/$1.md"
    (umask 077 && sed -e "s|<team>|$1|g" -e "s|<address>|$address|g" -e "s|<token>|$token|g" \
        "$template" >"$out")
    say "$1: handout written to $out (it holds the team's token: hand it to that team only)"
}

cmd_check() {
    need_teams "$@"
    local bad=0
    for team in "$@"; do
        say "$team: the box (attendee login, closed home, no credentials, metadata closed)"
        # Note: one argument, single-quoted here: $(id -un) runs on the box, as SkyPilot's user.
        ssh "$team" 'sudo env CLUSTER_USER="$(id -un)" bash sky_workdir/docker/box_setup.sh check' || bad=1
        say "$team: the container (GPUs, NCCL, /dev/shm, memlock, ports, versions, JupyterLab)"
        ssh "$team" docker exec "$CONTAINER" fsdp-mini doctor --url "http://127.0.0.1:$LAB_PORT" || bad=1
    done
    return "$bad"
}

cmd_gpu_check() {
    need_teams "$@"
    local bad=0
    for team in "$@"; do
        say "$team: benchmarks/gpu_check.sh in fsdp-mini:gpu, from SkyPilot's copy of the repository"
        ssh "$team" 'cd sky_workdir && docker run --rm --gpus all --ipc=host --ulimit memlock=-1 -v "$PWD":/src:ro -w /src fsdp-mini:gpu bash benchmarks/gpu_check.sh' || bad=1
    done
    return "$bad"
}

cmd_status() {
    for team in "$@"; do check_team "$team"; done
    sky_ status "$@"
    for team in "$@"; do
        local code
        code=$(ssh "$team" curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$LAB_PORT/api/status" || true)
        case "$code" in
            403) say "$team: JupyterLab answers on the box (403 without the token, as it should)" ;;
            *) say "$team: JupyterLab does not answer on the box (HTTP '${code:-none}'): sky logs $team" ;;
        esac
    done
}

# What runs in the container to pack the reports (sent on stdin: no quoting through ssh).
# shellcheck disable=SC2016  # expanded in the container, not here
REPORTS_SCRIPT='cd ~/work || exit 4
set -- assessment_report_*
[ -e "$1" ] || exit 3
tar -c -- "$@"'

collect_one() {  # dir, team -> 0, or 1 when the work could not be copied
    local dir="$1" team="$2" out="$1/collected" rc=0
    printf '%s\n' "$REPORTS_SCRIPT" |
        ssh "$team" docker exec -i "$CONTAINER" sh -s >"$out/$team-reports.tar" || rc=$?
    case "$rc" in
        0) say "$team: $(tar -tf "$out/$team-reports.tar" | wc -l | tr -d ' ') report files -> $out/$team-reports.tar" ;;
        3) rm -f "$out/$team-reports.tar"; say "$team: no assessment report in ~/work yet" ;;
        *) rm -f "$out/$team-reports.tar"; say "$team: the reports could not be read (exit status $rc): is $CONTAINER running? (sky logs $team)" ;;
    esac
    rc=0
    ssh "$team" docker run --rm -v fsdp-mini-work:/home/learner/work fsdp-mini:gpu \
        tar -C /home/learner/work -c . >"$out/$team-work.tar" || rc=$?
    if [ "$rc" = 0 ] && tar -tf "$out/$team-work.tar" >/dev/null 2>&1; then
        say "$team: the work, $(tar -tf "$out/$team-work.tar" | wc -l | tr -d ' ') entries -> $out/$team-work.tar"
        return 0
    fi
    say "$team: the work could not be copied (exit status $rc)"
    return 1
}

cmd_collect() {
    need_teams "$@"
    local dir bad=0
    dir=$(workshop_dir)
    for team in "$@"; do collect_one "$dir" "$team" || bad=1; done
    return "$bad"
}

cmd_down() {
    local collect=yes
    if [ "${1:-}" = --no-collect ]; then collect=no; shift; fi
    need_teams "$@"
    local dir bad=0
    dir=$(workshop_dir)
    for team in "$@"; do
        if [ "$collect" = yes ] && ! collect_one "$dir" "$team"; then
            say "$team: NOT deleted, its work is not copied; copy it, or: $0 down --no-collect $team"
            bad=1
            continue
        fi
        sky_ down -y "$team"
        say "$team: deleted"
    done
    return "$bad"
}

command="${1:-}"
[ "$#" -gt 0 ] && shift
case "$command" in
    up) cmd_up "$@" ;;
    keys) cmd_keys "$@" ;;
    handout) cmd_handout "$@" ;;
    check) cmd_check "$@" ;;
    gpu-check) cmd_gpu_check "$@" ;;
    status) cmd_status "$@" ;;
    collect) cmd_collect "$@" ;;
    down) cmd_down "$@" ;;
    -h | --help | help) usage ;;
    *) usage >&2; die "unknown command '$command'" ;;
esac
