"""HLO text parser (being written)."""
def parse_hlo(text, filename=None):
    raise NotImplementedError


def parse_shape(text):
    raise NotImplementedError
