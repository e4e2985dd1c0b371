"""HSDP: FSDP inside shard groups, replication across them (fsdp_mini/fsdp/hsdp.py).

One launch at world size 4 (2 shard groups of 2) trains the tiny GPT and the odd net and checks:
parity with single-process training (AdamW, SGD + momentum), the bytes each group carries
against the hybrid formula, the model state per rank against FSDP's at world size 2, the edge
cases shard_size = N (FSDP) and 1 (DDP), clipping, and the errors of a bad shard_size. Then two
torchrun agents, as two nodes of two ranks each, train the same model with one shard group per
node and must give the single-process weights too.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import hsdp_workers
import pytest
import torch
import workers
from helpers import assert_states_equal, padded, ring, trainable_numel

import fsdp_mini
from fsdp_mini import launch, theory
from fsdp_mini.models import GPTConfig, make_model

TOL = 1e-5
WS, S = 4, 2
G = WS // S


@pytest.fixture(scope="module")
def runs():
    return launch(hsdp_workers.parity_and_bytes, WS, timeout=90)


@pytest.fixture(scope="module")
def references():
    return {(m, o): workers.train_reference(m, o) for m, o in
            (("gpt", "adamw"), ("gpt", "sgd"), ("odd", "adamw"))}


def _unit_numels():
    """The tiny GPT's units (each block, then the root with the rest), trainable elements."""
    model = make_model(GPTConfig.tiny())
    blocks = [trainable_numel(b) for b in model.blocks]
    return blocks, trainable_numel(model) - sum(blocks)


# -- parity ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key,ref", [(("hsdp2", "adamw"), ("gpt", "adamw")),
                                     (("hsdp2", "sgd"), ("gpt", "sgd")),
                                     (("hsdp2-odd", "adamw"), ("odd", "adamw")),
                                     (("hsdp4", "sgd"), ("gpt", "sgd")),
                                     (("hsdp1", "sgd"), ("gpt", "sgd"))])
def test_hsdp_matches_single_process(runs, references, key, ref):
    err = assert_states_equal(runs[0][key]["state"], references[ref], TOL, f"{key} at 2x2")
    print(f"\n{key}: largest relative difference {err:.2e}")


# -- bytes ---------------------------------------------------------------------------------------

def test_bytes_inside_and_across_groups_equal_the_hybrid_formula(runs):
    blocks, root = _unit_numels()
    units = [padded(b, S) for b in blocks] + [padded(root, S)]
    # inside: all-gather every unit (forward), the blocks again (backward), reduce-scatter all
    inside_ag = ring(S) * 4 * (sum(units) + sum(units[:-1]))
    inside_rs = ring(S) * 4 * sum(units)
    across = 2 * ring(G) * 4 * sum(units) / S  # all-reduce of this rank's Ψ/S gradient shard
    for rank in range(WS):
        res = runs[rank][("hsdp2", "sgd")]
        assert res["wrap"] == {("world", "broadcast")}  # every group starts from rank 0's weights
        assert len(res["by_step"]) == workers.STEPS
        for step in res["by_step"]:
            assert step == {("shard", "all_gather"): inside_ag,
                            ("shard", "reduce_scatter"): inside_rs,
                            ("replicate", "all_reduce"): across}, rank
        formula = theory.hsdp_sent_bytes([theory.UnitSize(u) for u in units[:-1]]
                                         + [theory.UnitSize(units[-1], gathered_in_backward=False)],
                                         S, WS)
        assert res["expected"]["sent_bytes_per_step"] == formula == inside_ag + inside_rs + across
    print(f"\nper rank per step: inside a group {inside_ag + inside_rs:.0f} B, "
          f"across groups {across:.0f} B (FSDP at 4 would send "
          f"{ring(WS) * 4 * (2 * sum(padded(u, WS) for u in blocks + [root]) + sum(padded(b, WS) for b in blocks)):.0f} B)")


def test_shard_size_n_is_fsdp_and_shard_size_1_is_ddp(runs):
    for rank in range(WS):
        r = runs[rank]
        hsdp4 = [sum(s.values()) for s in r[("hsdp4", "sgd")]["by_step"]]
        assert hsdp4 == [sum(s.values()) for s in r[("fsdp", "sgd")]["by_step"]]
        assert all(g == "shard" for s in r[("hsdp4", "sgd")]["by_step"] for g, _ in s)
        hsdp1 = [sum(s.values()) for s in r[("hsdp1", "sgd")]["by_step"]]
        ddp = [sum(s.values()) for s in r[("ddp", "sgd")]["by_step"]]
        assert hsdp1 == pytest.approx(ddp, rel=1e-12)
        assert r[("hsdp1", "sgd")]["expected"]["sent_bytes_per_step"] == pytest.approx(ddp[0])


# -- memory ----------------------------------------------------------------------------------------

def test_model_state_per_rank_is_fsdp_at_world_size_s(runs):
    blocks, root = _unit_numels()
    psi = sum(blocks) + root
    padded_s = sum(padded(u, S) for u in blocks + [root])
    fsdp_at_s = theory.persistent_bytes(("params", "grads", "optim"), psi, S, padded_s)
    assert fsdp_at_s == 16 * padded_s / S
    for rank in range(WS):
        res = runs[rank][("hsdp2", "adamw")]
        assert res["kept"] == res["expected"]["persistent_bytes"] == fsdp_at_s


# -- clipping --------------------------------------------------------------------------------------

def test_clip_grad_norm_equals_torch_single_process(runs):
    state, norms = hsdp_workers.reference_with_clip()
    for rank in range(WS):
        res = runs[rank][("hsdp2-clip", "sgd")]
        assert res["norms"] == pytest.approx(norms, rel=1e-5)
        assert all(n > hsdp_workers.MAX_NORM for n in norms)  # every step clipped
        # the norm's one number is summed over the shard group: replicas hold equal copies
        assert ("shard", "all_reduce") in res["by_step"][0]
    assert_states_equal(runs[0][("hsdp2-clip", "sgd")]["state"], state, TOL, "hsdp clipped")


# -- errors ----------------------------------------------------------------------------------------

def test_bad_shard_size_gives_a_clear_error(runs):
    errors = runs[0]["errors"]
    for bad in ("3", "0", "8"):
        kind, message = errors[bad]
        assert kind == "ValueError" and "divide the world size 4" in message, message
        assert "[1, 2, 4]" in message
    assert errors["2.0"][0] == "TypeError" and "int" in errors["2.0"][1]
    assert errors["None"][0] == "TypeError" and "needs shard_size" in errors["None"][1]


def test_hsdp_in_one_process_and_its_options():
    model = workers.make_odd()
    with pytest.raises(ValueError, match="divide the world size 1"):
        fsdp_mini.parallelize(model, "hsdp", shard_size=2)
    with pytest.raises(TypeError, match="allowed: .*shard_size"):
        fsdp_mini.parallelize(model, "hsdp", shard_size=1, bucket_mb=1)
    model, _ = fsdp_mini.parallelize(model, "hsdp", shard_size=1, reshard_after_forward=False)
    assert model.fsdp_mini.formulas()["memory"] == "16Ψ/S"
    assert fsdp_mini.expected_costs(model)["sent_bytes_per_step"] == 0.0


# -- two nodes under torchrun ------------------------------------------------------------------------

def _torchrun() -> list[str] | None:
    beside = Path(sys.executable).with_name("torchrun")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("torchrun")
    return [found] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(_torchrun() is None, reason="torchrun is not installed (it comes with torch; "
                    "put the environment's bin folder on PATH)")
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_nodes_under_torchrun_equal_single_process(tmp_path, references):
    """Two torchrun agents on this machine play two nodes of two ranks: HSDP with one shard group
    per node must train to the single-process weights."""
    script = Path(__file__).with_name("multinode_train.py")
    port, job = _free_port(), f"hsdp-two-nodes-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get(
               "PYTHONPATH", "")])}
    agents = []
    try:
        for node in (0, 1):
            # Note: the c10d rendezvous numbers the nodes (no --node-rank: that is the static
            # launch's); one id for this job alone; no restarts: a failure fails the test.
            cmd = _torchrun() + [
                "--nnodes", "2", "--nproc-per-node", "2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", job, "--local-addr", "127.0.0.1", "--max-restarts", "0",
                "--monitor-interval", "0.5", str(script), str(tmp_path)]
            with open(tmp_path / f"agent{node}.log", "w") as log:  # the agent keeps its own fd
                agents.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        deadline = time.monotonic() + 120
        for agent in agents:
            agent.wait(timeout=max(1.0, deadline - time.monotonic()))
        logs = "\n".join((tmp_path / f"agent{n}.log").read_text()[-3000:] for n in (0, 1))
        assert [a.returncode for a in agents] == [0, 0], logs
    finally:
        _stop(agents, tmp_path)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(4)]
    for r, res in enumerate(results):
        assert res["world_size"] == 4 and res["shard_size"] == 2
        assert res["node"] == r // 2, "ranks of one agent must be one shard group"
        assert res["shard_ranks"] == [2 * (r // 2), 2 * (r // 2) + 1]
    assert_states_equal(results[0]["state"], references[("gpt", "adamw")], TOL,
                        "two torchrun nodes, hsdp 2x2")


def _stop(agents, folder: Path) -> None:
    """No process left behind: the agents' process groups, then any rank they left."""
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)  # torchrun stops its ranks on SIGTERM
    for agent in agents:
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    for pid_file in folder.glob("pid*.txt"):  # ranks run in sessions of their own
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@pytest.mark.filterwarnings("ignore:Attempting to set identical")  # 0 bytes at 1 rank
def test_telemetry_and_plots_know_hsdp():
    """The recorder, the run state and the figures read the strategy through the registry."""
    from fsdp_mini import plots
    from fsdp_mini.telemetry import Recorder, Runs
    rec = Recorder(run="hsdp")
    model = make_model(GPTConfig.tiny())
    model, opt = fsdp_mini.parallelize(model, "hsdp", units=list(model.blocks), shard_size=1,
                                       recorder=rec)
    x, y = workers.gpt_batch(0)
    for _ in range(2):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        rec.step_end(1.0)
    rec.close()
    runs = Runs()
    runs.add(rec.events)
    run = runs.latest
    assert run.strategy == "hsdp" and run.formulas["memory"] == "16Ψ/S"
    assert run.theory_with_unit() > run.theory_persistent()
    assert len(plots.dashboard_figure(runs).axes) >= 4 and plots.comparison(runs).axes


def test_compare_runs_hsdp_only_with_a_shard_size():
    from fsdp_mini.jobs import cli
    from fsdp_mini.jobs.compare import CompareConfig

    def check(*args):
        return cli._check_args(cli._parser().parse_args(["compare", *args]))[2]

    assert check("--world-size", "4").strategies == theory.STRATEGIES  # the default is unchanged
    assert check("--world-size", "4", "--shard-size", "2").strategies == theory.STRATEGIES + ("hsdp",)
    assert check("--world-size", "4", "--shard-size", "2").shard_size == 2
    with pytest.raises(ValueError, match="hsdp needs shard_size"):
        CompareConfig(strategies=("hsdp",))
