#!/usr/bin/env bash
# The firewall of a workshop box, sourced by box_setup.sh (its say and die): what the containers
# (JupyterLab, where an attendee runs any code) may not reach. The clouds' metadata service (an
# IAM role on AWS), every new connection from a container to the box's own addresses (sshd,
# SkyPilot's Ray on 6380 and 10001, ...), and every new connection from a container to a private
# network (the cloud's VPC: the account's other boxes, their sshd and Ray), but for DNS (port 53,
# the VPC's resolver), are refused by iptables; the replies to the box's own connections
# (JupyterLab's published port) pass, and the internet stays open.
#
#   close_to_containers   adds the rules that are missing (idempotent: a relaunch, a reboot)
#   check_firewall        one line per rule, ok or FAIL; status 1 if any is missing

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

check_firewall() {
    local ok=0 open
    if iptables -C DOCKER-USER -d "$METADATA_V4" -j REJECT 2>/dev/null; then
        say "ok   the metadata service ${METADATA_V4%/32} is closed to containers"
    else
        say "FAIL the containers can reach the metadata service ${METADATA_V4%/32}"; ok=1
    fi
    if ! has_ipv6; then
        say "ok   no IPv6 in Docker's rules (ip6tables has no DOCKER-USER): nothing more to close"
    elif ip6tables -C DOCKER-USER -d "$METADATA_V6" -j REJECT 2>/dev/null; then
        say "ok   the metadata service ${METADATA_V6%/128} (IPv6) is closed to containers"
    else
        say "FAIL the containers can reach the metadata service ${METADATA_V6%/128} (IPv6)"; ok=1
    fi
    local open=""
    host_rules iptables -C || open="IPv4"
    if has_ipv6 && ! host_rules ip6tables -C; then open="${open:+$open, }IPv6"; fi
    if [ -z "$open" ]; then
        say "ok   the containers cannot open connections to the box itself ($CONTAINER_IFACES)"
    else
        say "FAIL the containers can open connections to the box itself ($open: sshd, SkyPilot's Ray); run box_setup.sh setup"; ok=1
    fi
    open=""
    { private_rules iptables -C "$PRIVATE_V4" && dns_rules iptables -C "$PRIVATE_V4"; } || open="IPv4"
    if has_ipv6 && ! { private_rules ip6tables -C "$PRIVATE_V6" && dns_rules ip6tables -C "$PRIVATE_V6"; }; then
        open="${open:+$open, }IPv6"
    fi
    if [ -z "$open" ]; then
        say "ok   the containers cannot open connections to the private networks (the account's other boxes), DNS excepted"
    else
        say "FAIL the containers can open connections to the private networks ($open: the account's other boxes, their sshd and Ray), or their DNS is refused; run box_setup.sh setup"; ok=1
    fi
    return "$ok"
}
