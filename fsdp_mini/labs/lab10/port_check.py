"""Lab 10's exercise checker: your ``port_to_fsdp2`` (fsdp_mini's ``units=`` with torch's
``fully_shard``) run on 2 ranks, judged in plain words, beside fsdp_mini's ``fsdp``.

    labs.check_port_to_fsdp2(port_to_fsdp2)     # ✔/✘ lines: units, optimizer, dtype, training
"""

from __future__ import annotations

import traceback
from contextlib import nullcontext
from functools import partial

import torch

from ..common.checking import run_ranks, where
from ..common.report import CheckResult
from .dispatch_bytes import CollectiveBytes
from .four_jobs import build

__all__ = ["check_port_to_fsdp2", "judge_port", "port_runs"]


# -- the checker of the exercise ---------------------------------------------------------------------

STEPS = 3


def check_port_to_fsdp2(fn, world_size: int = 2) -> CheckResult:
    """Your ``port_to_fsdp2(model, param_dtype=None, lr=1e-3)`` on ``world_size`` ranks: which
    modules it made units, whether the optimizer holds the sharded parameters, whether the
    blocks compute in ``param_dtype`` when asked, and whether it trains like fsdp_mini's fsdp
    (``units=list(model.blocks)``) on the same data, in fp32 and in bf16."""
    from ..common.checking import unwritten
    result = CheckResult(f"your port to FSDP2 ({getattr(fn, '__name__', fn)})")
    if unwritten(fn):
        return result.wrong("not written yet", hint="replace `...` with your code, run the cell, "
                            "then this check").finish()
    runs = run_ranks(result, _port_run, world_size, fn)
    return result.finish() if runs is None else judge_port(result, runs[0])


def judge_port(result: CheckResult, runs: dict) -> CheckResult:
    """The ✔/✘ lines for one rank's ``{case: run}`` of :func:`port_runs` (fp32, then bf16)."""
    for case, run in runs.items():
        if not _judge_port(result, case, run, runs.get("fp32", {})):
            break
    result.facts.update(runs)
    return result.finish()


def port_runs(rank, world_size, fns):
    """Several ports in one launch (the tests): ``[_port_run(fn) for fn in fns]``."""
    return [_port_run(rank, world_size, fn) for fn in fns]


def _judge_port(result: CheckResult, case: str, run: dict, fp32: dict) -> bool:
    asked = "" if case == "fp32" else ", param_dtype=torch.bfloat16"
    if "error" in run and "containers that do not implement forward" in run["error"]:
        result.wrong("you called fully_shard on model.blocks, the ModuleList, and torch refused: "
                     "a ModuleList has no forward of its own, so FSDP2 has no moment to gather "
                     "it (and it would make all the blocks one unit)", hint="wrap each block: "
                     "`for block in model.blocks: fully_shard(block)`, then fully_shard(model)")
        return False
    if "error" in run and run.get("root_first"):
        result.wrong(f"port_to_fsdp2(model{asked}) raised {run['error']}: you wrapped the root "
                     f"before the blocks; fully_shard(model) takes every parameter not yet in a "
                     f"unit, the blocks' too, so a block cannot become a unit after it",
                     hint="the blocks first (`for block in model.blocks: fully_shard(block)`), "
                     "then fully_shard(model), as fsdp_mini's units=list(model.blocks)")
        return False
    if "error" in run:
        result.wrong(f"port_to_fsdp2(model{asked}) raised {run['error']}")
        return False
    if "returned" in run:
        result.wrong(f"port_to_fsdp2 returned {run['returned']}, not (model, optimizer)",
                     hint="return model, optimizer")
        return False
    units, blocks, n = run["units"], run["blocks"], len(run["blocks"])
    if run["module_list"]:
        result.wrong("you called fully_shard on model.blocks, the ModuleList: all the blocks "
                     f"became one unit ({run['gathers']} all-gathers per step instead of "
                     f"{run['want_gathers']})", hint="a ModuleList only holds the blocks; wrap "
                     "each block: `for block in model.blocks: fully_shard(block)`")
        return False
    if not run["root"]:
        result.wrong("the root is not wrapped: fully_shard(model) was not called, so the "
                     "embeddings, the final norm and the head stay whole on every rank and their "
                     "gradients are never averaged", hint="after the blocks, call "
                     "fully_shard(model) once, on the whole model (fsdp_mini's root unit)")
        return False
    if not all(blocks) and run["gathers"] > run["want_gathers"]:
        result.wrong(f"{sum(blocks)} of the {n} blocks are units, and the units are smaller than "
                     f"the blocks ({_gathers(run['gathers'])} per step instead of "
                     f"{run['want_gathers']}): more, smaller collectives than fsdp_mini's units, "
                     f"each paying its latency", hint="one unit per block: `for block in "
                     "model.blocks: fully_shard(block)`, then fully_shard(model)")
        return False
    if not all(blocks):
        result.wrong(f"{sum(blocks)} of the {n} blocks are units: the rest of the model is one "
                     f"unit, gathered whole ({_gathers(run['gathers'])} per step instead of "
                     f"{run['want_gathers']}); each rank then holds every block's full weights "
                     f"at once, which is what FSDP avoids", hint="call fully_shard on each block "
                     "first, then on the model (as fsdp_mini's units=list(model.blocks))")
        return False
    if run["stale"]:
        result.wrong(f"the optimizer holds {run['stale']} parameters the model no longer uses: it "
                     f"was built before fully_shard, which replaces every parameter by a new "
                     f"DTensor parameter, so optimizer.step() never changes the model",
                     hint="build the optimizer after the fully_shard calls, from model.parameters()")
        return False
    if run.get("optimizer", "AdamW") != "AdamW":
        result.wrong(f"the optimizer is {run['optimizer']}: fsdp_mini's fsdp, the run to match, "
                     f"trains with AdamW", hint="torch.optim.AdamW(model.parameters(), lr=lr)")
        return False
    if run.get("lr", 1e-3) != 1e-3:
        result.wrong(f"the optimizer's lr is {run['lr']:g}, not the lr argument (1e-3 here): the "
                     f"learning rate is hard-coded", hint="AdamW(model.parameters(), lr=lr)")
        return False
    if "train_error" in run:
        mixed = "same dtype" in run["train_error"] and case != "fp32"
        result.wrong(f"{case}: training raised {run['train_error']}" + (
            ": the units do not all compute in the same dtype (a policy on some fully_shard "
            "calls only: the root casts its inputs to bf16, a unit without the policy keeps fp32 "
            "weights)" if mixed else ""), hint="give every fully_shard call the same mp_policy"
            if mixed else "the line above says which; fix it and run the check again")
        return False
    if run["gathers"] != run["want_gathers"]:
        kept = run["gathers"] < run["want_gathers"]
        result.wrong(f"{case}: {_gathers(run['gathers'])} per step instead of fsdp_mini's "
                     f"{run['want_gathers']}" + (
                         ": the blocks are not gathered again in backward "
                         "(reshard_after_forward=False keeps every block whole from its forward to "
                         "its backward: the memory FSDP saves is spent)" if kept else ""),
                     hint="fully_shard(block) with its default reshard_after_forward=True, as "
                     "fsdp_mini's units free each block after its forward")
        return False
    result.ok(f"{case}: {units} units ({n} blocks + the root), {run['gathers']} all-gathers per "
              f"step as fsdp_mini's fsdp; the optimizer holds the {run['params']} sharded "
              f"(DTensor) parameters")
    want = "torch.float32" if case == "fp32" else "torch.bfloat16"
    if run["compute_dtype"] != want:
        result.wrong(f"{case}: the blocks compute in {run['compute_dtype']}, but {want} was asked"
                     f"{asked and ' (param_dtype=torch.bfloat16)'}",
                     hint="pass mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, "
                     "reduce_dtype=torch.float32) to every fully_shard call when param_dtype is "
                     "given, and no policy (or the default one) when it is None")
        return False
    rs, rs32 = run["sent"].get("reduce_scatter", 0), fp32.get("sent", {}).get("reduce_scatter", 0)
    if case != "fp32" and rs < rs32:   # Note: fp32 gradients reduce-scatter as many bytes as fp32
        result.wrong(f"{case}: the gradients are reduce-scattered in bf16 ({rs:,.0f} B per step "
                     f"against {rs32:,.0f} B in fp32): your MixedPrecisionPolicy has no "
                     f"reduce_dtype=torch.float32, so it reduces in param_dtype, and the sum of "
                     f"N gradients loses precision", hint="mp_policy=MixedPrecisionPolicy("
                     "param_dtype=param_dtype, reduce_dtype=torch.float32)")
        return False
    tol = 1e-4 if case == "fp32" else 2e-2
    return result.check(run["loss_diff"] <= tol,
                        f"{case}: trains like fsdp_mini's fsdp on the same data ({STEPS} steps, "
                        f"largest relative loss difference {run['loss_diff']:.1e}); "
                        f"blocks compute in {want}",
                        f"{case}: its losses differ from fsdp_mini's by {run['loss_diff']:.2g} "
                        f"(relative): {run['losses']} against {run['reference']}",
                        hint="AdamW(model.parameters(), lr=lr), nothing else changed")


def _gathers(n: int) -> str:
    return f"{n} all-gather" + ("s" if n != 1 else "")


def _note_dtype(seen: list, module, args) -> None:
    seen.append(str(module.weight.dtype))  # the weight a unit computes with, inside forward


def _port_run(rank, world_size, fn):
    from torch.distributed.fsdp import FSDPModule

    from ...models import GPTConfig, SyntheticText, make_model
    torch.set_num_threads(1)
    cfg = GPTConfig.tiny()
    data = SyntheticText(cfg.vocab_size, cfg.block_size)
    batches = [data.local_batch(s, 4, rank, world_size) for s in range(STEPS)]
    out = {}
    for case, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        net = make_model(cfg)
        blocks, module_list = list(net.blocks), net.blocks
        try:
            got = fn(net) if dtype is None else fn(net, param_dtype=dtype)
        except Exception as e:  # noqa: BLE001  (the learner's code: any error is a ✘ line)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            out[case] = {"error": f"{type(e).__name__}: {first}{where(traceback.format_exc())}",
                         "root_first": isinstance(net, FSDPModule)
                         and not any(isinstance(b, FSDPModule) for b in blocks)}
            break
        if not (isinstance(got, tuple) and len(got) == 2):
            out[case] = {"returned": type(got).__name__}
            break
        model, opt = got
        run = {"root": isinstance(model, FSDPModule), "module_list": isinstance(module_list,
               FSDPModule), "blocks": [isinstance(b, FSDPModule) for b in blocks],
               "want_gathers": 2 * len(blocks) + 1}
        run["units"] = sum(run["blocks"]) + run["root"] + run["module_list"]
        live = {id(p) for p in model.parameters()}
        held = [p for g in opt.param_groups for p in g["params"]]
        run["stale"], run["params"] = sum(id(p) not in live for p in held), len(held)
        run["optimizer"] = type(opt).__name__
        run["lr"] = float(opt.param_groups[0].get("lr", 1e-3)) if opt.param_groups else 1e-3
        seen = []
        linear = next(m for m in blocks[0].modules() if isinstance(m, torch.nn.Linear))
        hook = linear.register_forward_pre_hook(partial(_note_dtype, seen))
        losses = []
        try:
            for s, (x, y) in enumerate(batches):
                with (CollectiveBytes(world_size) if s == STEPS - 1 else nullcontext()) as sent:
                    _, loss = model(x, y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                losses.append(loss.item())
        except Exception as e:  # noqa: BLE001  (a port that cannot train: a ✘ line)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            run["train_error"] = f"{type(e).__name__}: {first}"
            out[case] = run
            break
        finally:
            hook.remove()
        run.update(gathers=sent.count("all_gather"), compute_dtype=seen[0], losses=losses,
                   sent=sent.totals())
        ref_model, ref_opt = build("fsdp_mini fsdp", make_model(cfg), param_dtype=dtype)
        ref = []
        for x, y in batches:
            _, loss = ref_model(x, y)
            loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            ref.append(loss.item())
        run["reference"] = ref
        run["loss_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        out[case] = run
    return out
