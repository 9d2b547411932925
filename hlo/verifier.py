"""Verifier (being written)."""
def verify(module):
    raise NotImplementedError
