"""Imports every built-in pass so that each registers its name."""
from . import cse, dce, simplify  # noqa: F401
