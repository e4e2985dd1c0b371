#!/usr/bin/env bash
# shellcheck disable=SC2154  # root and here: set by box_setup.sh, which sources this file
# What a workshop box keeps across a reboot, sourced by box_setup.sh (its say, die, root and here).
# A reboot (the cloud's maintenance, sky stop and start) loses iptables rules and a pending
# shutdown: `setup` writes the cluster user and the deadline under /etc/fsdp-mini-box, copies the
# scripts outside the synced folder and enables the unit fsdp-mini-box.service, which runs
# `box_setup.sh boot` at every start.
#
#   schedule_power_off     BOX_HOURS from now: the deadline written down, shutdown -h scheduled
#   power_off_at_deadline  at boot: the same deadline again (at once if it has passed)
#   install_boot           the scripts copied and the unit enabled
#   check_boot             one line each for the unit and the deadline; status 1 if one is wrong

BOOT_UNIT=fsdp-mini-box.service
state_dir() { echo "$root/etc/fsdp-mini-box"; }
lib_dir() { echo "$root/usr/local/lib/fsdp-mini-box"; }

schedule_power_off() {  # from BOX_HOURS: the deadline written down (epoch seconds, or none)
    local hours="${BOX_HOURS:-12}"
    case "$hours" in
        "" | *[!0-9]* | ???*) die "BOX_HOURS is '$hours': give whole hours from 0 to 72 (0: no power-off)" ;;
    esac
    [ "$hours" -le 72 ] || die "BOX_HOURS is '$hours': give whole hours from 0 to 72 (0: no power-off)"
    mkdir -p "$(state_dir)"
    if [ "$hours" = 0 ]; then
        echo none >"$(state_dir)/deadline"
        shutdown -c 2>/dev/null || true
        say "power-off: none (BOX_HOURS=0): delete the box with docker/workshop.sh down"
        return
    fi
    echo "$(($(date +%s) + hours * 3600))" >"$(state_dir)/deadline"
    shutdown -h "+$((hours * 60))" "fsdp-mini workshop box: its deadline (BOX_HOURS=$hours)"
    say "power-off in $hours h ($(date -u -d "+$hours hours" '+%Y-%m-%d %H:%M UTC' 2>/dev/null || echo "+$hours h")): docker/workshop.sh down deletes it before"
}

power_off_at_deadline() {  # at boot: the same deadline, at once if it has passed
    local deadline left
    deadline=$(cat "$(state_dir)/deadline" 2>/dev/null || echo missing)
    case "$deadline" in
        none) say "power-off: none (BOX_HOURS=0 at setup)"; return ;;
        "" | *[!0-9]*) shutdown -h +60 "fsdp-mini workshop box: no deadline on record ($(state_dir)/deadline)"
            say "power-off in 1 h: no deadline on record ($(state_dir)/deadline is '$deadline')"; return ;;
    esac
    left=$(( (deadline - $(date +%s) + 59) / 60 ))
    if [ "$left" -le 0 ]; then
        say "power-off now: the deadline $(date -u -d "@$deadline" '+%Y-%m-%d %H:%M UTC') has passed"
        shutdown -h now "fsdp-mini workshop box: its deadline has passed"
    else
        shutdown -h "+$left" "fsdp-mini workshop box: its deadline (kept across a reboot)"
        say "power-off in $left min, at the deadline set by setup"
    fi
}

install_boot() {  # this script and its firewall, kept outside the synced folder; the unit enabled
    local lib unit
    lib=$(lib_dir)
    mkdir -p "$lib" "$root/etc/systemd/system"
    install -m 0755 "$here/box_setup.sh" "$lib/box_setup.sh"
    install -m 0644 "$here/box_firewall.sh" "$lib/box_firewall.sh"
    install -m 0644 "$here/box_boot.sh" "$lib/box_boot.sh"
    echo "$1" >"$(state_dir)/cluster_user"
    unit="$root/etc/systemd/system/$BOOT_UNIT"
    cat >"$unit" <<UNIT
[Unit]
Description=fsdp-mini workshop box: the containers' rules, credentials and the deadline again at boot
After=docker.service
Requires=docker.service

[Service]
Type=oneshot
ExecStart=/bin/bash /usr/local/lib/fsdp-mini-box/box_setup.sh boot

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
    systemctl enable "$BOOT_UNIT" >/dev/null
    say "at every boot ($BOOT_UNIT, enabled): the rules, the credentials and the same deadline again"
}

check_boot() {  # the unit enabled and a deadline on record
    local ok=0 deadline
    if systemctl is-enabled --quiet "$BOOT_UNIT" 2>/dev/null && [ -f "$(lib_dir)/box_firewall.sh" ] && [ -f "$(lib_dir)/box_boot.sh" ]; then
        say "ok   $BOOT_UNIT is enabled: a reboot puts the rules and the deadline back"
    else
        say "FAIL $BOOT_UNIT is not enabled: a reboot would open the box to its containers; run box_setup.sh setup"; ok=1
    fi
    deadline=$(cat "$(state_dir)/deadline" 2>/dev/null || echo missing)
    case "$deadline" in
        none) say "ok   power-off: none on record (BOX_HOURS=0): only workshop.sh down stops the bill" ;;
        "" | *[!0-9]*) say "FAIL no power-off deadline on record ($(state_dir)/deadline): run box_setup.sh setup"; ok=1 ;;
        *) say "ok   power-off deadline on record: $(date -u -d "@$deadline" '+%Y-%m-%d %H:%M UTC')" ;;
    esac
    return "$ok"
}
