"""Shape inference for every HLO opcode, attached to the op table as ``OpDef.infer``.

Rules: ``(operand_shapes, attrs) -> AnyShape`` (collectives whose result depends on the
module's replica/partition counts also accept ``module=``). Inferred shapes carry no
layout. Ops whose result is not a function of operands and attributes (parameter,
constant, reshape, broadcast, convert, custom-call, ...) raise ``ShapeRequired`` (a
``ShapeError``) telling the caller to pass ``shape=``; for those, ``RESULT_CHECKS`` holds
what can still be checked about a given result shape.

Split by op family: elementwise, data_movement, reductions, linalg, control, collectives.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..errors import ShapeError
from ..ops import OPS, get_op
from ..shape import AnyShape
from . import collectives, control, data_movement, elementwise, linalg, reductions  # noqa: F401
from ._common import RESULT_CHECKS, ShapeRequired

__all__ = ["infer", "check_result", "ShapeRequired", "ShapeError", "RESULT_CHECKS",
           "missing_rules"]


def infer(opcode: str, operand_shapes: Sequence[AnyShape], attrs: dict[str, Any],
          module: Optional[Any] = None) -> AnyShape:
    """The inferred result shape of ``opcode`` (layout-free); ``module`` supplies replica
    and partition counts to the collectives that need them."""
    op = get_op(opcode)
    if op.infer is None:
        raise ShapeError(f"{opcode}: no shape inference rule; pass shape=")
    if getattr(op.infer, "wants_module", False):
        return op.infer(list(operand_shapes), attrs, module=module)
    return op.infer(list(operand_shapes), attrs)


def check_result(opcode: str, operand_shapes: Sequence[AnyShape], attrs: dict[str, Any],
                 result: AnyShape) -> None:
    """Raise ShapeError if ``result`` cannot be the result of an op whose shape is not
    inferred (reshape element counts, broadcast dimension sizes, convert dims, ...)."""
    fn = RESULT_CHECKS.get(opcode)
    if fn is not None:
        fn(list(operand_shapes), attrs, result)


def missing_rules() -> list[str]:
    """Opcodes without an ``infer`` rule (should be empty)."""
    return sorted(name for name, op in OPS.items() if op.infer is None)
