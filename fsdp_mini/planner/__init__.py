"""The planner: will a job fit, and what will a step send, before any GPU is rented.

``plan.py`` holds ``plan(...)`` and its table (memory and traffic per strategy from the ZeRO
formulas of :mod:`fsdp_mini.theory`, times on a :class:`~fsdp_mini.comm.link.Link`);
``shapes.py`` says how many parameters a transformer has, in which tensors, and what one
micro-batch's activations weigh. May import: :mod:`fsdp_mini.comm`, ``memory`` and ``theory``;
it runs no model and imports no strategy.
"""
