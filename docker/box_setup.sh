#!/usr/bin/env bash
# A workshop box made safe to hand to attendees; run as root on the box (docker/sky.yaml's setup
# runs `setup` through sudo; docker/workshop.sh runs `add-key` and `check` over ssh).
#
#   box_setup.sh setup      the attendee login, the cluster user's home closed, the credentials
#                           SkyPilot copied deleted, the metadata service, the box's own ports
#                           and the private networks closed to containers, the power-off at the
#                           deadline; one line for each
#   box_setup.sh add-key    public keys on stdin (one a line, e.g. < team1.pub): each may only
#                           forward one port to JupyterLab, as the user attendee
#   box_setup.sh check      what `setup` ensures, one line each; exit status 1 if any is wrong
#   box_setup.sh boot       run at every start by the unit `setup` installs: what a reboot loses
#
# The attendees' login is the user `attendee`: no password, the shell nologin, in no group but
# its own (never docker, which is root on the box, nor sudo), and each of its keys limited by
# sshd's authorized_keys options to `ssh -N -L 8888:localhost:8888 attendee@<box>`: local
# forwarding to 127.0.0.1:8888 only, no remote forwarding (-R), no shell, no command, no
# terminal, no agent or X11. The cluster user (the one SkyPilot logs in as, with sudo and docker)
# keeps its home to itself (mode 0700): the credentials SkyPilot copied there, its cluster key
# included, are deleted below, but the home still holds SkyPilot's runtime and the jobs' logs
# (~/.sky, ~/sky_logs: JupyterLab's log, with the team's token in its URLs), the synced
# repository and whatever you copy there.
#
# The containers are kept off the metadata service, the box itself and the private networks by
# box_firewall.sh. A reboot (the cloud's maintenance, sky stop and start) loses iptables rules
# and a pending shutdown: box_boot.sh has `setup` install this script as a systemd service,
# fsdp-mini-box, that at every boot adds the rules again, deletes credentials copied again and
# powers the box off at the same deadline (at once if it has passed). Both are sourced here.
#
# CLUSTER_USER  the user SkyPilot runs as (default: the user who ran sudo, $SUDO_USER)
# BOX_HOURS     hours from now to the box powering itself off (`shutdown -h`), a safety net
#               if no one runs `docker/workshop.sh down`; 0: none (default 12)
# LAB_PORT      the box's port of JupyterLab, the only one the attendees may reach (8888)
# BOX_ROOT      tests only: a folder standing in for / (its etc/passwd, etc/group, home/...);
#               useradd and usermod then work there (--prefix), nothing outside it is changed
#               but through the commands iptables, shutdown and systemctl, which the tests
#               replace
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=box_firewall.sh source-path=SCRIPTDIR
. "$here/box_firewall.sh"
# shellcheck source=box_boot.sh source-path=SCRIPTDIR
. "$here/box_boot.sh"

ATTENDEE=attendee
# Note: the only remote forward (-R) these options permit is port 1 of the loopback, which no user
# but root can open: none. OpenSSH has no permitlisten="none" in authorized_keys (sshd refuses
# the whole key: "bad key options: invalid permission port"); permitlisten needs OpenSSH >= 7.8.
LISTEN_NONE="127.0.0.1:1"
PRIVILEGED_GROUPS="sudo admin wheel docker adm lxd root disk shadow"
# What SkyPilot may copy into the cluster user's home (its credential file mounts, per cloud, and
# the key it uses for the cluster's nodes), relative to that home.
CREDENTIALS=".aws/credentials .config/gcloud/credentials.db .config/gcloud/access_tokens.db
.config/gcloud/legacy_credentials .config/gcloud/application_default_credentials.json
.azure/msal_token_cache.json .azure/accessTokens.json .azure/service_principal_entries.json
.lambda_cloud/lambda_keys .runpod/config.toml .kube/config .oci .nebius/credentials.json
.config/vastai/vast_api_key .ssh/sky-cluster-key .ssh/sky-key"

die() { echo "box_setup: error: $*" >&2; exit 2; }
say() { echo "box_setup: $*"; }

root="${BOX_ROOT:-}"
prefix=()
if [ -n "$root" ]; then
    [ -d "$root/etc" ] || die "BOX_ROOT=$root has no etc/ folder: it stands in for / (tests only)"
    prefix=(--prefix "$root")
fi
lab_port="${LAB_PORT:-8888}"
case "$lab_port" in
    "" | *[!0-9]* | ??????*) die "LAB_PORT is '$lab_port': give a TCP port from 1 to 65535" ;;
esac
{ [ "$lab_port" -ge 1 ] && [ "$lab_port" -le 65535 ]; } ||
    die "LAB_PORT is '$lab_port': give a TCP port from 1 to 65535"

nologin=/usr/sbin/nologin
for shell in /usr/sbin/nologin /sbin/nologin; do
    if [ -x "$shell" ]; then nologin=$shell; break; fi
done

passwd_field() {  # user, field number (6 home, 7 shell, 3 uid): from the passwd file
    awk -F: -v u="$1" -v f="$2" '$1 == u { print $f; exit }' "$root/etc/passwd"
}
user_exists() { [ -n "$(passwd_field "$1" 1)" ]; }
groups_of() {  # the supplementary groups that list the user, space-separated
    awk -F: -v u="$1" '{ n = split($4, m, ","); for (i = 1; i <= n; i++) if (m[i] == u) print $1 }' \
        "$root/etc/group" | tr '\n' ' '
}
keys_file() { echo "$root$(passwd_field "$ATTENDEE" 6)/.ssh/authorized_keys"; }
key_options() {
    printf 'restrict,port-forwarding,permitopen="localhost:%s",permitopen="127.0.0.1:%s",permitlisten="%s",command="%s"' \
        "$lab_port" "$lab_port" "$LISTEN_NONE" "$nologin"
}

need_root() {
    [ "$(id -u)" = 0 ] || die "run it as root (sudo bash docker/box_setup.sh $1)"
}

cluster_user() {
    local user="${CLUSTER_USER:-${SUDO_USER:-}}"
    [ -n "$user" ] || die "CLUSTER_USER is not set and sudo set no SUDO_USER: name the user SkyPilot runs as"
    [ "$user" != root ] || die "CLUSTER_USER is root: name the user SkyPilot logs in as (ubuntu, gcpuser...)"
    [ "$user" != "$ATTENDEE" ] || die "CLUSTER_USER is $ATTENDEE, the attendees' login: name the user SkyPilot logs in as"
    user_exists "$user" || die "CLUSTER_USER $user is not a user of this box"
    echo "$user"
}

close_home() {  # the cluster user's home: its own, mode 0700
    local user="$1" home
    home="$root$(passwd_field "$user" 6)"
    [ -d "$home" ] || die "the home of $user ($home) is not a folder"
    chmod go-rwx "$home"
    say "home of $user closed to others: $(stat -c '%a %n' "$home")"
}

remove_credentials() {
    local user="$1" home removed=()
    home="$root$(passwd_field "$user" 6)"
    for path in $CREDENTIALS; do
        if [ -e "$home/$path" ] || [ -L "$home/$path" ]; then
            rm -rf -- "${home:?}/$path"
            removed+=("~$user/$path")
        fi
    done
    if [ "${#removed[@]}" -gt 0 ]; then
        say "credentials deleted from the box: ${removed[*]}"
    else
        say "credentials deleted from the box: none were there"
    fi
}

make_attendee() {
    if user_exists "$ATTENDEE"; then
        usermod "${prefix[@]}" --shell "$nologin" -G "" "$ATTENDEE"
    else
        useradd "${prefix[@]}" --create-home --user-group --shell "$nologin" "$ATTENDEE"
    fi
    # Note: '*' is no password and not a locked account ('!'): sshd without PAM refuses a locked
    # account even with a key.
    usermod "${prefix[@]}" --password '*' "$ATTENDEE"
    local home ssh_dir
    home="$root$(passwd_field "$ATTENDEE" 6)"
    ssh_dir="$home/.ssh"
    mkdir -p "$ssh_dir"
    # Note: root's, read-only for the attendee: sshd's StrictModes accepts root as the owner.
    chown 0:0 "$ssh_dir"
    chmod 0755 "$ssh_dir"
    touch "$ssh_dir/authorized_keys"
    chown 0:0 "$ssh_dir/authorized_keys"
    chmod 0644 "$ssh_dir/authorized_keys"
    local bad
    bad=$(privileged_groups_of "$ATTENDEE")
    [ -z "$bad" ] || die "$ATTENDEE is still in the groups $bad"
    say "login $ATTENDEE: shell $nologin, groups: none but its own; keys may only forward to 127.0.0.1:$lab_port, never from the box (-R)"
}

privileged_groups_of() {
    local found=""
    for g in $(groups_of "$1"); do
        case " $PRIVILEGED_GROUPS " in *" $g "*) found="$found $g" ;; esac
    done
    echo "${found# }"
}

setup() {
    need_root setup
    local user
    user=$(cluster_user)
    make_attendee
    close_home "$user"
    remove_credentials "$user"
    close_to_containers
    schedule_power_off
    install_boot "$user"
}

boot() {  # run by the unit at every start: what a reboot loses, again
    need_root boot
    local user
    user=$(cat "$(state_dir)/cluster_user" 2>/dev/null) || die "no $(state_dir)/cluster_user: run box_setup.sh setup first"
    CLUSTER_USER="$user"
    user=$(cluster_user)
    close_home "$user"
    remove_credentials "$user"
    close_to_containers
    power_off_at_deadline
}

add_key() {
    need_root add-key
    user_exists "$ATTENDEE" || die "no user $ATTENDEE on this box: run box_setup.sh setup first"
    local file options added=0 seen=0 line kind blob comment n=0
    file=$(keys_file)
    options=$(key_options)
    local tmp
    tmp=$(mktemp)
    cp "$file" "$tmp"
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line="${line%$'\r'}"
        case "$line" in "" | "#"*) continue ;; esac
        case "$line" in
            *"PRIVATE KEY"*) rm -f "$tmp"; die "line $n is a private key: send the .pub file, never the private key" ;;
        esac
        read -r kind blob comment <<<"$line"
        case "$kind" in
            ssh-ed25519 | ssh-rsa | ecdsa-sha2-nistp256 | ecdsa-sha2-nistp384 | ecdsa-sha2-nistp521 | \
                sk-ssh-ed25519@openssh.com | sk-ecdsa-sha2-nistp256@openssh.com) ;;
            *) rm -f "$tmp"; die "line $n is not a public key (it starts with '${kind:0:30}'): one key a line, as ssh-keygen writes it, with no options in front" ;;
        esac
        case "$blob" in
            "" | *[!A-Za-z0-9+/=]*) rm -f "$tmp"; die "line $n: the key's base64 part is malformed" ;;
        esac
        seen=$((seen + 1))
        if grep -qF "$options $kind $blob" "$tmp"; then continue; fi
        # Note: the same key with other (older) options is written again with these.
        grep -vF " $kind $blob" "$tmp" >"$tmp.keep" || true
        mv "$tmp.keep" "$tmp"
        printf '%s %s %s%s\n' "$options" "$kind" "$blob" "${comment:+ $comment}" >>"$tmp"
        added=$((added + 1))
    done
    if [ "$seen" = 0 ]; then
        rm -f "$tmp"
        die "no public key on stdin (e.g. box_setup.sh add-key < team1.pub)"
    fi
    cat "$tmp" >"$file"
    rm -f "$tmp"
    say "keys for $ATTENDEE: $added added, $(grep -c . "$file") in all, each limited to forwarding 127.0.0.1:$lab_port"
}

check() {
    need_root check
    local user bad=0 home mode groups
    user=$(cluster_user)
    if ! user_exists "$ATTENDEE"; then
        say "FAIL no user $ATTENDEE (run box_setup.sh setup)"
        exit 1
    fi
    if [ "$(passwd_field "$ATTENDEE" 7)" = "$nologin" ]; then
        say "ok   $ATTENDEE's shell is $nologin"
    else
        say "FAIL $ATTENDEE's shell is $(passwd_field "$ATTENDEE" 7), not $nologin"; bad=1
    fi
    groups=$(privileged_groups_of "$ATTENDEE")
    if [ -z "$groups" ]; then
        say "ok   $ATTENDEE is in none of: $PRIVILEGED_GROUPS"
    else
        say "FAIL $ATTENDEE is in $groups"; bad=1
    fi
    home="$root$(passwd_field "$user" 6)"
    mode=$(stat -c '%a' "$home")
    if [ $((8#$mode & 8#077)) = 0 ]; then
        say "ok   the home of $user is closed to others ($mode)"
    else
        say "FAIL the home of $user is open to others ($mode)"; bad=1
    fi
    local left=()
    for path in $CREDENTIALS; do
        if [ -e "$home/$path" ] || [ -L "$home/$path" ]; then left+=("~$user/$path"); fi
    done
    if [ "${#left[@]}" = 0 ]; then
        say "ok   no credentials in the home of $user"
    else
        say "FAIL credentials on the box: ${left[*]}"; bad=1
    fi
    local file options total unrestricted
    file=$(keys_file)
    options=$(key_options)
    total=$(grep -c . "$file" 2>/dev/null || true)
    unrestricted=$(grep . "$file" 2>/dev/null | grep -vcF "$options " || true)
    if [ "${unrestricted:-0}" = 0 ]; then
        say "ok   $ATTENDEE's keys: ${total:-0}, each limited to forwarding 127.0.0.1:$lab_port"
    else
        say "FAIL $ATTENDEE has $unrestricted key(s) without the tunnel-only options"; bad=1
    fi
    check_firewall || bad=1
    check_boot || bad=1
    exit "$bad"
}

case "${1:-}" in
    setup) setup ;;
    add-key) add_key ;;
    check) check ;;
    boot) boot ;;
    *) die "usage: box_setup.sh setup | add-key < keys.pub | check | boot (got '${1:-}')" ;;
esac
