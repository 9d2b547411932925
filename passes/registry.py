"""Imports every built-in pass so that each registers its name."""
from . import constant_folding, control_flow_simplify, cse, dce, inline, simplify, tuple_simplify  # noqa: F401
