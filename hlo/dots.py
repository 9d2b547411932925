"""Dimension roles of a ``dot`` instruction, shared by the passes and the kernel generators."""
from __future__ import annotations

from hlo.ir import Instruction


def dot_dims(inst: Instruction) -> tuple[list[int], list[int], list[int], list[int], list[int],
                                         list[int]]:
    """(lhs batch, rhs batch, lhs contracting, rhs contracting, lhs free, rhs free), each in
    the order the attributes (or, for free dims, the operand) give them."""
    a = inst.attrs
    lb, rb = list(a.get("lhs_batch_dims", ())), list(a.get("rhs_batch_dims", ()))
    lc, rc = list(a.get("lhs_contracting_dims", ())), list(a.get("rhs_contracting_dims", ()))
    lhs, rhs = inst.operands
    lf = [d for d in range(len(lhs.shape.dims)) if d not in lb and d not in lc]
    rf = [d for d in range(len(rhs.shape.dims)) if d not in rb and d not in rc]
    return lb, rb, lc, rc, lf, rf
