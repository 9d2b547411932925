"""Helpers shared by the shape inference rule modules.

Every rule has the signature ``(operand_shapes, attrs) -> AnyShape``; a few collectives
also accept ``module=`` (the replica/partition counts decide their result when
``replica_groups`` is empty) and say so with ``wants_module``.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import ShapeError
from ..ops import rule
from ..shape import AnyShape, Shape, TupleShape


class ShapeRequired(ShapeError):
    """The result cannot be derived from operands and attributes: pass ``shape=``.

    The verifier skips the shape comparison for these ops and runs the op's own
    consistency checks instead.
    """


def infer(*opcodes: str, wants_module: bool = False) -> Callable:
    """Register an inference rule for ``opcodes`` (``@rule("infer", ...)`` plus a flag)."""
    def deco(fn: Callable) -> Callable:
        fn.wants_module = wants_module  # type: ignore[attr-defined]
        return rule("infer", *opcodes)(fn)
    return deco


def needs_shape(op: str, what: str) -> ShapeRequired:
    return ShapeRequired(f"{op}: the result shape cannot be inferred ({what}); pass shape=")


def arity(op: str, shapes: Sequence[AnyShape], n: int | tuple[int, int]) -> None:
    """Check the operand count: exactly ``n``, or within ``(lo, hi)`` (hi -1: no limit)."""
    lo, hi = (n, n) if isinstance(n, int) else n
    if len(shapes) < lo or (hi >= 0 and len(shapes) > hi):
        want = str(lo) if lo == hi else (f"at least {lo}" if hi < 0 else f"{lo} to {hi}")
        raise ShapeError(f"{op}: expects {want} operands, got {len(shapes)}")


def array_operand(op: str, shape: AnyShape, what: str = "operand") -> Shape:
    if shape.is_tuple or not shape.is_array:
        raise ShapeError(f"{op}: {what} must be an array, got {shape}")
    return shape  # type: ignore[return-value]


def attr(op: str, attrs: dict[str, Any], name: str, default: Any = ...) -> Any:
    if name in attrs and attrs[name] is not None:
        return attrs[name]
    if default is ...:
        raise ShapeError(f"{op}: missing attribute {name}")
    return default


def ints(op: str, attrs: dict[str, Any], name: str, default: Any = ()) -> tuple[int, ...]:
    v = attr(op, attrs, name, default)
    if isinstance(v, int):
        return (v,)
    return tuple(int(x) for x in v)


def check_dims_in_range(op: str, dims: Sequence[int], rank: int, what: str) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise ShapeError(f"{op}: {what} {d} is out of range for rank {rank}")
    if len(set(dims)) != len(dims):
        raise ShapeError(f"{op}: {what} {tuple(dims)} has repeated dimensions")


def same_dims(op: str, shapes: Sequence[Shape], what: str = "operands") -> None:
    first = shapes[0]
    for i, s in enumerate(shapes[1:], 1):
        if s.dims != first.dims:
            raise ShapeError(f"{op}: {what} must have the same dimensions, but operand 0 is "
                             f"{first.to_text(False)} and operand {i} is {s.to_text(False)}")


def same_shapes(op: str, shapes: Sequence[Shape], what: str = "operands") -> None:
    same_dims(op, shapes, what)
    for i, s in enumerate(shapes[1:], 1):
        if s.dtype != shapes[0].dtype:
            raise ShapeError(f"{op}: {what} must have the same element type, but operand 0 is "
                             f"{shapes[0].dtype} and operand {i} is {s.dtype}")


def tuple_or_single(shapes: Sequence[AnyShape]) -> AnyShape:
    """XLA's convention for variadic ops: one result is an array, several are a tuple."""
    return shapes[0] if len(shapes) == 1 else TupleShape(tuple(shapes))


def plain(shape: AnyShape) -> AnyShape:
    """``shape`` without layouts (inferred shapes carry none)."""
    return shape.without_layout()


def computation_root_shape(op: str, comp: Any, what: str) -> AnyShape:
    if comp is None or getattr(comp, "root", None) is None:
        raise ShapeError(f"{op}: {what} computation is missing or has no root")
    return plain(comp.root.shape)


def window_output_size(op: str, size: int, wd: Any, i: int) -> int:
    """Output extent of one window dimension (reduce-window, convolution)."""
    if wd.size <= 0 or wd.stride <= 0 or wd.window_dilation <= 0 or wd.base_dilation <= 0:
        raise ShapeError(f"{op}: window dimension {i} needs positive size, stride and "
                         f"dilations, got {wd}")
    dilated_base = 0 if size == 0 else (size - 1) * wd.base_dilation + 1
    padded = dilated_base + wd.padding_low + wd.padding_high
    dilated_window = (wd.size - 1) * wd.window_dilation + 1
    if padded < dilated_window:
        return 0
    return (padded - dilated_window) // wd.stride + 1


# Checks of a *given* result shape for ops whose result is not inferred (reshape,
# broadcast, convert, ...): ``fn(operand_shapes, attrs, result_shape)`` raising ShapeError.
# The verifier runs them; they are the "what can still be checked" part.
RESULT_CHECKS: dict[str, Callable] = {}


def result_check(*opcodes: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        for op in opcodes:
            RESULT_CHECKS[op] = fn
        return fn
    return deco
