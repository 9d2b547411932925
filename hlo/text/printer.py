"""HLO text printer (being written)."""
