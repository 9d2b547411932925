"""Imports every rule module so that each opcode's ``evaluate`` is registered."""
from . import elementwise, data_movement, reductions, linalg, control, collectives  # noqa: F401
from . import rng, custom_calls  # noqa: F401
