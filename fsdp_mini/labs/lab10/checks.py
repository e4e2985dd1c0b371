"""Lab 10, the check of ``port_to_fsdp2``: beside the reference port on 1-4 ranks, a GPT whose
LayerNorms are shorter than N and the lab's, fp32 and bf16, 4 steps, compared on what FSDP2 made
of each (:mod:`fsdp_mini.debug.fsdp2_view`: units, policies, placements, the optimizer and every
setting of it), then each step's collectives, loss and each rank's shards of the weights.
"""

from __future__ import annotations

import traceback

import torch

from ...debug.dispatch_bytes import CollectiveBytes
from ...debug.fsdp2_view import held_by, local_weights, optimizer_settings, placements, units
from ...launcher.torchrun_cell import torchrun
from ...models import GPTConfig, SyntheticText, make_model
from ..common.differential import Check, Hint, spread
from ..common.exercise import load_solution, not_written_yet
from ..common.report import CheckResult, verdict_of_check

__all__ = ["check_port_to_fsdp2", "torchrun"]

STEPS, NETS = 4, {"small": GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=1, n_embd=3),
        "tiny": GPTConfig.tiny()}   # small: a LayerNorm of 3 values, less than N = 4 ranks


def _observe(port, cfg, record) -> None:
    torch.set_num_threads(1)
    gpt, n, rank = NETS[cfg["net"]], cfg["world_size"], record.rank
    dtype, net = {"bf16": {"param_dtype": torch.bfloat16}}.get(cfg["dtype"], {}), make_model(gpt)
    try:
        got = port(net, **dtype, **({"lr": cfg["lr"]} if cfg.get("lr") else {}))
    except Exception as e:  # noqa: BLE001  (the learner's code: what it made so far, then why)
        record.fail(e, traceback.format_exc())
        record.error = (record.error[0], str(e).split("\n")[0][:300], record.error[2])
        return record.see("units", ", ".join(units(net)), step=0) if units(net) else None
    if not (isinstance(got, tuple) and len(got) == 2):
        return record.see("returned", f"a {type(got).__name__}, not (model, optimizer)", step=0)
    model, opt = got
    for name, value in (("units", ", ".join(units(model)) or "none"), ("policies", units(model)),
                        ("placements", placements(model)), ("optimizer class", type(opt).__name__),
                        ("optimizer", optimizer_settings(opt)), ("holds", held_by(opt, model))):
        record.see(name, value, step=0)
    data = SyntheticText(gpt.vocab_size, gpt.block_size)
    for step in range(1, STEPS + 1):
        x, y = data.local_batch(step, 12, rank, n)
        with CollectiveBytes(n) as sent:
            loss = model(x, y)[1]
            loss.backward()
            opt.step()
            opt.zero_grad()
        record.see("collectives", tuple(sorted(sent.calls)), step=step)
        record.see("loss", loss.item(), step=step)
        record.see("weights", local_weights(model), step=step)


def _configs(world_size: int = 2) -> list:
    # Note: an lr other than AdamW's default, given as the notebook can give it
    return spread(world_size=[1, 2, 3, 4], dtype=["fp32", "bf16"], net=["small"]) + \
        spread(world_size=[2], dtype=["fp32"], net=["small"], lr=[0.02]) + \
        spread(world_size=[world_size], dtype=["fp32", "bf16"], net=["tiny"])


HINTS = [
    Hint(lambda d: d.raised and "forward" in d.raised[1], "fully_shard(model.blocks) wraps the "
         "ModuleList, which has no forward: wrap each block (`for block in model.blocks: "
         "fully_shard(block)`), then fully_shard(model)"),
    Hint(lambda d: d.observable == "returned", "return model, optimizer"),
    Hint(lambda d: d.observable == "units" and "root" not in d.mine, "fully_shard(model) is "
         "missing: the embeddings, the final norm and the head stay whole on every rank and "
         "their gradients are never averaged; call it once, after the blocks"),
    Hint(lambda d: d.observable == "units" and len(d.mine) > len(d.want), "smaller units than "
         "the blocks: more, smaller collectives, each paying its latency; one unit per block"),
    Hint(lambda d: d.observable == "units", "each block a unit (fsdp_mini's units=list("
         "model.blocks)): fully_shard(block) for each, then fully_shard(model), the blocks first"),
    Hint(lambda d: d.observable == "policies" and "one unit with" in d.path, "fully_shard of "
         "a list makes its modules one unit (one all-gather and one reduce-scatter for all of "
         "them): call fully_shard(block) on each block, then fully_shard(model)"),
    Hint(lambda d: d.observable == "optimizer" and d.config.get("lr"), "the optimizer was "
         "built with another learning rate than the lr passed in ({lr:g} here): "
         "torch.optim.AdamW(model.parameters(), lr=lr)"),
    Hint(lambda d: d.observable == "policies" and "reshard" in d.path, "the default reshard_"
         "after_forward=True: False keeps each block whole from forward to backward"),
    Hint(lambda d: d.observable == "policies" and "reduce_dtype" in d.path, "reduce the "
         "gradients in fp32: MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype="
         "torch.float32); a sum of N bf16 gradients loses precision"),
    Hint(lambda d: d.observable == "policies", "the same mp_policy on every fully_shard call: "
         "MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) when "
         "param_dtype is given, the default policy when it is None (a cast model is no policy)"),
    Hint(lambda d: d.observable == "placements", "a parameter not a DTensor was left out of "
         "every fully_shard call: the blocks, then the root, cover every parameter"),
    Hint(lambda d: d.observable == "holds", "fully_shard replaces every parameter by a DTensor: "
         "build the optimizer after it, from model.parameters()"),
    Hint(lambda d: d.observable.startswith("optimizer"), "torch.optim.AdamW(model.parameters(), "
         "lr=lr) and nothing else: the lr argument, every other setting its default"),
]
WORDS = {"units": "the FSDP units", "policies": "the units' policies", "optimizer class":
         "the optimizer", "optimizer": "the optimizer's settings", "holds": "what the optimizer "
         "holds", "returned": "what port_to_fsdp2 returned", "weights": "rank {rank}'s shards of "
         "the weights after step {step}", **{k: f"rank {{rank}}'s {k} in step {{step}}" for k in (
             "collectives", "loss")}}
PORT = Check("your port to FSDP2", _observe, [], ("returned", "units", "policies", "placements",
             "optimizer class", "optimizer", "holds", "collectives", "loss", "weights"),
             {"loss": 1e-4, "weights": 1e-4}, WORDS, HINTS, "the same units, policies, "
             "placements and optimizer as the reference port, and the same training",
             on_ranks=True, timeout=30)


@verdict_of_check
def check_port_to_fsdp2(fn, world_size: int = 2) -> CheckResult:  # the lab's GPT at world_size
    result = CheckResult(PORT.what)
    if not_written_yet(fn):
        return result.wrong("not written yet", hint="replace `...` with your code, run the cell, "
                            "then this check").finish()
    return PORT(fn, load_solution("10_port_to_fsdp2", "port_to_fsdp2"), result,
                _configs(world_size)).finish()


# What tests/wrong_answers/ judges many answers with: the port's check, one batch
JUDGES = {"10_port_to_fsdp2": lambda answers: PORT.judge_many(
    answers, load_solution("10_port_to_fsdp2", "port_to_fsdp2"), _configs())}
