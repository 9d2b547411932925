"""Verifier rules that look at layouts: a ``bitcast`` must be a pure reinterpretation.

XLA only allows a bitcast where no data moves: the same element type and the same number
of elements (so the same byte size), read back in the result's physical order. Changing
the element type is ``bitcast-convert``'s job; changing the byte size is never allowed.
"""
from __future__ import annotations

from .errors import ShapeError
from .ir import Instruction
from .ops import rule


@rule("verify", "bitcast")
def _verify_bitcast(inst: Instruction) -> None:
    x, r = inst.operands[0].shape, inst.shape
    if x.is_tuple or r.is_tuple:
        raise ShapeError("bitcast: operand and result must be arrays, not tuples")
    if x.dtype != r.dtype:
        raise ShapeError(f"bitcast: changes the element type {x.dtype.name} to {r.dtype.name} "
                         "(use bitcast-convert)")
    if x.size != r.size:
        raise ShapeError(f"bitcast: operand {x} has {x.size} elements but result {r} has "
                         f"{r.size}; a bitcast cannot change the byte size")
