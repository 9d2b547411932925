"""Shape inference rules (being written)."""
