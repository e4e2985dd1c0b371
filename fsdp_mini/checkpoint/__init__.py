"""Checkpoints: save at one world size and strategy, resume at any other.

``save_load.py`` holds ``save_checkpoint`` and ``load_checkpoint`` (the pieces each rank holds go
out as they are and come back as each rank's new pieces); ``whole.py`` is their currency (per
original parameter name, the whole tensor); ``atomic.py`` writes a folder so that it is complete
or absent and touches nothing the kit did not write; ``files.py`` reads folders back with errors
that say what is wrong; ``dcp.py`` saves and loads the folders of ``torch.distributed.checkpoint``
(DCP), so that torch's ``fully_shard`` resumes from the kit's checkpoints and the kit from its.
May import: :mod:`fsdp_mini.comm`, ``strategy``, ``wrap`` and ``file_lock`` (and torch's DCP),
never a strategy's own module, never the plumbing.
"""
