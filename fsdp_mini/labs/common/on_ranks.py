"""Running answers on several ranks for a check: one launch per world size, many answers in it.

    records = run_answers(observe, [answer, other], configs, timeout=20)
    records[(0, cfg)]              # the Record of answer 0 in configuration cfg, all ranks merged

Every rank runs the same items, (answer, configuration) pairs, in the same order. After each,
it writes its record to a folder and waits at a barrier on the process group's store (not a
collective): a rank that skipped a collective does not run ahead into the next answer's, where
it would meet its peer's pending one and mix two answers up; its peers wait at the barrier
instead, which times out and names the item. An answer that raises or hangs ends the launch;
what was recorded before is kept, the answer's larger configurations are not run (its verdict
is decided at its smallest failing one), and the other answers go on in a new launch.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch

from ...launcher import LaunchError, launch
from .checking import forget_logs
from .records import Record

HANG = "did not finish item"  # the words a rank raises with when its peers never arrive


def observe_here(observe, answer, cfg, rank) -> Record:
    """``observe(answer, cfg, record)`` in this process; an exception becomes the record's."""
    record = Record(rank)
    start = time.perf_counter()
    try:
        observe(answer, cfg, record)
    except Exception as e:  # noqa: BLE001  (the learner's code: any error is a finding)
        record.fail(e, traceback.format_exc())
    record.seconds = time.perf_counter() - start
    return record


def run_answers(observe, answers: list, configs: list, timeout: float,
                wait: dict | None = None) -> dict:
    """{(answer index, config): Record} for every pair (an answer's configurations after the
    one where it raised or hung are left out). ``wait``: per config, how long a rank waits for
    its peers at the barrier (default ``timeout``)."""
    out, failed = {}, set()
    for ws in sorted({c["world_size"] for c in configs}):
        todo = [(a, c) for c in configs if c["world_size"] == ws for a in range(len(answers))
                if a not in failed]
        while todo:
            done, failing = _launch_items(observe, answers, todo, ws, timeout, wait or {})
            out.update(done)
            failed |= failing
            todo = [(a, c) for a, c in todo if (a, c) not in done and a not in failed]
    return out


def _launch_items(observe, answers, items, world_size, timeout, wait) -> tuple[dict, set]:
    folder = Path(tempfile.mkdtemp(prefix="fsdp_mini_check_"))
    failure, done, failed = None, {}, set()
    waits = [min(timeout, wait.get(c, timeout)) for _, c in items]
    try:
        try:
            launch(_rank_loop, world_size, observe, answers, items, waits, str(folder),
                   backend="gloo", timeout=timeout, deadline=timeout * 3 + sum(waits))
        except LaunchError as err:
            failure = err
        for k, (a, c) in enumerate(items):
            record, complete = _gather(folder, k, world_size, failure)
            if record.error is not None:
                done[(a, c)] = record
                failed.add(a)
            elif complete:
                done[(a, c)] = record
            if not complete or record.error is not None:
                break  # Note: the launch ended here; later items run in a launch of their own
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if failure is not None:
            forget_logs(failure)
    return done, failed


def _rank_loop(rank, world_size, observe, answers, items, waits, folder):
    import torch.distributed as dist
    torch.set_num_threads(1)
    store = dist.distributed_c10d._get_default_store()
    for k, (a, cfg) in enumerate(items):
        record = observe_here(observe, answers[a], cfg, rank)
        (Path(folder) / f"{k}-{rank}.pkl").write_bytes(pickle.dumps(record))
        if record.error is not None:
            # Note: the other ranks may wait for this one: end the launch now
            raise RuntimeError(f"item {k}: {record.error[0]}: {record.error[1]}")
        store.set(f"fsdp_mini_check/{k}/{rank}", "done")
        try:
            store.wait([f"fsdp_mini_check/{k}/{r}" for r in range(world_size)],
                       timedelta(seconds=waits[k]))
        except RuntimeError:  # noqa: PERF203  (the store's timeout)
            late = [r for r in range(world_size)
                    if not store.check([f"fsdp_mini_check/{k}/{r}"])]
            raise RuntimeError(f"ranks {late} {HANG} {k} within {waits[k]:.0f} s") from None


def _gather(folder: Path, k: int, world_size: int, failure) -> tuple[Record, bool]:
    """The ranks' records of item ``k`` merged (each key names its rank), and whether every
    rank finished it."""
    merged, complete = Record(), True
    merged.seconds = 0.0
    for rank in range(world_size):
        path = folder / f"{k}-{rank}.pkl"
        if not path.is_file():
            complete = False
            continue
        record = pickle.loads(path.read_bytes())
        merged.seen.update(record.seen)
        merged.seconds = max(merged.seconds, record.seconds)
        if record.error is not None and (merged.error is None or merged.error[0] == "a hang"):
            merged.error = record.error  # Note: a rank's own error says more than a peer's wait
    if not complete and merged.error is None and failure is not None:
        merged.error = _why(failure, world_size)
    return merged, complete


def _why(failure: LaunchError, world_size: int) -> tuple:
    message = str(failure.message or "")
    if HANG in message or "Timeout" in str(failure.exc_type) or "timed out" in message:
        late = message.split(" did not", 1)[0].removeprefix("ranks ")
        return ("a hang", f"rank{'s' * (late.count(',') > 0)} {late.strip('[]')} never finished: "
                f"{'it' if ',' not in late else 'they'} waited in a collective that another "
                f"rank never joined" if late else "the ranks waited in a collective that "
                "another rank never joined", "")
    return (str(failure.exc_type).rsplit(".", 1)[-1], message[:400], "")
