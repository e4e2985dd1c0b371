"""torch's flight recorder on gloo ranks, its dumps and torch's analyser.

The flight recorder keeps, in each rank, a ring of the last collectives it issued (op, sizes,
sequence number, Python stack). With NCCL its watchdog writes the ring to a file when a
collective times out. gloo records too (checked on torch 2.13; gloo's recorder came with
pytorch#152614, 2025) but writes nothing by itself (on 2.13 no file appears when its collective
times out, whatever TORCH_FR_DUMP_TEMP_FILE says), so ``recorded(fn, folder)`` dumps it when
``fn`` raises::

    folder = tempfile.mkdtemp()
    job = run_job(recorded(train, folder), 2, env=RECORDER_ENV, timeout=3)   # it hangs
    dumps = read_dumps(folder)                   # rank -> torch's dump (a dict)
    first_divergence(dumps)                      # the first collective the ranks disagree on
    print(analyse_flight_recorder(folder).text)   # torch.distributed.flight_recorder.fr_trace

Note: torch 2.13's gloo files its group in the dump under an empty name while each entry names
the group ("0"), and torch's analyser then fails (KeyError ('0', 0)). The dump is written with
the group's name filled in from its entries; nothing else is changed.
"""

from __future__ import annotations

import linecache
import os
import pickle
import subprocess
import sys
from functools import partial
from typing import NamedTuple

import torch

from .cluster_tools import user_frame

# Note: entries kept per rank. torch 2.13 reads TORCH_FR_BUFFER_SIZE and warns that the older
# name, TORCH_NCCL_TRACE_BUFFER_SIZE, is deprecated (it still reads it as a fallback)
RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}
DUMP_PREFIX = "rank_"     # the analyser reads the rank from the name: rank_0, rank_1, ...
ANALYSER = "torch.distributed.flight_recorder.fr_trace"
ANALYSER_TIMEOUT = 60     # seconds


def flight_recorder_on_gloo() -> bool:
    """Does this torch have the call that dumps the flight recorder of gloo ranks?"""
    return hasattr(torch._C._distributed_c10d, "_dump_fr_trace")


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
    if not flight_recorder_on_gloo():
        raise RuntimeError(f"torch {torch.__version__} has no flight recorder dump for gloo "
                           "(torch._C._distributed_c10d._dump_fr_trace); it needs torch >= 2.8")
    dump = _name_the_groups(pickle.loads(torch._C._distributed_c10d._dump_fr_trace()))
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
    frames = [(f.get("filename", ""), f.get("line"), f.get("name")) for f in entry.get("frames") or []]
    line = user_frame(frames)
    where = next(((path, n) for path, n, _ in frames if line.endswith(f"{path}:{n}")), None)
    return {"seq": entry["collective_seq_id"], "op": entry["profiling_name"],
            "sizes": entry["input_sizes"], "line": line,
            "source": linecache.getline(*where).strip() if where else ""}


def first_divergence(dumps: dict[int, dict]) -> dict | None:
    """The first collective (by sequence number) that the ranks issued from different places
    or as different ops, or None if all the entries they share agree::

        {"seq": 8, "by_rank": {0: {"op": "gloo:all_gather", "source": "norm = ...", ...}, 1: ...},
         "one_ahead": [0]}   # rank 0's next entry is what the others issued at 8: an extra one

    Note: torch's analyser matches op and sizes only, so two all-gathers of one size from
    different lines pass it; the stacks tell them apart.
    """
    entries = {rank: {e["collective_seq_id"]: _short(e) for e in d.get("entries") or []}
               for rank, d in sorted(dumps.items())}
    shared = sorted(set.intersection(*(set(e) for e in entries.values()))) if entries else []
    for seq in shared:
        seen = {rank: es[seq] for rank, es in entries.items()}
        if len({_call(c) for c in seen.values()}) > 1:
            ahead = [r for r, es in entries.items() if seq + 1 in es and all(
                _call(es[seq + 1]) == _call(seen[o]) for o in entries if o != r)]
            return {"seq": seq, "by_rank": seen, "one_ahead": ahead}
    return None


def _call(c: dict) -> tuple:
    return c["op"], str(c["sizes"]), c["line"]


def who_is_behind(dumps: dict[int, dict]) -> dict:
    """Which rank issued the fewest collectives, and each rank's last one. A rank that stopped
    outside collectives (its data, a slow step, its own exception) is behind: the others' last
    entry is the collective it never reached. Ranks stuck in mismatched collectives can have
    issued as many: then ``first_divergence`` says more.

    Example: ``{"behind": [1], "last": {0: {"seq": 9, ...}, 1: {"seq": 8, ...}}}``.
    """
    if len(dumps) < 2:
        raise ValueError(f"need the dumps of at least 2 ranks; got ranks {sorted(dumps)}")
    last = {rank: last_collective(d) for rank, d in sorted(dumps.items())}
    fewest = min(c["seq"] for c in last.values())
    return {"behind": [r for r, c in last.items() if c["seq"] == fewest], "last": last}


class Analysis(NamedTuple):
    """What torch's analyser printed, and its exit status (0: it ran to the end)."""
    returncode: int
    text: str


def analyse_flight_recorder(folder: str, *more_args: str) -> Analysis:
    """Run torch's analyser on the dumps in ``folder``
    (``python -m torch.distributed.flight_recorder.fr_trace FOLDER -p rank_``).

    Example: ``analyse_flight_recorder(folder).text`` → "Collective sequence number: 9 has
    errors ...".
    """
    command = [sys.executable, "-m", ANALYSER, folder, "-p", DUMP_PREFIX, *more_args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=ANALYSER_TIMEOUT)
    finally:
        if proc.poll() is None:  # Note: timed out (or interrupted): no analyser is left behind
            proc.kill()
            proc.wait()
    return Analysis(proc.returncode, out)
