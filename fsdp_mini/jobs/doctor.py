"""``fsdp-mini doctor``: what would stop the labs on this machine, one line each with its fix.

An attendee runs it the day before, in a terminal of the workshop's JupyterLab (File > New >
Terminal), and the instructor over ssh (``docker/workshop.sh check``, with the box's GPUs)::

    fsdp-mini doctor                               # this machine: GPUs, NCCL, shm, memlock, ports
    fsdp-mini doctor --gpus 4                      # and the box has 4 GPUs, all seen by torch
    fsdp-mini doctor --url http://localhost:8888   # and JupyterLab answers with the token
                                                   # (--token, else $JUPYTER_TOKEN)

Each check prints one line: ``ok``, ``warn`` (the labs run, something is worth knowing),
``FAIL`` (what is wrong, then what to do) or ``skip`` (what cannot be checked here, and why: on a
machine without GPUs, NCCL and the GPU count). Exit status 1 when any check failed, 0 otherwise;
2 for bad arguments. Run inside the box's container, ``--url`` reaches JupyterLab from the box
itself: that the attendee's browser reached JupyterLab at all is what proves their tunnel.

Three files, one concept each: what it reads from the machine (:mod:`.doctor_probe`, whose
:class:`Probe` the tests replace), the checks (:mod:`.doctor_checks`) and, here, the command.
"""

from __future__ import annotations

import sys
import urllib.parse

from .doctor_checks import (FAIL, GIB, KIT_TORCH_FLOOR, OK, RENDEZVOUS_PORTS, SHM_NEEDED, SKIP,
                            WARN, Finding, check_gpus, check_jupyter, check_memlock, check_nccl,
                            check_ports, check_shm, check_versions)
from .doctor_probe import Probe

__all__ = ["FAIL", "GIB", "KIT_TORCH_FLOOR", "OK", "RENDEZVOUS_PORTS", "SHM_NEEDED", "SKIP", "WARN",
           "Finding", "Probe", "add_doctor_parser", "check_gpus", "check_jupyter", "check_memlock",
           "check_nccl", "check_ports", "check_shm", "check_versions", "doctor_command",
           "run_checks", "summary"]


def run_checks(probe: Probe, expected_gpus: int | None = None, url: str | None = None,
               token: str | None = None) -> list[Finding]:
    findings = [check_versions(probe)]
    gpu = check_gpus(probe, expected_gpus)
    findings.append(gpu)
    gpus = len(probe.torch_gpus())
    findings += [check_nccl(probe, gpus), check_shm(probe, gpus), check_memlock(probe, gpus),
                 check_ports(probe), check_jupyter(probe, url, token)]
    return findings


def summary(findings: list[Finding]) -> str:
    failed = [f.what for f in findings if f.status == FAIL]
    skipped = [f.what for f in findings if f.status == SKIP]
    warned = [f.what for f in findings if f.status == WARN]
    if failed:
        head = f"{len(failed)} problem{'s' if len(failed) > 1 else ''} ({', '.join(failed)}): fix " \
               "them, then run fsdp-mini doctor again"
    else:
        head = "nothing wrong"
    if warned:
        head += f"; worth knowing: {', '.join(warned)}"
    if skipped:
        head += f"; not checked here: {', '.join(skipped)}"
    return f"fsdp-mini doctor: {head}"


def add_doctor_parser(sub) -> None:
    doc = sub.add_parser("doctor", help="check this machine for the labs: GPUs, NCCL, /dev/shm, "
                         "memlock, ports, versions, JupyterLab; one line each, with the fix")
    doc.add_argument("--gpus", type=int, default=None, metavar="N",
                     help="the GPUs this machine should have (a workshop box: 4); default: any")
    doc.add_argument("--url", default=None,
                     help="JupyterLab's address to check, e.g. http://localhost:8888 (the tunnel's "
                          "end); a ?token=... in it is used")
    doc.add_argument("--token", default=None,
                     help="the JupyterLab token (default: the URL's, else $JUPYTER_TOKEN)")


def doctor_command(args, probe: Probe | None = None) -> int:
    if args.gpus is not None and not 0 <= args.gpus <= 64:
        print(f"fsdp-mini doctor: error: --gpus must be from 0 to 64, got {args.gpus}",
              file=sys.stderr)
        return 2
    if args.url is not None and urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        print(f"fsdp-mini doctor: error: --url must start with http:// or https://, got "
              f"{args.url!r} (e.g. --url http://localhost:8888)", file=sys.stderr)
        return 2
    findings = run_checks(probe or Probe(), args.gpus, args.url, args.token)
    for finding in findings:
        print(finding.line())
    print(summary(findings))
    return 1 if any(f.status == FAIL for f in findings) else 0
