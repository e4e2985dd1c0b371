"""Training jobs, ready to run: what the demo, the labs and ``fsdp-mini compare`` launch.

    fsdp_mini.launch(train_gpt, 4, "fsdp", monitor=Dashboard())   # one strategy, watched live
    fsdp-mini compare --world-size 4                             # every strategy, one table

Files: gpt (``train_gpt``, ``train_strategies``), compare (the main job, run on every rank), peaks
(one step's peak per rank under a strategy and its options: what the planner is checked against),
render_labs (the executed HTML copies of the labs, ``fsdp-mini render-labs``), cli (the
``fsdp-mini`` command). May import: everything else; it is the top of the house.
"""

from .gpt import train_gpt, train_strategies

__all__ = ["train_gpt", "train_strategies"]
