#!/usr/bin/env bash
# The workshop's boxes from the instructor's laptop: one GPU box per team, with SkyPilot.
# Run from anywhere; it works from the repository root (docker/sky.yaml's workdir).
#
#   docker/workshop.sh up [--gpus L4:4] [--hours 5] team1 team2 ... spare demo   launch (a token each)
#   docker/workshop.sh keys team1 team1.pub      the team's SSH public keys: a tunnel-only login
#   docker/workshop.sh handout team1             the team's handout, filled in (token, GPUs, repository)
#   docker/workshop.sh check team1 ...           the box's safety, the container's doctor (its GPUs)
#   docker/workshop.sh gpu-check team1 ...       benchmarks/gpu_check.sh in the image, on the box
#   docker/workshop.sh status [team1 ...]        SkyPilot's status, and whether JupyterLab answers
#                                                (no team named: every team of the team list)
#   docker/workshop.sh progress [--html PAGE] [team1 ...]   the teams' checks, copied from the
#                                                boxes, then `fsdp-mini progress` (no team: all)
#   docker/workshop.sh restart team1             JupyterLab's container started again, the work kept
#   docker/workshop.sh collect team1 ...         the assessment reports and the work, to the laptop
#   docker/workshop.sh down [--no-collect] team1 ...   collect, then delete the boxes
#
# A command that names several teams goes on past a team that fails, says what failed for each,
# and ends with a summary line and exit status 1 (`down`: the teams left up, still billing).
#
# FSDP_MINI_WORKSHOP_DIR (default ~/.fsdp-mini-workshop, mode 0700) holds the tokens (tokens/TEAM,
# mode 0600), the team list (teams: the boxes up, with their GPUs), the teams' public keys
# (keys/TEAM.pub, put on a relaunched box by `up`), the filled-in handouts, what was collected
# (collected/: every copy kept, dated; TEAM-work.tar is the latest) and the teams' progress. It
# must lie outside the repository: the repository is copied to every box on every launch.
# The commands it runs: sky (SkyPilot, in its own virtualenv), ssh, on the box docker, and for
# `progress` the kit's fsdp-mini on the laptop.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname "$here")
LAB_PORT=8888
CONTAINER=fsdp-mini-lab
PROGRESS_FILE=.fsdp-mini-progress.jsonl  # fsdp_mini/labs/common/progress.py writes it

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
    mkdir -p "$abs/tokens" "$abs/keys" "$abs/handouts" "$abs/collected" "$abs/progress"
    chmod 0700 "$abs/tokens" "$abs/keys" "$abs/handouts" "$abs/collected" "$abs/progress"
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

listed_teams() {  # dir -> the teams of the team list (the boxes `up` launched and `down` has not deleted)
    local team rest
    [ -s "$1/teams" ] || return 0
    while read -r team rest; do
        check_team "$team"
        echo "$team"
    done <"$1/teams"
}

set_listed() {  # dir, team, [line]: the team's line of the team list replaced (none: removed)
    grep -v "^$2 " "$1/teams" 2>/dev/null >"$1/teams.new" || true
    if [ -n "${3:-}" ]; then echo "$3" >>"$1/teams.new"; fi
    mv "$1/teams.new" "$1/teams"
    chmod 0600 "$1/teams"
}

gpus_of() {  # dir, team -> the box's GPU count: its `up --gpus`, else docker/sky.yaml's (all :4)
    local spec
    spec=$(awk -v t="$2" '$1 == t { print $2 }' "$1/teams" 2>/dev/null | tail -n 1)
    case "$spec" in
        [A-Za-z]*:[1-8]) echo "${spec##*:}"; return ;;
    esac
    spec=$(sed -n 's/^ *- accelerators: *[A-Za-z0-9-]*:\([1-8]\) *$/\1/p' "$repo/docker/sky.yaml" | head -n 1)
    [ -n "$spec" ] || die "$2: no GPU count in docker/sky.yaml's accelerators: launch it with $0 up --gpus L4:4 $2"
    echo "$spec"
}

summary() {  # what, the teams that failed (space-separated, may be empty), what it means
    if [ -n "$2" ]; then
        say "$1: FAILED for${2}${3:+: $3}"
        return 1
    fi
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
    local dir token rc failed="" nokeys=""
    dir=$(workshop_dir)
    cd "$repo"
    for team in "$@"; do
        token=$(token_of "$dir" "$team")
        say "$team: launching (docker/sky.yaml${gpus:+, --gpus $gpus}, powers off after $hours h)"
        # Note: the token travels in the environment (--env NAME without a value), never on a
        # command line that ps would show.
        rc=0
        JUPYTER_TOKEN="$token" sky_ launch -y -d -c "$team" docker/sky.yaml \
            --env JUPYTER_TOKEN --env "BOX_HOURS=$hours" ${gpus:+--gpus "$gpus"} || rc=$?
        if [ "$rc" != 0 ]; then
            say "$team: NOT launched (sky launch: exit status $rc); it may be partly up and billing: sky status $team, then $0 up ... $team again, or $0 down --no-collect $team"
            failed="$failed $team"
            continue
        fi
        set_listed "$dir" "$team" "$team ${gpus:-docker/sky.yaml} $hours h $(date -u '+%Y-%m-%dT%H:%MZ')"
        if [ -s "$dir/keys/$team.pub" ] && ! add_keys "$team" "$dir/keys/$team.pub"; then
            say "$team: up, but its keys are NOT on it: $0 keys $team $dir/keys/$team.pub"
            nokeys="$nokeys $team"
        fi
    done
    if [ -n "$failed$nokeys" ]; then
        [ -z "$failed" ] || say "up: NOT launched:$failed"
        [ -z "$nokeys" ] || say "up: up, but without their keys:$nokeys"
        return 1
    fi
    say "next: $0 keys TEAM TEAM.pub, then $0 check, gpu-check and handout TEAM, for each team"
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

repository_url() {  # where the attendees clone the kit from: $FSDP_MINI_REPO, else pyproject's
    local url="${FSDP_MINI_REPO:-}"
    if [ -z "$url" ]; then
        url=$(sed -n 's/^Repository *= *"\([^"]*\)".*/\1/p' "$repo/pyproject.toml" | head -n 1)
    fi
    case "$url" in
        "" | *[!A-Za-z0-9._~:/?#@%+=,-]*) die "handout: the repository's address '$url' (FSDP_MINI_REPO) is not a plain URL" ;;
    esac
    echo "$url"
}

cmd_handout() {
    [ "$#" = 1 ] || die "handout: name one team, e.g. $0 handout team1"
    check_team "$1"
    local dir address token template out gpus url
    dir=$(workshop_dir)
    [ -s "$dir/tokens/$1" ] || die "handout: no token for $1 in $dir/tokens: launch it with $0 up $1"
    token=$(token_of "$dir" "$1")
    gpus=$(gpus_of "$dir" "$1")
    url=$(repository_url)
    address=$(sky_ status --ip "$1" | tail -n 1 | tr -d '[:space:]') ||
        die "handout: sky status --ip $1 failed (above): is the box up? A deleted box has no address: $0 up $1, then the handout"
    case "$address" in
        "" | *[!0-9A-Za-z.:-]*) die "handout: sky status --ip $1 gave no address ('$address'): is the box up?" ;;
    esac
    template="$repo/slides/handout.md"
    out="$dir/handouts/$1.md"
    (umask 077 && sed -e "s|<team>|$1|g" -e "s|<address>|$address|g" -e "s|<token>|$token|g" \
        -e "s|<gpus>|$gpus|g" -e "s|<repository>|$url|g" "$template" >"$out")
    say "$1: handout written to $out (it holds the team's token: hand it to that team only)"
}

cmd_check() {
    need_teams "$@"
    local dir bad="" gpus
    dir=$(workshop_dir)
    for team in "$@"; do
        gpus=$(gpus_of "$dir" "$team")
        say "$team: the box (attendee login, closed home, no credentials, containers kept off the host)"
        # Note: one argument, single-quoted here: $(id -un) runs on the box, as SkyPilot's user.
        if ! ssh "$team" 'sudo env CLUSTER_USER="$(id -un)" bash sky_workdir/docker/box_setup.sh check'; then
            bad="$bad $team"
        fi
        say "$team: the container ($gpus GPUs, NCCL, /dev/shm, memlock, ports, versions, JupyterLab)"
        if ! ssh "$team" docker exec "$CONTAINER" fsdp-mini doctor --gpus "$gpus" --url "http://127.0.0.1:$LAB_PORT"; then
            case "$bad " in *" $team "*) ;; *) bad="$bad $team" ;; esac
        fi
    done
    summary check "$bad" "read the FAIL lines above"
}

cmd_gpu_check() {
    need_teams "$@"
    local bad=""
    for team in "$@"; do
        say "$team: benchmarks/gpu_check.sh in fsdp-mini:gpu, from SkyPilot's copy of the repository"
        ssh "$team" 'cd sky_workdir && docker run --rm --gpus all --ipc=host --ulimit memlock=-1 -v "$PWD":/src:ro -w /src fsdp-mini:gpu bash benchmarks/gpu_check.sh' ||
            bad="$bad $team"
    done
    summary gpu-check "$bad" "read the lines starting === FAILED above"
}

cmd_status() {
    for team in "$@"; do check_team "$team"; done
    local teams="$*" dir code bad=""
    if [ "$#" = 0 ]; then
        dir=$(workshop_dir)
        teams=$(listed_teams "$dir" | tr '\n' ' ')
        [ -n "${teams// /}" ] || say "no team in the team list ($dir/teams): none launched by $0 up, or all deleted"
    fi
    sky_ status "$@" || bad=" (sky status)"
    for team in $teams; do
        code=$(ssh "$team" curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$LAB_PORT/api/status" || true)
        case "$code" in
            403) say "$team: JupyterLab answers on the box (403 without the token, as it should)" ;;
            *) say "$team: JupyterLab does not answer on the box (HTTP '${code:-none}'): sky logs $team"
               bad="$bad $team" ;;
        esac
    done
    summary status "$bad" "JupyterLab does not answer"
}

# What runs in the container to read the teams' verdicts (sent on stdin: no quoting through ssh):
# every progress file under ~/work (the labs write one beside each notebook's folder), one after
# the other; exit status 3 when there is none yet.
# shellcheck disable=SC2016  # expanded in the container, not here
PROGRESS_SCRIPT='cd ~/work || exit 4
[ -n "$(find . -name '"$PROGRESS_FILE"' -type f | head -n 1)" ] || exit 3
find . -name '"$PROGRESS_FILE"' -type f -exec cat {} +'

cmd_progress() {
    local html="" dir teams team rc tmp folder bad=""
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --html) [ "$#" -ge 2 ] || die "--html needs a file, e.g. --html progress.html"; html="$2"; shift 2 ;;
            --html=*) html="${1#--html=}"; shift ;;
            -*) die "progress: unknown option $1 (--html)" ;;
            *) break ;;
        esac
    done
    for team in "$@"; do check_team "$team"; done
    dir=$(workshop_dir)
    teams="$*"
    [ "$#" -gt 0 ] || teams=$(listed_teams "$dir" | tr '\n' ' ')
    [ -n "${teams// /}" ] || die "progress: name the teams (no team in the team list, $dir/teams)"
    set --
    for team in $teams; do
        folder="$dir/progress/$team"
        mkdir -p "$folder"
        tmp=$(mktemp "$folder/.fetch.XXXXXX")
        rc=0
        printf '%s\n' "$PROGRESS_SCRIPT" | ssh "$team" docker exec -i "$CONTAINER" sh -s >"$tmp" || rc=$?
        case "$rc" in
            0) mv -f "$tmp" "$folder/$PROGRESS_FILE" ;;
            3) mv -f "$tmp" "$folder/$PROGRESS_FILE"
               say "$team: no check has run on its box yet" ;;
            *) rm -f "$tmp"
               bad="$bad $team"
               if [ -f "$folder/$PROGRESS_FILE" ]; then
                   say "$team: its progress could not be read (exit status $rc): the page shows the copy of $(date -u -r "$folder/$PROGRESS_FILE" '+%H:%M UTC' 2>/dev/null || echo 'an earlier run')"
               else
                   say "$team: its progress could not be read (exit status $rc): is $CONTAINER running? (sky logs $team)"
                   continue
               fi ;;
        esac
        set -- "$@" "$folder"
    done
    if [ "$#" -gt 0 ]; then
        if command -v fsdp-mini >/dev/null 2>&1; then
            fsdp-mini progress "$@" ${html:+--html "$html"} || bad="$bad (fsdp-mini progress)"
        else
            say "no fsdp-mini here (pip install -e . in the repository); the teams' files: $dir/progress/TEAM/$PROGRESS_FILE"
            bad="$bad (fsdp-mini progress)"
        fi
    fi
    summary progress "$bad" "not shown, or an old copy"
}

cmd_restart() {
    [ "$#" = 1 ] || die "restart: name one team, e.g. $0 restart team1"
    check_team "$1"
    local dir token
    dir=$(workshop_dir)
    [ -s "$dir/tokens/$1" ] || die "restart: no token for $1 in $dir/tokens: launch it with $0 up $1"
    token=$(token_of "$dir" "$1")
    cd "$repo"
    # Note: SkyPilot cancels nothing without a job id or --all; docker/sky.yaml's run removes the
    # old container before it starts the new one. The work is on the volume, which stays.
    sky_ cancel -y --all "$1"
    JUPYTER_TOKEN="$token" sky_ exec -d "$1" docker/sky.yaml --env JUPYTER_TOKEN
    say "$1: JupyterLab started again with the team's token; then: $0 check $1"
}

# What runs in the container to pack the reports (sent on stdin: no quoting through ssh).
# shellcheck disable=SC2016  # expanded in the container, not here
REPORTS_SCRIPT='cd ~/work || exit 4
set -- assessment_report_*
[ -e "$1" ] || exit 3
tar -c -- "$@"'

keep() {  # tmp, folder, team, kind -> the copy kept: TEAM-KIND-<UTC time>.tar, and TEAM-KIND.tar
    local tmp="$1" out="$2" team="$3" kind="$4" stamp name n=1
    stamp=$(date -u '+%Y%m%dT%H%M%SZ')
    name="$out/$team-$kind-$stamp.tar"
    while [ -e "$name" ]; do n=$((n + 1)); name="$out/$team-$kind-$stamp-$n.tar"; done
    mv "$tmp" "$name"
    # Note: the latest under the plain name, replaced in one rename; the dated copies stay.
    ln -f "$name" "$out/.$team-$kind.tar.new" 2>/dev/null || cp -p "$name" "$out/.$team-$kind.tar.new"
    mv -f "$out/.$team-$kind.tar.new" "$out/$team-$kind.tar"
    echo "$name"
}

kept() {  # folder, team, kind -> a sentence on the last good copy, if there is one
    if [ -s "$1/$2-$3.tar" ]; then
        echo "; the last good copy is kept: $1/$2-$3.tar ($(date -u -r "$1/$2-$3.tar" '+%Y-%m-%d %H:%M UTC' 2>/dev/null || echo 'an earlier collect'))"
    fi
}

collect_one() {  # dir, team -> 0, or 1 when the work could not be copied
    local dir="$1" team="$2" out="$1/collected" rc=0 tmp name
    # Note: into a temporary file, renamed once it is whole: a failed copy never replaces a good one.
    tmp=$(mktemp "$out/.$team-reports.XXXXXX")
    printf '%s\n' "$REPORTS_SCRIPT" |
        ssh "$team" docker exec -i "$CONTAINER" sh -s >"$tmp" || rc=$?
    if [ "$rc" = 0 ] && tar -tf "$tmp" >/dev/null 2>&1; then
        name=$(keep "$tmp" "$out" "$team" reports)
        say "$team: $(tar -tf "$name" | wc -l | tr -d ' ') report files -> $name (and $out/$team-reports.tar)"
    else
        rm -f "$tmp"
        case "$rc" in
            3) say "$team: no assessment report in ~/work yet$(kept "$out" "$team" reports)" ;;
            *) say "$team: the reports could not be read (exit status $rc): is $CONTAINER running? (sky logs $team)$(kept "$out" "$team" reports)" ;;
        esac
    fi
    rc=0
    tmp=$(mktemp "$out/.$team-work.XXXXXX")
    ssh "$team" docker run --rm -v fsdp-mini-work:/home/learner/work fsdp-mini:gpu \
        tar -C /home/learner/work -c . >"$tmp" || rc=$?
    if [ "$rc" = 0 ] && tar -tf "$tmp" >/dev/null 2>&1; then
        name=$(keep "$tmp" "$out" "$team" work)
        say "$team: the work, $(tar -tf "$name" | wc -l | tr -d ' ') entries -> $name (and $out/$team-work.tar)"
        return 0
    fi
    rm -f "$tmp"
    say "$team: the work could not be copied (exit status $rc)$(kept "$out" "$team" work)"
    return 1
}

cmd_collect() {
    need_teams "$@"
    local dir bad=""
    dir=$(workshop_dir)
    for team in "$@"; do collect_one "$dir" "$team" || bad="$bad $team"; done
    summary collect "$bad" "their work is not copied"
}

cmd_down() {
    local collect=yes
    if [ "${1:-}" = --no-collect ]; then collect=no; shift; fi
    need_teams "$@"
    local dir left="" rc
    dir=$(workshop_dir)
    for team in "$@"; do
        if [ "$collect" = yes ] && ! collect_one "$dir" "$team"; then
            say "$team: NOT deleted, its work is not copied; copy it, or: $0 down --no-collect $team"
            left="$left $team"
            continue
        fi
        rc=0
        sky_ down -y "$team" || rc=$?
        if [ "$rc" != 0 ]; then
            say "$team: NOT deleted (sky down: exit status $rc), it may still bill: sky status $team, then $0 down --no-collect $team"
            left="$left $team"
            continue
        fi
        set_listed "$dir" "$team"
        say "$team: deleted"
    done
    if [ -n "$left" ]; then
        say "down: left up, still billing:$left"
        return 1
    fi
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
    progress) cmd_progress "$@" ;;
    restart) cmd_restart "$@" ;;
    collect) cmd_collect "$@" ;;
    down) cmd_down "$@" ;;
    -h | --help | help) usage ;;
    *) usage >&2; die "unknown command '$command'" ;;
esac
