"""Safe workshop boxes (issue 28, item 1): the attendees' login, the cluster user's home, the
credentials, and what SkyPilot copies to a box.

- docker/box_setup.sh on a stand-in box: a folder standing in for ``/`` with its own etc/passwd,
  etc/group and homes, where ``useradd --prefix`` makes the users (root only: CI runs as root);
  ``iptables`` and ``shutdown`` are stand-ins that record their arguments. Then a process with
  the attendee's uid and gid (and no other group) tries to read the cluster user's home: the
  kernel refuses, as it would on the box.
- docker/sky-config.yaml: NO_UPLOAD for every cloud that has the option (SkyPilot's own schema and
  loader check it where SkyPilot is installed: a ``sky`` command on PATH).
- The synced folder: SkyPilot copies docker/sky.yaml's workdir with ``rsync --filter='dir-merge,-
  .skyignore'`` (sky/utils/command_runner.py, 0.14.1). The repository is walked here with those
  rules (reimplemented, and checked against rsync itself and SkyPilot's own
  ``storage_utils.get_excluded_files`` where they are installed): no token, team list, key or
  collected tar is ever copied, wherever it was written.
"""

from __future__ import annotations

import fnmatch
import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOX_SETUP = ROOT / "docker" / "box_setup.sh"
SKY_CONFIG = ROOT / "docker" / "sky-config.yaml"
SKYIGNORE = ROOT / ".skyignore"
SECRET = "sky-cluster-key: the private key of all the instructor's clusters"

# Stand-ins: iptables remembers the rules it was given (-C answers from them), shutdown records.
IPTABLES = """#!/bin/sh
echo "$(basename "$0") $*" >> "$BOX_CALLS"
case "$1" in
  -n) exit 0 ;;
  -C) shift; grep -qxF -- "$*" "$BOX_RULES.$(basename "$0")" 2>/dev/null; exit $? ;;
  -I) shift; printf '%s\n' "$*" | cat - "$BOX_RULES.$(basename "$0")" 2>/dev/null > "$BOX_RULES.tmp"
      mv "$BOX_RULES.tmp" "$BOX_RULES.$(basename "$0")" ;;
  -D) shift; grep -qxF -- "$*" "$BOX_RULES.$(basename "$0")" 2>/dev/null || exit 1
      grep -vxF -- "$*" "$BOX_RULES.$(basename "$0")" > "$BOX_RULES.tmp"
      mv "$BOX_RULES.tmp" "$BOX_RULES.$(basename "$0")" ;;
esac
"""
SHUTDOWN = """#!/bin/sh
echo "shutdown $*" >> "$BOX_CALLS"
"""
# systemctl remembers the units enabled (is-enabled answers from them), as a reboot keeps them.
SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$BOX_CALLS"
case "$1" in
  enable) echo "$2" >> "$BOX_RULES.units" ;;
  is-enabled) grep -qxF -- "$3" "$BOX_RULES.units" 2>/dev/null; exit $? ;;
esac
"""


@pytest.fixture
def box():
    """A stand-in box: its root folder (world-readable, so that another uid can walk to the
    homes), the cluster user ubuntu (in sudo and docker, as on SkyPilot's images) with what
    SkyPilot leaves in its home, and the stand-in commands."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the stand-in box's users are made with useradd --prefix")
    if shutil.which("useradd") is None or shutil.which("usermod") is None:
        pytest.skip("useradd/usermod (Debian's passwd package) are not installed")
    root = Path(tempfile.mkdtemp(prefix="fsdp-mini-box-", dir="/tmp"))
    try:
        root.chmod(0o755)
        (root / "etc").mkdir()
        (root / "home").mkdir()
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        (root / "etc" / "group").write_text("root:x:0:\nsudo:x:27:\ndocker:x:999:\n")
        (root / "etc" / "shadow").write_text("root:*:19000:0:99999:7:::\n")
        (root / "etc" / "gshadow").write_text("root:*::\nsudo:*::\ndocker:*::\n")
        (root / "etc" / "shadow").chmod(0o600)
        made = subprocess.run(["useradd", "--prefix", str(root), "--create-home", "--user-group",
                               "--groups", "sudo,docker", "--shell", "/bin/bash", "ubuntu"],
                              capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        home = root / "home" / "ubuntu"
        home.chmod(0o755)  # Note: Ubuntu before 21.04, and useradd without HOME_MODE
        for path, text in ((".ssh/sky-cluster-key", SECRET), (".ssh/authorized_keys", "ssh-ed25519 AAAA sky"),
                           (".aws/credentials", "[default]\naws_secret_access_key = x\n"),
                           (".lambda_cloud/lambda_keys", "api_key = x\n"),
                           (".config/gcloud/credentials.db", "x"), ("notes.txt", "the instructor's")):
            (home / path).parent.mkdir(parents=True, exist_ok=True)
            (home / path).write_text(text)
        uid = int(_passwd(root, "ubuntu")[2])
        for p in [home, *home.rglob("*")]:
            os.chown(p, uid, uid)
        bin_dir = root / "stand-in-bin"
        bin_dir.mkdir()
        for name, text in (("iptables", IPTABLES), ("ip6tables", IPTABLES), ("shutdown", SHUTDOWN),
                           ("systemctl", SYSTEMCTL)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _passwd(root: Path, user: str) -> list[str]:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        if line.split(":")[0] == user:
            return line.split(":")
    raise AssertionError(f"no user {user} in the stand-in box")


def _groups_of(root: Path, user: str) -> list[str]:
    return [line.split(":")[0] for line in (root / "etc" / "group").read_text().splitlines()
            if user in line.split(":")[3].split(",")]


def _setup(root: Path, *args: str, stdin: str | None = None, script: Path = None,
           **env) -> subprocess.CompletedProcess:
    run_env = {**os.environ, "BOX_ROOT": str(root), "CLUSTER_USER": "ubuntu",
               "PATH": f"{root / 'stand-in-bin'}{os.pathsep}{os.environ['PATH']}",
               "BOX_CALLS": str(root / "calls"), "BOX_RULES": str(root / "rules"), **env}
    return subprocess.run(["bash", str(script or BOX_SETUP), *args], env=run_env, input=stdin,
                          capture_output=True, text=True, timeout=60)


def _as_attendee(root: Path, script: str) -> subprocess.CompletedProcess:
    """A shell script run with the attendee's uid and gid and no other group, as its login would
    (/bin/sh: the kit's virtualenv may be closed to other users)."""
    fields = _passwd(root, "attendee")
    return subprocess.run(["/bin/sh", "-c", script], user=int(fields[2]),
                          group=int(fields[3]), extra_groups=[], capture_output=True, text=True,
                          timeout=30, cwd="/")


def test_the_attendee_login_cannot_read_the_cluster_users_home(box):
    home = box / "home" / "ubuntu"
    done = _setup(box, "setup", BOX_HOURS="5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("box_setup: ") for line in lines), lines
    attendee = _passwd(box, "attendee")
    assert attendee[6] in ("/usr/sbin/nologin", "/sbin/nologin"), attendee
    assert _groups_of(box, "attendee") == [], "the attendee is in no group but its own"
    assert _groups_of(box, "ubuntu") == ["sudo", "docker"]
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    # The kernel's word, not the mode bits': a process of the attendee's uid.
    own = box / "home" / "attendee" / ".ssh" / "authorized_keys"
    probe = _as_attendee(box, f"""
ls '{home}' >/dev/null 2>&1 && echo READ home || echo refused home
for f in .ssh/authorized_keys notes.txt; do
    cat '{home}'/$f >/dev/null 2>&1 && echo READ $f || echo refused $f
done
[ -r '{own}' ] && echo own-readable
[ -w '{own}' ] && echo own-writable
true
""")
    assert probe.returncode == 0, probe.stderr
    assert "READ" not in probe.stdout, probe.stdout
    assert probe.stdout.count("refused") == 3
    assert "own-readable" in probe.stdout and "own-writable" not in probe.stdout, \
        "its keys are readable to sshd's checks, not writable"
    # What SkyPilot copied is gone; the instructor's own files are not touched.
    for path in (".ssh/sky-cluster-key", ".aws/credentials", ".lambda_cloud/lambda_keys",
                 ".config/gcloud/credentials.db"):
        assert not (home / path).exists(), path
    assert (home / "notes.txt").exists() and (home / ".ssh" / "authorized_keys").exists()
    calls = (box / "calls").read_text().splitlines()
    assert "iptables -I DOCKER-USER -d 169.254.169.254/32 -j REJECT" in calls
    assert "ip6tables -I DOCKER-USER -d fd00:ec2::254/128 -j REJECT" in calls
    for tool in ("iptables", "ip6tables"):
        for ifc in ("docker0", "br-+"):
            # The containers' new connections to the box itself (sshd, Ray's 6380 and 10001):
            # refused; the replies to the box's own connections (the published port) pass.
            assert (f"{tool} -I INPUT -i {ifc} -m conntrack ! --ctstate ESTABLISHED,RELATED "
                    "-j REJECT") in calls, (tool, ifc)
    assert "shutdown -h +300 fsdp-mini workshop box: its deadline (BOX_HOURS=5)" in calls
    # Run again (a relaunch): the same state, no rule added twice.
    assert _setup(box, "setup", BOX_HOURS="5").returncode == 0
    assert (box / "rules.iptables").read_text().count("169.254.169.254") == 1
    assert (box / "rules.iptables").read_text().count("INPUT -i docker0 ") == 1
    for tool, nets in PRIVATE.items():
        rules = (box / f"rules.{tool}").read_text().splitlines()
        assert len(rules) == len(set(rules)), f"{tool}: a rule added twice by the relaunch"
        _assert_private_networks_closed(rules, tool, nets)
    check = _setup(box, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("box_setup: ok ") == 11, check.stdout
    assert "ok   the containers cannot open connections to the private networks" in check.stdout
    assert "ok   the metadata service fd00:ec2::254 (IPv6) is closed to containers" in check.stdout
    assert "ok   the containers cannot open connections to the box itself" in check.stdout


PRIVATE = {"iptables": ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"),
           "ip6tables": ("fc00::/7",)}


def _assert_private_networks_closed(rules, tool, nets):
    """In DOCKER-USER's order (first line first, as the stand-in inserts at the top): for each of
    Docker's networks and each private network, DNS goes on (RETURN) before new connections are
    refused, so a container still resolves names through the network's resolver."""
    for ifc in ("docker0", "br-+"):
        for net in nets:
            refuse = f"DOCKER-USER -i {ifc} -d {net} -m conntrack --ctstate NEW -j REJECT"
            assert refuse in rules, (tool, refuse)
            for proto in ("udp", "tcp"):
                dns = f"DOCKER-USER -i {ifc} -d {net} -p {proto} --dport 53 -j RETURN"
                assert dns in rules and rules.index(dns) < rules.index(refuse), (tool, dns, rules)


def test_private_networks_closed_to_containers_and_dns_stays_above(box):
    """The account's other boxes (private addresses) are closed to the containers; a relaunch
    after a refusal was lost puts it back without burying DNS below it."""
    assert _setup(box, "setup").returncode == 0
    rules_file = box / "rules.iptables"
    kept = rules_file.read_text().splitlines()
    lost = "DOCKER-USER -i docker0 -d 10.0.0.0/8 -m conntrack --ctstate NEW -j REJECT"
    rules_file.write_text("".join(line + "\n" for line in kept if line != lost))
    check = _setup(box, "check")
    assert check.returncode == 1 and "FAIL the containers can open connections to the private " \
        "networks (IPv4" in check.stdout, check.stdout
    assert _setup(box, "setup").returncode == 0
    for tool, nets in PRIVATE.items():
        _assert_private_networks_closed((box / f"rules.{tool}").read_text().splitlines(), tool, nets)
    assert _setup(box, "check").returncode == 0


def _reboot(box: Path, hours_later: float = 0) -> subprocess.CompletedProcess:
    """A reboot: iptables' rules and the pending shutdown are gone, files and enabled units stay;
    then what systemd runs at boot, the unit's own ExecStart (the installed copy, under BOX_ROOT),
    with the clock `hours_later` than now (faketime-free: the deadline on record moved back)."""
    for tool in ("iptables", "ip6tables"):
        (box / f"rules.{tool}").unlink(missing_ok=True)
    (box / "calls").write_text("")
    deadline = box / "etc" / "fsdp-mini-box" / "deadline"
    if hours_later and deadline.read_text().strip().isdigit():
        deadline.write_text(f"{int(deadline.read_text()) - int(hours_later * 3600)}\n")
    unit = (box / "etc" / "systemd" / "system" / "fsdp-mini-box.service").read_text()
    assert "fsdp-mini-box.service" in (box / "rules.units").read_text(), "the unit is not enabled"
    command = re.search(r"^ExecStart=(.*)$", unit, re.M)[1].split()
    assert command[:2] == ["/bin/bash", "/usr/local/lib/fsdp-mini-box/box_setup.sh"], command
    installed = box / command[1].lstrip("/")
    return _setup(box, command[2], script=installed)


def test_a_reboot_puts_the_rules_the_credentials_and_the_same_deadline_back(box):
    """Rules and a pending shutdown live in the kernel: after a reboot the unit adds the rules
    again from the installed copy (not the synced folder), deletes credentials copied again, and
    powers off at the deadline setup set: the time left, or at once when it has passed."""
    assert _setup(box, "setup", BOX_HOURS="5").returncode == 0
    assert "systemctl enable fsdp-mini-box.service" in (box / "calls").read_text()
    home = box / "home" / "ubuntu"
    (home / ".aws").mkdir(exist_ok=True)
    (home / ".aws" / "credentials").write_text("copied again by a restart")
    done = _reboot(box, hours_later=2)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (home / ".aws" / "credentials").exists()
    calls = (box / "calls").read_text().splitlines()
    assert "iptables -I DOCKER-USER -d 169.254.169.254/32 -j REJECT" in calls
    for tool, nets in PRIVATE.items():
        _assert_private_networks_closed((box / f"rules.{tool}").read_text().splitlines(), tool, nets)
    (shutdown,) = [c for c in calls if c.startswith("shutdown -h")]
    minutes = int(re.match(r"shutdown -h \+(\d+) ", shutdown)[1])
    assert 178 <= minutes <= 181, f"3 h were left of 5, not {minutes} min: {shutdown}"
    assert _setup(box, "check").returncode == 0
    # Past the deadline (down was forgotten, the box came back): off at once.
    done = _reboot(box, hours_later=4)
    assert done.returncode == 0, done.stderr
    assert any(c.startswith("shutdown -h now") for c in (box / "calls").read_text().splitlines())


def test_check_fails_without_the_boot_unit_or_a_deadline(box):
    assert _setup(box, "setup", BOX_HOURS="0").returncode == 0
    check = _setup(box, "check")
    assert check.returncode == 0 and "ok   power-off: none on record (BOX_HOURS=0)" in check.stdout
    (box / "rules.units").write_text("")
    check = _setup(box, "check")
    assert check.returncode == 1 and "FAIL fsdp-mini-box.service is not enabled" in check.stdout
    assert _setup(box, "setup", BOX_HOURS="3").returncode == 0
    (box / "etc" / "fsdp-mini-box" / "deadline").unlink()
    check = _setup(box, "check")
    assert check.returncode == 1 and "FAIL no power-off deadline on record" in check.stdout


def test_check_fails_when_a_rule_is_missing(box):
    """Each of the rules is checked: the IPv6 metadata rule and the box's own ports too."""
    assert _setup(box, "setup").returncode == 0
    for tool, gone, message in (
            ("ip6tables", "fd00:ec2::254", "can reach the metadata service fd00:ec2::254 (IPv6)"),
            ("iptables", "INPUT -i br-+", "can open connections to the box itself (IPv4"),
            ("ip6tables", "INPUT -i docker0", "can open connections to the box itself (IPv6"),
            ("ip6tables", "-d fc00::/7 -p udp", "can open connections to the private networks (IPv6"),
            ("iptables", "-d 192.168.0.0/16 -m conntrack", "can open connections to the private networks (IPv4")):
        rules = box / f"rules.{tool}"
        kept = rules.read_text()
        rules.write_text("".join(line + "\n" for line in kept.splitlines() if gone not in line))
        check = _setup(box, "check")
        assert check.returncode == 1 and f"FAIL the containers {message}" in check.stdout, \
            (tool, gone, check.stdout)
        rules.write_text(kept)
    assert _setup(box, "check").returncode == 0


def test_before_the_setup_the_same_box_is_open(box):
    """The stand-in box is a faithful one: without box_setup.sh another user reads the home."""
    made = subprocess.run(["useradd", "--prefix", str(box), "--create-home", "--user-group",
                           "--shell", "/bin/bash", "attendee"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    probe = _as_attendee(box, f"cat '{box / 'home/ubuntu/.ssh/sky-cluster-key'}'")
    assert probe.returncode == 0 and SECRET in probe.stdout, probe.stderr
    check = _setup(box, "check")
    assert check.returncode == 1
    for failed in ("shell is /bin/bash", "home of ubuntu is open", "credentials on the box",
                   "can reach the metadata service 169.254.169.254",
                   "can reach the metadata service fd00:ec2::254 (IPv6)",
                   "can open connections to the box itself (IPv4, IPv6"):
        assert failed in check.stdout, (failed, check.stdout)


def test_attendee_keys_only_forward_the_lab_port(box, tmp_path):
    assert _setup(box, "setup").returncode == 0
    keys = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZ1bGx5LXNoYXJkZWQ ada@laptop\n"
            "# a comment\n\n"
            "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY= bob\r\n")
    done = _setup(box, "add-key", stdin=keys)
    assert done.returncode == 0, done.stderr
    assert "2 added, 2 in all" in done.stdout
    again = _setup(box, "add-key", stdin=keys)
    assert "0 added, 2 in all" in again.stdout, "the same keys twice are kept once"
    written = (box / "home" / "attendee" / ".ssh" / "authorized_keys").read_text().splitlines()
    options = ('restrict,port-forwarding,permitopen="localhost:8888",permitopen="127.0.0.1:8888",'
               'permitlisten="127.0.0.1:1",command="')
    assert len(written) == 2 and all(line.startswith(options) for line in written), written
    assert written[0].endswith(" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZ1bGx5LXNoYXJkZWQ ada@laptop")
    ssh_dir = box / "home" / "attendee" / ".ssh"
    assert (ssh_dir.stat().st_uid, stat.S_IMODE(ssh_dir.stat().st_mode)) == (0, 0o755)
    for bad, message in (("-----BEGIN OPENSSH PRIVATE KEY-----\n", "private key"),
                         ('command="bash" ssh-ed25519 AAAA x\n', "not a public key"),
                         ("ssh-ed25519 AA$A x\n", "malformed"), ("", "no public key")):
        done = _setup(box, "add-key", stdin=bad)
        assert done.returncode == 2 and message in done.stderr, (bad, done.stderr)
        assert len(done.stderr.splitlines()) == 1
    assert len((ssh_dir / "authorized_keys").read_text().splitlines()) == 2, "nothing written"


def test_a_key_written_with_older_options_is_written_again(box):
    assert _setup(box, "setup").returncode == 0
    keys = box / "home" / "attendee" / ".ssh" / "authorized_keys"
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZ1bGx5LXNoYXJkZWQ ada@laptop"
    keys.write_text(f'restrict,port-forwarding,permitopen="localhost:8888" {key}\n')
    assert "FAIL attendee has 1 key(s) without the tunnel-only options" in _setup(box, "check").stdout
    done = _setup(box, "add-key", stdin=key + "\n")
    assert done.returncode == 0 and "1 added, 1 in all" in done.stdout, done.stdout
    assert 'permitlisten="127.0.0.1:1"' in keys.read_text() and keys.read_text().count(key) == 1
    assert _setup(box, "check").returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, answer: bytes) -> socket.socket:
    """A stand-in server on 127.0.0.1:port that writes ``answer`` to whoever connects."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(8)

    def loop():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(answer)
    threading.Thread(target=loop, daemon=True).start()
    return server


def _read_through(port: int, deadline: float) -> bytes | None:
    """What a connection to 127.0.0.1:port reads (b"" when the far end closes it at once); None
    while nothing listens there yet."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.settimeout(5)
                try:
                    return conn.recv(100)
                except (ConnectionResetError, socket.timeout):
                    return b""
        except OSError:
            time.sleep(0.2)
    return None


def test_a_real_sshd_lets_the_key_forward_the_lab_port_and_nothing_else(box, tmp_path):
    """The line box_setup.sh writes, under OpenSSH's own sshd, for a user other than root (the
    attendee's keys, on the machine's user nobody: sshd knows only the machine's own users): -L
    to the lab port works; -L to another port, -R (any port) and a command are refused."""
    sshd = shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd",) if os.path.exists(p)), None)
    if sshd is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH's sshd, ssh and ssh-keygen are not installed (apt-get install openssh-server)")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody on this machine")
    lab, other, port = _free_port(), _free_port(), _free_port()
    servers = [_serve(lab, b"jupyterlab\n"), _serve(other, b"another service\n")]
    for name in ("user", "host"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)],
                       check=True, timeout=60)
    assert _setup(box, "setup", LAB_PORT=str(lab)).returncode == 0
    added = _setup(box, "add-key", stdin=(tmp_path / "user.pub").read_text(), LAB_PORT=str(lab))
    assert added.returncode == 0, added.stderr
    keys = box / "home" / "attendee" / ".ssh" / "authorized_keys"
    (tmp_path / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path / 'host'}\n"
        f"AuthorizedKeysFile {keys}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        f"KbdInteractiveAuthentication no\nAllowUsers nobody\nPidFile {tmp_path / 'sshd.pid'}\n")
    privsep = Path("/run/sshd")  # Note: sshd's privilege separation folder, as its package makes it
    made = not privsep.exists()
    privsep.mkdir(mode=0o755, parents=True, exist_ok=True)
    ssh = ["ssh", "-F", "/dev/null", "-i", str(tmp_path / "user"), "-p", str(port), "-o",
           "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
           "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR"]
    daemon = subprocess.Popen([sshd, "-D", "-e", "-f", str(tmp_path / "sshd_config")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tunnels = []
    try:
        deadline = time.monotonic() + 30
        while _read_through(port, time.monotonic() + 1) is None:
            assert time.monotonic() < deadline and daemon.poll() is None, "sshd did not start"
        # -L to the lab port: the handout's line, through sshd.
        local = _free_port()
        tunnels.append(subprocess.Popen([*ssh, "-N", "-L", f"{local}:localhost:{lab}", "nobody@127.0.0.1"],
                                        stderr=subprocess.PIPE))
        assert _read_through(local, time.monotonic() + 30) == b"jupyterlab\n"
        # -L to any other port: the channel is refused, the connection closed with nothing read.
        elsewhere = _free_port()
        tunnels.append(subprocess.Popen([*ssh, "-N", "-L", f"{elsewhere}:localhost:{other}",
                                         "nobody@127.0.0.1"], stderr=subprocess.PIPE))
        assert _read_through(elsewhere, time.monotonic() + 30) == b""
        # -R, on a free port and on port 1 (the one permitlisten names): refused.
        for listen in (f"127.0.0.1:{_free_port()}", "127.0.0.1:1", str(_free_port())):
            try:
                done = subprocess.run([*ssh, "-N", "-R", f"{listen}:127.0.0.1:{lab}",
                                       "nobody@127.0.0.1"], capture_output=True, text=True, timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"-R {listen} was accepted: the tunnel stayed open")
            assert done.returncode == 255 and "remote port forwarding failed" in done.stderr, \
                (listen, done.returncode, done.stderr)
        # A command (or a shell): the forced nologin.
        done = subprocess.run([*ssh, "nobody@127.0.0.1", "id"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1 and "This account is currently not available." in done.stdout, done
    finally:
        for proc in tunnels:
            proc.terminate()
            proc.wait(timeout=30)
        daemon.terminate()
        daemon.wait(timeout=30)
        for server in servers:
            server.close()
        if made:
            shutil.rmtree(privsep, ignore_errors=True)


@pytest.mark.parametrize("env, message", [
    ({"CLUSTER_USER": "root"}, "CLUSTER_USER is root"),
    ({"CLUSTER_USER": "attendee"}, "the attendees' login"),
    ({"CLUSTER_USER": "nobody-here"}, "not a user of this box"),
    ({"BOX_HOURS": "5h"}, "BOX_HOURS is '5h'"), ({"BOX_HOURS": "100"}, "BOX_HOURS is '100'"),
    ({"LAB_PORT": "88888"}, "LAB_PORT is '88888'")])
def test_box_setup_refuses_bad_input_in_one_line(box, env, message):
    done = _setup(box, "setup", **env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_sky_yaml_runs_the_box_setup_before_anything_else():
    task = yaml.safe_load((ROOT / "docker" / "sky.yaml").read_text())
    setup = [line.strip() for line in task["setup"].splitlines() if line.strip()]
    assert setup[0] == "set -e"
    assert setup[1] == ('sudo env CLUSTER_USER="$(id -un)" BOX_HOURS="$BOX_HOURS" bash '
                        'docker/box_setup.sh setup'), setup
    assert setup[2].startswith("docker build"), "the image is built after the box is safe"
    assert task["envs"]["BOX_HOURS"] == "12"


# ------------------------------------------------------------------ no credentials uploaded
def test_sky_config_uploads_no_credentials():
    config = yaml.safe_load(SKY_CONFIG.read_text())
    assert {"aws", "gcp", "azure"} <= set(config), config
    assert all(v == {"remote_identity": "NO_UPLOAD"} for v in config.values()), config


def _sky_python() -> str | None:
    """The interpreter of the `sky` command on PATH (SkyPilot lives in a virtualenv of its own)."""
    sky = shutil.which("sky")
    if sky is None:
        return None
    first = Path(sky).read_text(errors="replace").splitlines()[0]
    return first[2:].strip() if first.startswith("#!") else None


def test_skypilot_reads_no_upload_from_the_workshops_config(tmp_path):
    python = _sky_python()
    if python is None:
        pytest.skip("SkyPilot is not installed (no `sky` on PATH; pip install skypilot)")
    code = f"""
import json, yaml
from sky import skypilot_config
from sky.utils import common_utils, schemas
common_utils.validate_schema(yaml.safe_load(open({str(SKY_CONFIG)!r})), schemas.get_config_schema(), 'bad: ')
print(json.dumps({{c: skypilot_config.get_effective_workspace_region_config(
    cloud=c, region=None, keys=('remote_identity',), default_value=None)
    for c in ('aws', 'gcp', 'azure')}}))
"""
    env = dict(os.environ, SKYPILOT_PROJECT_CONFIG=str(SKY_CONFIG), HOME=str(tmp_path))
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == dict.fromkeys(("aws", "gcp", "azure"),
                                                                     "NO_UPLOAD")


# ------------------------------------------------------------------ what SkyPilot copies
def _rules(folder: Path) -> list[tuple[str, bool, bool]]:
    """The .skyignore of a folder as rsync reads a ``dir-merge,-`` file: (pattern, anchored,
    folders only), every line an exclude pattern, comments and blank lines skipped."""
    file = folder / ".skyignore"
    if not file.is_file():
        return []
    rules = []
    for line in file.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = line.startswith("/")
        rules.append((line.lstrip("/"), anchored, dir_only))
    return rules


def _wildmatch(pattern: str, path: str) -> bool:
    """rsync's wildcards: ``*`` and ``?`` stop at '/', ``**`` does not."""
    import re
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            j = pattern.find("]", i)
            out += fnmatch.translate(pattern[i:j + 1])[4:-3] if j > 0 else re.escape("[")
            i = j + 1 if j > 0 else i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.fullmatch(out, path) is not None


def _excluded(rel: str, is_dir: bool, rules_by_dir: list[tuple[str, list]]) -> bool:
    for base, rules in rules_by_dir:
        sub = rel[len(base) + 1:] if base else rel
        for pattern, anchored, dir_only in rules:
            if dir_only and not is_dir:
                continue
            if anchored:
                if _wildmatch(pattern, sub):
                    return True
            elif "/" in pattern or "**" in pattern:
                parts = sub.split("/")
                if any(_wildmatch(pattern, "/".join(parts[k:])) for k in range(len(parts))):
                    return True
            elif _wildmatch(pattern, sub.rsplit("/", 1)[-1]):
                return True
    return False


def synced_files(root: Path) -> set[str]:
    """The files rsync --filter='dir-merge,- .skyignore' copies from root (relative paths)."""
    found = set()

    def walk(folder: Path, rel: str, rules_by_dir):
        rules_by_dir = rules_by_dir + [(rel, _rules(folder))]
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            child = f"{rel}/{entry.name}" if rel else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if _excluded(child, is_dir, rules_by_dir):
                continue
            if is_dir:
                walk(Path(entry.path), child, rules_by_dir)
            else:
                found.add(child)
    walk(root, "", [])
    return found


SECRETS = ("tokens.txt", "docker/tokens.txt", "slides/tokens.txt", "teams.txt", "team1.pub",
           "keys/team1.pub", ".fsdp-mini-workshop/tokens/team1", ".fsdp-mini-workshop/teams",
           "tokens/team1", "team1.token", "handouts/team1.md", "collected/team1-work.tar",
           "team1-reports.tar", "docker/team2-work.tar", "team1-work-20261203T104107Z.tar",
           "slides/team2-reports-20261203T104107Z-2.tar", "build/labs/05.html",
           ".venv/bin/python", "slides/node_modules/x/index.js", "fsdp_mini/__pycache__/a.pyc")
KIT = ("docker/sky.yaml", "docker/box_setup.sh", "docker/Dockerfile", "docker/entrypoint.sh",
       "fsdp_mini/__init__.py", "labs/00_setup.ipynb", "benchmarks/gpu_check.sh",
       "slides/handout.md", "tests/test_cuda.py", "pyproject.toml", "README.md", ".skyignore")


@pytest.fixture
def planted(tmp_path):
    """A workdir with the repository's .skyignore, the kit's files and secrets planted where an
    instructor might write them."""
    root = tmp_path / "repo"
    for rel in SECRETS + KIT:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel == ".skyignore":
            shutil.copy(SKYIGNORE, root / rel)
        else:
            (root / rel).write_text("x")
    return root


def test_no_token_team_list_or_key_is_synced(planted):
    assert SKYIGNORE.is_file(), ("no .skyignore: SkyPilot syncs by .gitignore, which leaves "
                                 "tokens.txt, team lists and keys in the copy")
    synced = synced_files(planted)
    assert not synced & set(SECRETS), sorted(synced & set(SECRETS))
    assert set(KIT) <= synced, sorted(set(KIT) - synced)


def test_the_reimplementation_is_rsyncs(planted, tmp_path):
    rsync = shutil.which("rsync")
    if rsync is None:
        pytest.skip("rsync is not installed (apt-get install rsync)")
    # Note: SkyPilot's own filter, as sky/utils/command_runner.py passes it (RSYNC_FILTER_SKYIGNORE).
    (planted / "sub").mkdir()
    (planted / "sub" / ".skyignore").write_text("local-only.txt\n/anchored.txt\n")
    for rel in ("sub/local-only.txt", "sub/anchored.txt", "sub/deeper/anchored.txt", "local-only.txt"):
        (planted / rel).parent.mkdir(parents=True, exist_ok=True)
        (planted / rel).write_text("x")
    done = subprocess.run([rsync, "-a", "--dry-run", "--out-format=%n", "--filter=dir-merge,- .skyignore",
                           f"{planted}/", str(tmp_path / "dst")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    theirs = {line for line in done.stdout.splitlines() if line and not line.endswith("/")}
    assert synced_files(planted) == theirs


def test_the_reimplementation_is_skypilots_own_listing(planted):
    python = _sky_python()
    if python is None:
        pytest.skip("SkyPilot is not installed (no `sky` on PATH)")
    code = ("import json, sys; from sky.data import storage_utils; "
            "print(json.dumps(storage_utils.get_excluded_files(sys.argv[1])))")
    done = subprocess.run([python, "-c", code, str(planted)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    excluded = [p.rstrip("/") for p in json.loads(done.stdout.splitlines()[-1])]
    all_files = {str(p.relative_to(planted)) for p in planted.rglob("*") if p.is_file()}
    theirs = {f for f in all_files if not any(f == e or f.startswith(e + "/") for e in excluded)}
    assert synced_files(planted) == theirs


def test_the_repository_as_it_is_syncs_no_secret_and_everything_a_box_needs():
    synced = synced_files(ROOT)
    bad = sorted(f for f in synced if f.endswith((".token", ".pub", "-reports.tar", "-work.tar"))
                 or Path(f).name in ("tokens.txt", "teams.txt") or f.startswith((".venv/", ".git/"))
                 or "/node_modules/" in f or "__pycache__" in f)
    assert not bad, bad
    for needed in ("docker/sky.yaml", "docker/box_setup.sh", "docker/Dockerfile",
                   "benchmarks/gpu_check.sh", "fsdp_mini/__init__.py", "pyproject.toml"):
        assert needed in synced, needed


def test_skyignore_keeps_out_all_that_gitignore_does():
    """A .skyignore replaces .gitignore for SkyPilot: each of .gitignore's lines must be in it."""
    def lines(path):
        return {ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}
    missing = lines(ROOT / ".gitignore") - lines(SKYIGNORE)
    assert not missing, missing
