"""``fsdp-mini render-labs`` interrupted while a lab's ranks start or run (Ctrl-C to its process
group, SIGTERM): it ends within seconds with one clear line and no traceback, and no process it
started (kernel, keeper, controller, engines, nannies) is left; an output folder it cannot
write is refused before any lab runs."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsdp_mini.launcher.keeper import alive, descendants

EXE = Path(sys.executable).parent / "fsdp-mini"
CMD = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "fsdp_mini.jobs.cli"]


def _engines(pids) -> list[int]:
    def cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                return f.read()
        except OSError:
            return ""
    return [p for p in pids if "ipyparallel.engine" in cmdline(p)]


@pytest.mark.slow
@pytest.mark.parametrize("sig, when", [(signal.SIGINT, "starting"), (signal.SIGTERM, "running")])
def test_an_interrupted_render_stops_every_process_and_says_so_in_one_line(tmp_path, sig, when):
    proc = subprocess.Popen(CMD + ["render-labs", "--ci", "--out", str(tmp_path), "02"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "CI": ""})
    try:
        seen, deadline, up = set(), time.monotonic() + 120, None
        while time.monotonic() < deadline:
            seen |= set(descendants(proc.pid))
            if len(_engines(seen)) >= 2:
                up = up or time.monotonic()
                if when == "starting" or time.monotonic() - up > 4:
                    break
            time.sleep(0.05)
        assert len(_engines(seen)) >= 2, "lab 02 never started its ranks"
        seen |= set(descendants(proc.pid))
        os.killpg(proc.pid, sig)  # Ctrl-C in a terminal signals the whole foreground group
        start = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, (proc.returncode, err[-2000:])
    assert took < 10, f"render-labs took {took:.1f} s to stop"
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"fsdp-mini render-labs: interrupted ({name}) while running 02_collectives; its kernel and "
        f"ranks were stopped and no HTML was written for it")
    deadline = time.monotonic() + 5
    while (left := [p for p in seen if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"left behind: {left}"
    assert not (tmp_path / "02_collectives.html").exists()


def test_an_unwritable_output_folder_is_refused_before_any_lab_runs(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    for out, problem in [(tmp_path / "file", "is a file, not a folder"),
                         (tmp_path / "file" / "below", "cannot write there")]:
        start = time.monotonic()
        proc = subprocess.run(CMD + ["render-labs", "--ci", "--out", str(out), "00"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"fsdp-mini render-labs: error: --out {out}") and \
            problem in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        # Note: refused before any lab ran: nothing written, and in the time a start takes (a
        # lab's run takes minutes; 60 s leaves room for a start on oversubscribed cores)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
        assert time.monotonic() - start < 60
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        proc = subprocess.run(CMD + ["render-labs", "--out", str(locked), "00"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "cannot write there" in proc.stderr
