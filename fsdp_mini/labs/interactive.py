"""Interactive multi-rank mode for the labs (being written)."""
