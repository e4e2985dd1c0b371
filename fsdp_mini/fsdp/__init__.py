"""FSDP, the algorithm this kit is about, and its helpers.

Read ``algorithm.py`` first, top to bottom: it is the whole of FSDP (shard, unshard, reshard,
all-gather before a unit's forward and backward, reduce-scatter after its backward) in FSDP2's
words. Then the pieces it calls, one concept each: ``group.py`` (a unit's flat group: this rank's
shard, and the whole group when gathered), ``units.py`` (which module is a unit), ``prefetch.py``
(the next unit's all-gather issued early), ``whole.py`` (every parameter gathered for reading or
saving), ``meta_init.py`` (a model built on the meta device, materialised unit by unit) and
``hsdp.py`` (FSDP inside shard groups, replicated across them). May import: the floors below
(:mod:`fsdp_mini.comm`, :mod:`fsdp_mini.buffers`, :mod:`fsdp_mini.precision`, ``memory``,
``strategy``, ``theory``, ``clip``), never ``ddp`` or ``zero``, never the plumbing.
"""
