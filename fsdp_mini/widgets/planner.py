"""The planner as a widget: move a slider, see which strategies still fit.

    from fsdp_mini.widgets.planner import Planner
    Planner()          # in a notebook cell: controls, stacked bars per strategy, a table

Controls: model (a preset or a parameter count), GPUs, GPU memory, the GPU (its FLOP/s and
NVLink), precision, the dtype gradients are reduced in, micro-batch, activation checkpointing,
offload, the bandwidth across nodes, and a training budget: tokens and your price per GPU-hour
(none is built in), for the time to train, GPU-hours and cost. Every change re-plans
(:func:`fsdp_mini.plan`) and redraws the bars of :func:`fsdp_mini.plots.plan_bars` as a PNG in
an ``Image`` widget (no ipympl needed: it updates in any front-end); ``figure`` keeps the last
matplotlib Figure for slides and static exports.
"""

from __future__ import annotations

import io

import ipywidgets as W

from .. import plots
from ..planner import hardware
from ..planner.plan import PRECISIONS, plan
from ..planner.table import format_plan
from ..planner.shapes import PRESETS

PARAM_CHOICES = {"1B (params only)": 1e9, "7B (params only)": 7e9, "13B (params only)": 13e9,
                 "70B (params only)": 70e9}


LINK_GBS = (1, 2, 5, 10, 25, 50, 100, 200, 400, 1000)  # link bandwidths offered, GB/s
TOKENS = (1e9, 1e10, 1e11, 3e11, 1e12, 2e12, 5e12, 1e13)  # training budgets offered


class Planner(W.VBox):
    """Sliders and drop-downs → :func:`fsdp_mini.plan` → stacked bars and a table."""

    def __init__(self, model: str = "7b", gpus: int = 8, gpu_mem_gb: float = 80.0,
                 precision: str = "bf16-mixed"):
        super().__init__()
        c = self.controls = {
            "model": W.Dropdown(options=list(PRESETS) + list(PARAM_CHOICES), value=model,
                                description="model"),
            "gpus": W.IntSlider(value=gpus, min=1, max=1024, description="GPUs"),
            "gpu_mem_gb": W.FloatSlider(value=gpu_mem_gb, min=8, max=192, step=8,
                                        description="GPU GB"),
            "gpu": W.Dropdown(options=list(hardware.GPUS), value=hardware.DEFAULT_GPU,
                              description="GPU"),
            "precision": W.Dropdown(options=list(PRECISIONS), value=precision,
                                    description="precision"),
            "reduce_dtype": W.Dropdown(options=["fp32", "bf16"], value="fp32",
                                       description="reduce in"),
            "micro_batch": W.IntSlider(value=1, min=1, max=16, description="micro-batch"),
            "checkpointing": W.Checkbox(value=False, description="activation checkpointing"),
            "offload": W.Checkbox(value=False, description="offload sharded state"),
            # Note: round values, not a log slider: a log slider snaps 50 to 10^1.7 = 50.12 in the
            # browser and sends that back, so the table would not be plan(bandwidth_gbs=50)'s.
            "bandwidth_gbs": W.SelectionSlider(options=LINK_GBS, value=50,
                                               description="nodes GB/s"),
            "train_tokens": W.SelectionSlider(options=[(f"{t:.0e}", t) for t in TOKENS],
                                              value=1e12, description="tokens"),
            # Note: no price is built in: empty until the user types theirs
            "price_per_gpu_hour": W.Text(value="", placeholder="your price per GPU-hour",
                                         description="price"),
        }
        self.image = W.Image(format="png")
        self.table = W.HTML()
        self.plan = None
        self.figure = None
        for control in c.values():
            control.observe(lambda _: self.redraw(), names="value")
        self.children = [W.HBox([W.VBox(list(c.values())[:7]), W.VBox(list(c.values())[7:])]),
                         self.image, self.table]
        self.redraw()

    def arguments(self) -> dict:
        c = {k: w.value for k, w in self.controls.items()}
        price = c["price_per_gpu_hour"].strip()
        try:
            c["price_per_gpu_hour"] = float(price) if price else None
        except ValueError:
            raise ValueError(f"price {price!r} is not a number: type your price of one GPU-hour, "
                             f"e.g. 2.5") from None
        model = c.pop("model")
        source = ({"params": PARAM_CHOICES[model]} if model in PARAM_CHOICES
                  else {"model": model})
        return {**source, **c}  # Note: hsdp's shard groups: the planner's default, a node

    def redraw(self) -> None:
        """Re-plan from the controls and redraw the bars and the table."""
        try:
            self.plan = plan(**self.arguments())
        except ValueError as err:  # Note: a price typed half-way ("2.", "abc") says so, once
            self.table.value = f"<pre style='font-size:11px'>planner: {err}</pre>"
            return
        self.figure = plots.plan_bars(self.plan)
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=90)
        self.image.value = buf.getvalue()
        self.table.value = f"<pre style='font-size:11px'>{format_plan(self.plan)}</pre>"

    def bar_totals(self) -> dict[str, float]:
        """The height of each strategy's bar (predicted peak bytes per GPU), as drawn."""
        ax = self.figure.axes[0]
        names = list(self.plan.strategies)  # drawn left to right in this order
        totals = dict.fromkeys(self.plan.strategies, 0.0)
        for patch in ax.patches:
            i = round(patch.get_x() + patch.get_width() / 2)
            totals[names[i]] += float(patch.get_height())
        return totals
