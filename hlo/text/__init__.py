"""HLO text format: printer and parser."""
