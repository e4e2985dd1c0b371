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
# The containers (JupyterLab, where an attendee runs any code) are kept off the box itself: the
# clouds' metadata service (an IAM role on AWS) and every new connection from a container to the
# box's own addresses (sshd, SkyPilot's Ray on 6380 and 10001, ...) are refused by iptables; the
# replies to the box's own connections (JupyterLab's published port) pass. So is every new
# connection from a container to a private network (the cloud's VPC: the account's other boxes,
# their sshd and Ray), but for DNS (port 53, the VPC's resolver); the internet stays open.
#
# CLUSTER_USER  the user SkyPilot runs as (default: the user who ran sudo, $SUDO_USER)
# BOX_HOURS     hours from now to the box powering itself off (`shutdown -h`), a safety net
#               if no one runs `docker/workshop.sh down`; 0: none (default 12)
# LAB_PORT      the box's port of JupyterLab, the only one the attendees may reach (8888)
# BOX_ROOT      tests only: a folder standing in for / (its etc/passwd, etc/group, home/...);
#               useradd and usermod then work there (--prefix), nothing outside it is changed
#               but through the commands iptables and shutdown, which the tests replace
set -euo pipefail

ATTENDEE=attendee
METADATA_V4=169.254.169.254/32  # the clouds' instance metadata service (AWS, Google, Azure...)
METADATA_V6=fd00:ec2::254/128   # AWS's, on IPv6
# Docker's networks on the box: the default bridge (docker/sky.yaml's container) and compose's
# (br-<id>); from them, only replies to the box's own connections reach the box.
CONTAINER_IFACES="docker0 br-+"
HOST_RULE="-m conntrack ! --ctstate ESTABLISHED,RELATED -j REJECT"
# The private networks (RFC 1918, the carrier-grade NAT range some clouds use, IPv6's unique local
# addresses): where the account's other boxes live. A container may open no connection there.
PRIVATE_V4="10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10"
PRIVATE_V6="fc00::/7"
PRIVATE_RULE="-m conntrack --ctstate NEW -j REJECT"
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

has_ipv6() { ip6tables -n -L DOCKER-USER >/dev/null 2>&1; }  # Docker with IPv6 rules

host_rules() {  # tool, action (-C to check, -I to add) for each of Docker's networks
    local tool="$1" action="$2" ifc
    for ifc in $CONTAINER_IFACES; do
        # shellcheck disable=SC2086  # HOST_RULE is words
        "$tool" "$action" INPUT -i "$ifc" $HOST_RULE 2>/dev/null || return 1
    done
}

private_rules() {  # tool, action (-C, -I), networks: new connections to them refused
    local tool="$1" action="$2" nets="$3" ifc net
    for ifc in $CONTAINER_IFACES; do
        for net in $nets; do
            # shellcheck disable=SC2086  # PRIVATE_RULE is words
            "$tool" "$action" DOCKER-USER -i "$ifc" -d "$net" $PRIVATE_RULE 2>/dev/null || return 1
        done
    done
}

dns_rules() {  # tool, action (-C, -I, -D), networks: DNS to them goes on to Docker's own rules
    local tool="$1" action="$2" nets="$3" ifc net proto
    for ifc in $CONTAINER_IFACES; do
        for net in $nets; do
            for proto in udp tcp; do
                "$tool" "$action" DOCKER-USER -i "$ifc" -d "$net" -p "$proto" --dport 53 -j RETURN \
                    2>/dev/null || [ "$action" = -D ] || return 1
            done
        done
    done
}

close_private_networks() {  # tool, networks; idempotent, and DNS always above the refusal
    local tool="$1" nets="$2" ifc net
    for ifc in $CONTAINER_IFACES; do
        for net in $nets; do
            # shellcheck disable=SC2086  # PRIVATE_RULE is words
            "$tool" -C DOCKER-USER -i "$ifc" -d "$net" $PRIVATE_RULE 2>/dev/null ||
                "$tool" -I DOCKER-USER -i "$ifc" -d "$net" $PRIVATE_RULE
        done
    done
    # Note: rules are inserted at the top; DNS's are taken out and put back above the refusals.
    dns_rules "$tool" -D "$nets"
    dns_rules "$tool" -I "$nets"
}

close_to_containers() {  # the metadata service (DOCKER-USER: forwarded) and the box (INPUT)
    if ! iptables -n -L DOCKER-USER >/dev/null 2>&1; then
        die "no iptables chain DOCKER-USER: is Docker running? (sudo systemctl start docker, then launch again); the containers could reach the metadata service"
    fi
    iptables -C DOCKER-USER -d "$METADATA_V4" -j REJECT 2>/dev/null ||
        iptables -I DOCKER-USER -d "$METADATA_V4" -j REJECT
    local ifc
    for ifc in $CONTAINER_IFACES; do
        # shellcheck disable=SC2086  # HOST_RULE is words
        iptables -C INPUT -i "$ifc" $HOST_RULE 2>/dev/null || iptables -I INPUT -i "$ifc" $HOST_RULE
    done
    close_private_networks iptables "$PRIVATE_V4"
    local v6=""
    if has_ipv6; then
        ip6tables -C DOCKER-USER -d "$METADATA_V6" -j REJECT 2>/dev/null ||
            ip6tables -I DOCKER-USER -d "$METADATA_V6" -j REJECT
        for ifc in $CONTAINER_IFACES; do
            # shellcheck disable=SC2086  # HOST_RULE is words
            ip6tables -C INPUT -i "$ifc" $HOST_RULE 2>/dev/null || ip6tables -I INPUT -i "$ifc" $HOST_RULE
        done
        close_private_networks ip6tables "$PRIVATE_V6"
        v6=" and ${METADATA_V6%/128}"
    fi
    say "closed to containers (iptables${v6:+, ip6tables}): the metadata service ${METADATA_V4%/32}$v6, new connections to the box itself ($CONTAINER_IFACES) and to the private networks ($PRIVATE_V4${v6:+ $PRIVATE_V6}; DNS excepted)"
}

schedule_power_off() {
    local hours="${BOX_HOURS:-12}"
    case "$hours" in
        "" | *[!0-9]* | ???*) die "BOX_HOURS is '$hours': give whole hours from 0 to 72 (0: no power-off)" ;;
    esac
    [ "$hours" -le 72 ] || die "BOX_HOURS is '$hours': give whole hours from 0 to 72 (0: no power-off)"
    if [ "$hours" = 0 ]; then
        shutdown -c 2>/dev/null || true
        say "power-off: none (BOX_HOURS=0): delete the box with docker/workshop.sh down"
        return
    fi
    shutdown -h "+$((hours * 60))" "fsdp-mini workshop box: its deadline (BOX_HOURS=$hours)"
    say "power-off in $hours h ($(date -u -d "+$hours hours" '+%Y-%m-%d %H:%M UTC' 2>/dev/null || echo "+$hours h")): docker/workshop.sh down deletes it before"
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
    if iptables -C DOCKER-USER -d "$METADATA_V4" -j REJECT 2>/dev/null; then
        say "ok   the metadata service ${METADATA_V4%/32} is closed to containers"
    else
        say "FAIL the containers can reach the metadata service ${METADATA_V4%/32}"; bad=1
    fi
    if ! has_ipv6; then
        say "ok   no IPv6 in Docker's rules (ip6tables has no DOCKER-USER): nothing more to close"
    elif ip6tables -C DOCKER-USER -d "$METADATA_V6" -j REJECT 2>/dev/null; then
        say "ok   the metadata service ${METADATA_V6%/128} (IPv6) is closed to containers"
    else
        say "FAIL the containers can reach the metadata service ${METADATA_V6%/128} (IPv6)"; bad=1
    fi
    local open=""
    host_rules iptables -C || open="IPv4"
    if has_ipv6 && ! host_rules ip6tables -C; then open="${open:+$open, }IPv6"; fi
    if [ -z "$open" ]; then
        say "ok   the containers cannot open connections to the box itself ($CONTAINER_IFACES)"
    else
        say "FAIL the containers can open connections to the box itself ($open: sshd, SkyPilot's Ray); run box_setup.sh setup"; bad=1
    fi
    open=""
    { private_rules iptables -C "$PRIVATE_V4" && dns_rules iptables -C "$PRIVATE_V4"; } || open="IPv4"
    if has_ipv6 && ! { private_rules ip6tables -C "$PRIVATE_V6" && dns_rules ip6tables -C "$PRIVATE_V6"; }; then
        open="${open:+$open, }IPv6"
    fi
    if [ -z "$open" ]; then
        say "ok   the containers cannot open connections to the private networks (the account's other boxes), DNS excepted"
    else
        say "FAIL the containers can open connections to the private networks ($open: the account's other boxes, their sshd and Ray), or their DNS is refused; run box_setup.sh setup"; bad=1
    fi
    exit "$bad"
}

case "${1:-}" in
    setup) setup ;;
    add-key) add_key ;;
    check) check ;;
    *) die "usage: box_setup.sh setup | add-key < keys.pub | check (got '${1:-}')" ;;
esac
