"""The README's picture of the per-rank memory dashboard, remade from a real run.

    python slides/readme_figure.py            # writes slides/dashboard.png (about 30 s)

Trains the kit's default GPT under fsdp on 4 gloo ranks (one NCCL rank per GPU on a box with
two GPUs or more) with a telemetry Recorder, and draws, with ``fsdp_mini.plots``, what the
dashboard shows: each rank's memory at its peak by category beside the ZeRO formula, and rank
0's memory over two steps (the saw-tooth of units gathered and freed).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from matplotlib.figure import Figure

import fsdp_mini
from fsdp_mini import plots
from fsdp_mini.jobs.gpt import train_gpt
from fsdp_mini.launcher.inputs import pick_backend
from fsdp_mini.telemetry import load_events

OUT = Path(__file__).resolve().parent / "dashboard.png"


def main(out: Path = OUT) -> Path:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world_size = gpus if gpus >= 2 else 4
    with tempfile.TemporaryDirectory() as folder:
        fsdp_mini.launch(train_gpt, world_size, "fsdp", 4, "default", 2 * world_size,
                         env={"FSDP_MINI_EVENTS_DIR": folder},
                         backend=pick_backend(None, world_size), timeout=300)
        run = plots.as_run(load_events(folder))
    figure = Figure(figsize=(14, 4.2), layout="constrained")
    bars, timeline = figure.subplots(1, 2, width_ratios=(1, 1.25))
    plots.memory_bars(run, bars)
    plots.memory_timeline(run, timeline)
    figure.suptitle(f"fsdp on {run.world_size} ranks ({run.device}/{run.backend}), the kit's GPT "
                    f"of {run.params / 1e6:.2f} M parameters: memory per rank", fontsize=12)
    figure.savefig(out, dpi=90)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
