"""Comparisons used by several test files."""

import math

import torch


def relative_errors(state: dict, reference: dict) -> dict[str, tuple[float, float]]:
    """Per tensor: (||a - b|| / ||b||, max|a - b| / max|b|)."""
    out = {}
    for name, ref in reference.items():
        diff = (state[name].double() - ref.double())
        scale_norm = ref.double().norm().item() or 1.0
        scale_max = ref.double().abs().max().item() or 1.0
        out[name] = (diff.norm().item() / scale_norm, diff.abs().max().item() / scale_max)
    return out


def padded(numel: int, world_size: int) -> int:
    return math.ceil(numel / world_size) * world_size


def ring(world_size: int) -> float:
    return (world_size - 1) / world_size


def assert_states_equal(state: dict, reference: dict, tol: float, what: str) -> float:
    assert list(state) == list(reference), f"{what}: keys differ"
    errors = relative_errors(state, reference)
    worst = max(errors, key=lambda k: errors[k][0])
    assert errors[worst][0] <= tol, f"{what}: {worst} differs by {errors[worst]} (tol {tol})"
    return errors[worst][0]


def trainable_numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values()
               if p.requires_grad)


def notebook_kernel(tmp_path, monkeypatch) -> str:
    """A kernelspec for this very interpreter, under a name no other installation can shadow;
    returns its name (for nbclient.NotebookClient(kernel_name=...))."""
    import os

    from ipykernel import kernelspec
    name = f"fsdp-mini-test-{os.getpid()}"
    kernelspec.install(kernel_name=name, prefix=str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter" / "share" / "jupyter"))
    return name


def record_one_tiny_step(recorder) -> None:
    """One training step of the tiny GPT under the "single" strategy, recorded by ``recorder``,
    which is then closed: its events are what a real run would write."""
    import fsdp_mini
    from fsdp_mini.models import GPTConfig, make_model
    model, opt = fsdp_mini.parallelize(make_model(GPTConfig.tiny()), "single", recorder=recorder)
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    recorder.step_end(1.0)
    recorder.close()
