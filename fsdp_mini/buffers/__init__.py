"""Buffers: where the strategies keep parameters and gradients between collectives.

``flat.py`` lays many parameters end to end in one padded 1-D tensor and cuts it into N equal
shards; ``absent.py`` marks "no gradient here" inside the gradient itself; ``buckets.py`` groups
gradients so communication starts while backward still runs; ``accumulate.py`` keeps gradients on
the rank between micro-batches (``no_sync``); ``offload.py`` keeps shards in CPU memory. May
import: :mod:`fsdp_mini.comm`, :mod:`fsdp_mini.memory` and one another, never a strategy.
"""
