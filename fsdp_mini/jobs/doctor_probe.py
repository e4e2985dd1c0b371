"""What ``fsdp-mini doctor`` reads from the machine: one :class:`Probe` method per fact, so that
the tests can play a GPU box, a missing GPU or a closed port on a CPU machine by replacing them
(tests/test_workshop_doctor.py). The checks themselves are in :mod:`fsdp_mini.jobs.doctor_checks`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request


class Probe:
    """What the checks read from the machine (the tests replace these methods)."""

    def kit_version(self) -> str | None:
        from importlib import metadata
        try:
            return metadata.version("fsdp_mini")
        except metadata.PackageNotFoundError:
            return None

    def torch_version(self) -> str:
        import torch
        return torch.__version__

    def torch_cuda(self) -> str | None:
        """The CUDA version torch was built for (None: a CPU build)."""
        import torch
        return torch.version.cuda

    def torch_gpus(self) -> list[str]:
        """The GPUs torch sees (their names); [] when CUDA is not available."""
        import torch
        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]

    def nvidia_smi_gpus(self) -> list[str] | None:
        """The GPUs ``nvidia-smi -L`` lists; None when there is no nvidia-smi."""
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        try:
            out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [m[1] for m in re.finditer(r"^GPU \d+: (.+?)(?: \(UUID: [^)]*\))?$", out.stdout, re.M)]

    def nccl(self) -> tuple[bool, str | None]:
        """(torch.distributed has NCCL, NCCL's version)."""
        import torch
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_nccl_available()):
            return False, None
        try:
            version = torch.cuda.nccl.version()
        except Exception:  # Note: a build with NCCL whose library cannot load here
            return True, None
        return True, ".".join(map(str, version)) if isinstance(version, tuple) else str(version)

    def gloo(self) -> bool:
        import torch.distributed as dist
        return dist.is_available() and dist.is_gloo_available()

    def shm_bytes(self) -> int | None:
        try:
            st = os.statvfs("/dev/shm")
        except OSError:
            return None
        return st.f_blocks * st.f_frsize

    def memlock(self) -> int | None:
        """The soft memlock limit in bytes; None: unlimited."""
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return None if soft == resource.RLIM_INFINITY else soft

    def port_free(self, port: int) -> bool:
        """Whether a server could listen on ``port`` (0: any free port) on 127.0.0.1."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                s.listen(1)
            except OSError:
                return False
        return True

    def http_status(self, url: str, token: str | None, timeout: float = 10.0) -> int | str:
        """The HTTP status of GET url (a number), or why there was none (a sentence)."""
        headers = {"Authorization": f"token {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, ConnectionRefusedError):
                return "connection refused"
            if isinstance(reason, (socket.timeout, TimeoutError)):
                return f"no answer in {timeout:g} s"
            return str(reason)
        except (socket.timeout, TimeoutError):
            return f"no answer in {timeout:g} s"
        except OSError as e:
            return str(e)
