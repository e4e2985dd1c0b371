"""Communication: every collective the engine issues, and what it costs.

``collectives.py`` holds :class:`Comm`, the one door every all-gather, reduce-scatter, all-reduce
and broadcast of the strategies goes through; ``ledger.py`` writes each one down with the bytes
the algorithm moves (logical ring bytes, whatever the backend does on the wire); ``link.py`` is
the simulated network that makes each collective take its α-β time; ``check.py`` is the debug
mode in which ranks compare every collective before issuing it, so a mismatch fails fast instead
of hanging; ``p2p.py`` holds point-to-point messages written down as they go (the peer, which
part of a tensor, whether waited for), for code that sends and receives by hand. May import:
torch and one another, nothing else of the kit (it is the ground floor).
"""
