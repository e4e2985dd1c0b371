"""The checks of ``fsdp-mini doctor``, one :class:`Finding` each: ``ok``, ``warn`` (the labs run,
something is worth knowing), ``FAIL`` (what is wrong, then what to do) or ``skip`` (what cannot be
checked here, and why). Each reads the machine only through a
:class:`~fsdp_mini.jobs.doctor_probe.Probe`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse

from .doctor_probe import Probe

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
GIB = 1024**3
# Note: below this, NCCL between the ranks of one machine hangs or fails (Docker's default
# /dev/shm is 64 MiB); the compose cpu service asks for 2 GB, --ipc=host gives the host's.
SHM_NEEDED = 1 * GIB
# Note: lab 10's two-terminal torchrun demo and docker/multinode/torchrun.sh meet at 29400 (c10d
# rendezvous, torchrun's default --rdzv-endpoint port); 29500 is torchrun's default master port.
# fsdp_mini.launch and `torchrun --standalone` take a free port of their own.
RENDEZVOUS_PORTS = (29400, 29500)
KIT_TORCH_FLOOR = "2.8"  # pyproject.toml: torch>=2.8


@dataclasses.dataclass(frozen=True)
class Finding:
    status: str  # ok, warn, FAIL, skip
    what: str
    message: str

    def line(self) -> str:
        return f"{self.status:<4} {self.what}: {self.message}"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def _mib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 1024**2:.0f} MiB"


def check_versions(probe: Probe) -> Finding:
    kit = probe.kit_version()
    torch_version = probe.torch_version()
    cuda = probe.torch_cuda()
    build = f"CUDA {cuda} build" if cuda else "CPU build"
    kit_text = f"fsdp_mini {kit}" if kit else "fsdp_mini (not installed as a package)"
    if _version_tuple(torch_version) < _version_tuple(KIT_TORCH_FLOOR):
        return Finding(FAIL, "versions", f"{kit_text}, torch {torch_version}: the kit needs torch>="
                       f"{KIT_TORCH_FLOOR}; fix: pip install \"torch>={KIT_TORCH_FLOOR}\" (on a GPU "
                       "box, the image's CUDA torch: docker/Dockerfile)")
    if kit is None:
        return Finding(WARN, "versions", f"{kit_text}, torch {torch_version} ({build}): the "
                       "fsdp-mini command and the labs expect the kit installed; fix: pip install "
                       "-e \".[dev]\" in the repository")
    return Finding(OK, "versions", f"{kit_text}, torch {torch_version} ({build}; the kit needs "
                   f"torch>={KIT_TORCH_FLOOR})")


def check_gpus(probe: Probe, expected: int | None) -> Finding:
    seen = probe.torch_gpus()
    listed = probe.nvidia_smi_gpus()
    cuda = probe.torch_cuda()
    if not seen and not listed:
        if expected:
            why = ("no nvidia-smi: not a GPU machine, or the container was started without "
                   "--gpus all" if listed is None else "nvidia-smi lists none")
            return Finding(FAIL, "GPUs", f"none, {expected} expected ({why}); fix: on the box, "
                           "restart the container as docker/sky.yaml does (--gpus all), or replace "
                           "the box")
        return Finding(SKIP, "GPUs", "no GPU here (no nvidia-smi, torch sees none): the labs run "
                       "4 CPU ranks with gloo; on a GPU box this line counts the GPUs and checks "
                       "that torch sees each one")
    if listed and not seen:
        if not cuda:
            return Finding(FAIL, "GPUs", f"nvidia-smi lists {len(listed)}, but torch "
                           f"{probe.torch_version()} is a CPU build; fix: use the image's CUDA torch "
                           "(docker/Dockerfile), or pip install torch from its CUDA index")
        return Finding(FAIL, "GPUs", f"nvidia-smi lists {len(listed)}, torch (CUDA {cuda}) sees "
                       f"none: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} "
                       f"hides them, or the driver is older than CUDA {cuda} (nvidia-smi's header "
                       "gives the CUDA version it supports); fix: unset CUDA_VISIBLE_DEVICES, or "
                       "take a machine image with a newer driver")
    if listed is not None and len(seen) < len(listed):
        return Finding(FAIL, "GPUs", f"torch sees {len(seen)} of the {len(listed)} GPUs nvidia-smi "
                       f"lists (CUDA_VISIBLE_DEVICES="
                       f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}); fix: unset it, or start "
                       "the container with --gpus all")
    names = sorted(set(seen))
    described = f"{len(seen)} × {names[0]}" if len(names) == 1 else f"{len(seen)} ({', '.join(names)})"
    if expected is not None and len(seen) != expected:
        return Finding(FAIL, "GPUs", f"{described}, {expected} expected; fix: a missing GPU is a "
                       "faulty box: replace it (docker/workshop.sh down --no-collect TEAM, then up "
                       "TEAM), or take the spare")
    if len(seen) == 1:
        return Finding(WARN, "GPUs", f"{described}: NCCL needs a GPU per rank, so the labs run "
                       "4 CPU ranks with gloo here; a workshop box has 4")
    return Finding(OK, "GPUs", f"{described}, each seen by torch: the labs run {len(seen)} NCCL "
                   "ranks, one per GPU")


def check_nccl(probe: Probe, gpus: int) -> Finding:
    has_nccl, version = probe.nccl()
    if not probe.gloo():
        return Finding(FAIL, "NCCL", "torch.distributed has no gloo, which every checker uses; fix: "
                       "reinstall torch (a build with distributed support)")
    if gpus == 0:
        return Finding(SKIP, "NCCL", "cannot be checked without GPUs (torch "
                       f"{'has' if has_nccl else 'has no'} NCCL built in); gloo: available, which "
                       "is what the labs use here")
    if not has_nccl:
        return Finding(FAIL, "NCCL", "torch.distributed has no NCCL: the labs cannot use the GPUs; "
                       "fix: the image's CUDA torch (docker/Dockerfile)")
    return Finding(OK, "NCCL", f"available (NCCL {version or 'version unknown'}), gloo too")


def check_shm(probe: Probe, gpus: int) -> Finding:
    size = probe.shm_bytes()
    fix = ("fix: run the container with --ipc=host (docker/sky.yaml and compose's gpu service do), "
           "or --shm-size=8g")
    if size is None:
        status = FAIL if gpus >= 2 else WARN
        return Finding(status, "/dev/shm", f"missing: NCCL moves data between the ranks of one "
                       f"machine through it; {fix}")
    if size < SHM_NEEDED:
        if gpus >= 2:
            return Finding(FAIL, "/dev/shm", f"{_mib(size)}: NCCL between the ranks of one machine "
                           f"needs more (Docker's default, 64 MiB, hangs or fails); {fix}")
        return Finding(WARN, "/dev/shm", f"{_mib(size)}: enough for CPU ranks, too small for NCCL "
                       f"on a GPU box; {fix}")
    return Finding(OK, "/dev/shm", f"{_mib(size)}")


def check_memlock(probe: Probe, gpus: int) -> Finding:
    limit = probe.memlock()
    if limit is None:
        return Finding(OK, "memlock", "unlimited")
    fix = "fix: run the container with --ulimit memlock=-1 (docker/sky.yaml and compose do)"
    if gpus >= 1:
        return Finding(FAIL, "memlock", f"{_mib(limit)}: NCCL pins memory for its transfers and "
                       f"fails or hangs under a limit; {fix}")
    return Finding(WARN, "memlock", f"{_mib(limit)}: only NCCL needs it unlimited, so the CPU ranks "
                   f"here are fine; on a GPU box, {fix}")


def check_ports(probe: Probe) -> Finding:
    if not probe.port_free(0):
        return Finding(FAIL, "ports", "no port can be opened on 127.0.0.1: fsdp_mini.launch's "
                       "rendezvous (a free port of its own) cannot start; fix: check the loopback "
                       "interface (ip addr show lo) and the firewall")
    taken = [p for p in RENDEZVOUS_PORTS if not probe.port_free(p)]
    if taken:
        return Finding(WARN, "ports", f"{', '.join(map(str, taken))} in use on 127.0.0.1: lab 10's "
                       "two-terminal torchrun demo and docker/multinode/torchrun.sh meet at 29400, "
                       "torchrun's static launch at 29500; fix: stop what listens there (ss -ltnp), "
                       "or pass another port (--rdzv-endpoint 127.0.0.1:PORT, RDZV_PORT=PORT); "
                       "fsdp_mini.launch takes a free port of its own")
    return Finding(OK, "ports", "a free port for fsdp_mini.launch's rendezvous, and "
                   f"{', '.join(map(str, RENDEZVOUS_PORTS))} for torchrun's")


def _status_url(url: str) -> tuple[str, str | None]:
    """(the /api/status address of the server at url, the token written in url, if any)."""
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query).get("token", [None])[0]
    path = parts.path.rstrip("/")
    for tail in ("/lab", "/tree", "/api/status"):
        if path.endswith(tail):
            path = path[: -len(tail)]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/api/status", "", "")), token


def check_jupyter(probe: Probe, url: str | None, token: str | None) -> Finding:
    if url is None:
        return Finding(SKIP, "JupyterLab", "not checked: pass --url http://localhost:8888 (the "
                       "tunnel's end) and the token (--token, or JUPYTER_TOKEN)")
    status_url, url_token = _status_url(url)
    token = token or url_token or os.environ.get("JUPYTER_TOKEN") or None
    tunnel = ("fix: start the tunnel, ssh -N -L 8888:localhost:8888 attendee@<address> (your "
              "handout's line), and keep it open")
    answer = probe.http_status(status_url, token)
    if isinstance(answer, str):
        return Finding(FAIL, "JupyterLab", f"{status_url}: {answer}: nothing answers there; {tunnel}")
    if answer == 200 and token:
        return Finding(OK, "JupyterLab", f"{status_url} answers, and accepts the token")
    if answer == 403 and not token:
        return Finding(WARN, "JupyterLab", f"{status_url} answers (403 without a token): give the "
                       "token to check it too, --token or JUPYTER_TOKEN")
    if answer == 403:
        return Finding(FAIL, "JupyterLab", f"{status_url} answers, but refuses the token (403); "
                       "fix: copy the token again from your handout, whole, without spaces")
    if answer == 200:
        return Finding(FAIL, "JupyterLab", f"{status_url} answers without a token: anyone who "
                       "reaches the port can run code; fix: start it through the image's "
                       "entrypoint, which never runs without JUPYTER_TOKEN")
    return Finding(FAIL, "JupyterLab", f"{status_url} answered HTTP {answer}, not JupyterLab's "
                   f"/api/status: another server on that port?; {tunnel}")
