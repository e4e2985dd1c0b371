"""Lab 09, section 5: torch's flight recorder on gloo ranks, its dumps and torch's analyser.

The flight recorder keeps, in each rank, a ring of the last collectives it issued (op, sizes,
sequence number, Python stack). With NCCL its watchdog writes the ring to a file when a
collective times out; gloo records too (torch >= 2.8) but writes nothing by itself (checked on
torch 2.13: no file appears), so ``recorded(fn, folder)`` dumps it when ``fn`` raises::

    folder = tempfile.mkdtemp()
    job = run_job(recorded(train, folder), 2, env=RECORDER_ENV, timeout=3)   # it hangs
    behind = who_is_behind(read_dumps(folder))   # the rank that issued fewer collectives
    print(analyse_flight_recorder(folder))                    # torch.distributed.flight_recorder.fr_trace

Note: torch 2.13's gloo files its group in the dump under an empty name while each entry names
the group ("0"), and torch's analyser then fails (KeyError ('0', 0)). The dump is written with
the group's name filled in from its entries; nothing else is changed.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from functools import partial

import torch

from .cluster_tools import user_frame

# Note: entries kept per rank. torch 2.13 reads TORCH_FR_BUFFER_SIZE and warns that the older
# name, TORCH_NCCL_TRACE_BUFFER_SIZE, is deprecated (it still reads it as a fallback)
RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}
DUMP_PREFIX = "rank_"     # the analyser reads the rank from the name: rank_0, rank_1, ...
ANALYSER = "torch.distributed.flight_recorder.fr_trace"
ANALYSER_TIMEOUT = 60     # seconds


def recorded(fn, folder: str):
    """``fn`` for ``launch`` that writes this rank's flight-recorder dump to ``folder`` if it
    raises (a collective timed out, a peer left), as NCCL's watchdog does on a timeout.

    Example: ``launch(recorded(train, "/tmp/fr"), 2, env=RECORDER_ENV)`` → /tmp/fr/rank_0 ...
    """
    if not callable(fn):
        raise TypeError(f"recorded needs the function the ranks run; got {fn!r}")
    if not os.path.isdir(folder):
        raise ValueError(f"the folder for the dumps must exist: {folder!r}")
    return partial(_run_then_dump_on_failure, fn, os.path.abspath(folder))


def _run_then_dump_on_failure(fn, folder, rank, world_size, *args):
    try:
        return fn(rank, world_size, *args)
    except BaseException:
        write_dump(os.path.join(folder, f"{DUMP_PREFIX}{rank}"))
        raise


def write_dump(path: str) -> dict:
    """This rank's flight recorder, as torch dumps it (a pickled dict), written to ``path``."""
    dump_fn = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
    if dump_fn is None:
        raise RuntimeError(f"torch {torch.__version__} has no flight recorder dump for gloo "
                           "(torch._C._distributed_c10d._dump_fr_trace); it needs torch >= 2.8")
    dump = _name_the_groups(pickle.loads(dump_fn()))
    with open(path, "wb") as f:
        pickle.dump(dump, f)
    return dump


def _name_the_groups(dump: dict) -> dict:
    """The dump with an unnamed group (gloo's '' key) named after the one group its entries name."""
    config, named = dump.get("pg_config", {}), {e["process_group"] for e in dump.get("entries", [])}
    if "" in config and len(named) == 1:
        (name, desc), = named
        config[name] = {**config.pop(""), "name": name, "desc": desc}
    return dump


def read_dumps(folder: str) -> dict[int, dict]:
    """The dumps in ``folder``, by rank."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith(DUMP_PREFIX) and name[len(DUMP_PREFIX):].isdigit():
            with open(os.path.join(folder, name), "rb") as f:
                out[int(name[len(DUMP_PREFIX):])] = pickle.load(f)
    return out


def last_collective(dump: dict) -> dict:
    """A rank's newest entry, shortly: ``{"seq": 7, "op": "gloo:all_gather", "sizes": [[24]],
    "line": "log_on_rank_0 at <cell>:11"}`` (the innermost frame not in torch or fsdp_mini)."""
    entries = dump.get("entries") or []
    if not entries:
        raise ValueError("this dump has no entries: was TORCH_FR_BUFFER_SIZE set for the ranks "
                         "(RECORDER_ENV), and did they issue a collective?")
    return _short(max(entries, key=lambda e: e["collective_seq_id"]))


def _short(entry: dict) -> dict:
    return {"seq": entry["collective_seq_id"], "op": entry["profiling_name"],
            "sizes": entry["input_sizes"], "line": user_frame((f.get("filename", ""), f.get("line"), f.get("name"))
                               for f in entry.get("frames") or [])}


def first_divergence(dumps: dict[int, dict]) -> dict | None:
    """The first collective (by sequence number) that the ranks issued from different places
    or as different ops: ``{"seq": 8, "by_rank": {0: last-collective-like dict, 1: ...}}``;
    None if all the entries they share agree. Note: torch's analyser matches op and sizes only,
    so two all-gathers of one size from different lines pass it; the stacks tell them apart."""
    entries = {rank: {e["collective_seq_id"]: e for e in d.get("entries") or []}
               for rank, d in dumps.items()}
    shared = sorted(set.intersection(*(set(e) for e in entries.values()))) if entries else []
    for seq in shared:
        seen = {rank: _short(es[seq]) for rank, es in sorted(entries.items())}
        if len({(c["op"], str(c["sizes"]), c["line"]) for c in seen.values()}) > 1:
            return {"seq": seq, "by_rank": seen}
    return None


def who_is_behind(dumps: dict[int, dict]) -> dict:
    """Which rank issued the fewest collectives, and each rank's last one.

    Example: ``{"behind": [1], "last": {0: {"seq": 9, ...}, 1: {"seq": 8, ...}}}``.
    """
    if len(dumps) < 2:
        raise ValueError(f"need the dumps of at least 2 ranks; got ranks {sorted(dumps)}")
    last = {rank: last_collective(d) for rank, d in sorted(dumps.items())}
    fewest = min(c["seq"] for c in last.values())
    return {"behind": [r for r, c in last.items() if c["seq"] == fewest], "last": last}


def analyse_flight_recorder(folder: str, *more_args: str) -> str:
    """What torch's analyser prints for the dumps in ``folder``
    (``python -m torch.distributed.flight_recorder.fr_trace FOLDER -p rank_``)."""
    command = [sys.executable, "-m", ANALYSER, folder, "-p", DUMP_PREFIX, *more_args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=ANALYSER_TIMEOUT)
    finally:
        if proc.poll() is None:  # Note: timed out (or interrupted): no analyser is left behind
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode}):\n{out[-3000:]}")
    return out
