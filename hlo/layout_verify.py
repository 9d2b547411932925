"""Verifier rules that look at layouts: a ``bitcast`` must be a pure reinterpretation.

XLA only allows a bitcast where no data moves: the same byte size, read back in the
result's physical order. The element type may change only between types of the same width
with the same element count (XLA's simplifier turns such a ``bitcast-convert`` into a
``bitcast``; XLA:CPU prints them in sort comparators); changing the byte size never.
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
    if x.dtype != r.dtype and x.dtype.bits != r.dtype.bits:
        raise ShapeError(f"bitcast: changes the element width ({x.dtype.name} to {r.dtype.name}); "
                         "use bitcast-convert")
    if x.size != r.size:
        raise ShapeError(f"bitcast: operand {x} has {x.size} elements but result {r} has "
                         f"{r.size}; a bitcast cannot change the byte size")
