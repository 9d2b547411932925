"""Elementwise ops: unary, binary, select/clamp, map, conversions.

HLO (unlike XLA's client builder) has no implicit broadcasting: operands of a binary op
have identical dimensions and element types. The exceptions XLA keeps are a scalar
predicate in ``select`` and scalar bounds in ``clamp``.
"""
from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import ShapeError
from ..shape import AnyShape, Shape
from ._common import (array_operand, arity, computation_root_shape, infer, needs_shape,
                      result_check, same_shapes)

_FLOAT_OR_COMPLEX = ["cbrt", "cosine", "erf", "exponential", "exponential-minus-one", "log",
                     "log-plus-one", "logistic", "rsqrt", "sine", "sqrt", "tan", "tanh"]
_FLOAT_ONLY = ["ceil", "floor", "round-nearest-afz", "round-nearest-even"]
_INT_ONLY = ["popcnt", "count-leading-zeros"]
_ANY_NUMERIC = ["negate", "sign"]


def _unary(op: str, shapes: list[AnyShape]) -> Shape:
    arity(op, shapes, 1)
    return array_operand(op, shapes[0]).without_layout()


def _require(op: str, s: Shape, ok: bool, what: str) -> None:
    if not ok:
        raise ShapeError(f"{op}: operand element type {s.dtype} is not {what}")


def _make_unary(op: str, check, what: str, result=None):
    def rule_fn(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
        s = _unary(op, shapes)
        _require(op, s, check(s.dtype), what)
        return s if result is None else s.with_dtype(result(s.dtype))
    rule_fn.__name__ = "infer_" + op.replace("-", "_")
    return infer(op)(rule_fn)


for _op in _FLOAT_OR_COMPLEX:
    _make_unary(_op, lambda d: d.is_float or d.is_complex, "floating point or complex")
for _op in _FLOAT_ONLY:
    _make_unary(_op, lambda d: d.is_float, "floating point")
for _op in _INT_ONLY:
    _make_unary(_op, lambda d: d.is_integer, "an integer type")
for _op in _ANY_NUMERIC:
    _make_unary(_op, lambda d: d.is_integer or d.is_float or d.is_complex, "numeric")
_make_unary("not", lambda d: d.is_pred or d.is_integer, "pred or an integer type")
_make_unary("abs", lambda d: d.is_integer or d.is_float or d.is_complex, "numeric",
            result=lambda d: d.component)
_make_unary("real", lambda d: d.is_float or d.is_complex, "floating point or complex",
            result=lambda d: d.component)
_make_unary("imag", lambda d: d.is_float or d.is_complex, "floating point or complex",
            result=lambda d: d.component)
_make_unary("is-finite", lambda d: d.is_float, "floating point", result=lambda d: dt.PRED)
_make_unary("reduce-precision", lambda d: d.is_float, "floating point")


@infer("copy")
def infer_copy(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    # copy also copies tuples (XLA deep-copies them element by element).
    arity("copy", shapes, 1)
    return shapes[0].without_layout()


_ARITH = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "remainder",
          "power"]
_LOGICAL = ["and", "or", "xor"]
_SHIFTS = ["shift-left", "shift-right-arithmetic", "shift-right-logical"]


def _binary(op: str, shapes: list[AnyShape]) -> Shape:
    arity(op, shapes, 2)
    a = array_operand(op, shapes[0], "lhs")
    b = array_operand(op, shapes[1], "rhs")
    same_shapes(op, [a, b])
    return a.without_layout()


def _make_binary(op: str, check, what: str, result=None):
    def rule_fn(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
        s = _binary(op, shapes)
        _require(op, s, check(s.dtype), what)
        return s if result is None else s.with_dtype(result(s.dtype))
    rule_fn.__name__ = "infer_" + op.replace("-", "_")
    return infer(op)(rule_fn)


for _op in _ARITH:
    _make_binary(_op, lambda d: d.is_pred or d.is_integer or d.is_float or d.is_complex,
                 "numeric or pred")
for _op in _LOGICAL:
    _make_binary(_op, lambda d: d.is_pred or d.is_integer, "pred or an integer type")
for _op in _SHIFTS:
    _make_binary(_op, lambda d: d.is_integer, "an integer type")
_make_binary("atan2", lambda d: d.is_float or d.is_complex, "floating point or complex")
_make_binary("compare", lambda d: d.is_array_type, "an array type", result=lambda d: dt.PRED)


@infer("complex")
def infer_complex(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    s = _binary("complex", shapes)
    if s.dtype == dt.F32:
        return s.with_dtype(dt.C64)
    if s.dtype == dt.F64:
        return s.with_dtype(dt.C128)
    raise ShapeError(f"complex: operands must be f32 or f64, got {s.dtype}")


@infer("select")
def infer_select(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("select", shapes, 3)
    pred = array_operand("select", shapes[0], "predicate")
    on_true = array_operand("select", shapes[1], "on_true")
    on_false = array_operand("select", shapes[2], "on_false")
    if pred.dtype != dt.PRED:
        raise ShapeError(f"select: predicate must be pred, got {pred.dtype}")
    same_shapes("select", [on_true, on_false], "on_true and on_false")
    if pred.dims and pred.dims != on_true.dims:
        raise ShapeError(f"select: predicate {pred.to_text(False)} must be a scalar or have "
                         f"the dimensions of on_true {on_true.to_text(False)}")
    return on_true.without_layout()


@infer("clamp")
def infer_clamp(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("clamp", shapes, 3)
    lo, x, hi = (array_operand("clamp", s, w) for s, w in zip(shapes, ("min", "operand", "max")))
    for bound, name in ((lo, "min"), (hi, "max")):
        if bound.dtype != x.dtype:
            raise ShapeError(f"clamp: {name} has element type {bound.dtype} but operand has "
                             f"{x.dtype}")
        if bound.dims and bound.dims != x.dims:
            raise ShapeError(f"clamp: {name} {bound.to_text(False)} must be a scalar or match "
                             f"operand {x.to_text(False)}")
    return x.without_layout()


@infer("map")
def infer_map(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    if not shapes:
        raise ShapeError("map: expects at least one operand")
    arrays = [array_operand("map", s) for s in shapes]
    first = arrays[0]
    for i, a in enumerate(arrays[1:], 1):
        if a.dims != first.dims:
            raise ShapeError(f"map: operand {i} {a.to_text(False)} does not have the dimensions "
                             f"of operand 0 {first.to_text(False)}")
    dims = attrs.get("dimensions")
    if dims is not None and tuple(dims) != tuple(range(first.rank)):
        raise ShapeError(f"map: dimensions {tuple(dims)} must be all of 0..{first.rank - 1} "
                         "in order")
    root = computation_root_shape("map", attrs.get("to_apply"), "to_apply")
    if root.is_tuple or root.dims:
        raise ShapeError(f"map: to_apply must return a scalar, returns {root}")
    return Shape(root.dtype, first.dims)


@infer("convert")
def infer_convert(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    _unary("convert", shapes)
    raise needs_shape("convert", "the target element type")


@infer("bitcast-convert")
def infer_bitcast_convert(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    _unary("bitcast-convert", shapes)
    raise needs_shape("bitcast-convert", "the target element type")


@infer("stochastic-convert")
def infer_stochastic_convert(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("stochastic-convert", shapes, 2)
    x = array_operand("stochastic-convert", shapes[0])
    r = array_operand("stochastic-convert", shapes[1], "random")
    if not x.dtype.is_float:
        raise ShapeError(f"stochastic-convert: operand must be floating point, got {x.dtype}")
    if r.dims != x.dims:
        raise ShapeError(f"stochastic-convert: random {r.to_text(False)} must have the "
                         f"dimensions of operand {x.to_text(False)}")
    if not r.dtype.is_unsigned or r.dtype.bits != x.dtype.bits:
        raise ShapeError(f"stochastic-convert: random must be an unsigned integer of "
                         f"{x.dtype.bits} bits like the operand, got {r.dtype}")
    raise needs_shape("stochastic-convert", "the target element type")


@result_check("convert")
def check_convert(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    x = array_operand("convert", shapes[0])
    r = array_operand("convert", result, "result")
    if x.dims != r.dims:
        raise ShapeError(f"convert: result {r.to_text(False)} must have the dimensions of "
                         f"operand {x.to_text(False)}")


@result_check("stochastic-convert")
def check_stochastic_convert(shapes: list[AnyShape], attrs: dict[str, Any],
                             result: AnyShape) -> None:
    x = array_operand("stochastic-convert", shapes[0])
    r = array_operand("stochastic-convert", result, "result")
    if x.dims != r.dims:
        raise ShapeError(f"stochastic-convert: result {r.to_text(False)} must have the "
                         f"dimensions of operand {x.to_text(False)}")


@result_check("bitcast-convert")
def check_bitcast_convert_result(shapes: list[AnyShape], attrs: dict[str, Any],
                                 result: AnyShape) -> None:
    x = array_operand("bitcast-convert", shapes[0])
    r = array_operand("bitcast-convert", result, "result")
    why = check_bitcast_convert(x, r)
    if why:
        raise ShapeError("bitcast-convert: " + why)


def check_bitcast_convert(operand: Shape, result: Shape) -> str | None:
    """Why ``bitcast-convert`` from ``operand`` to ``result`` is invalid, or None.

    Equal widths keep the dimensions. A narrower result appends a minor dimension of size
    (wide bits / narrow bits); a wider result removes a minor dimension of that size.
    """
    a, b = operand.dtype.bits, result.dtype.bits
    if a == b:
        if operand.dims != result.dims:
            return (f"same bit width ({a}) needs the same dimensions, but operand is "
                    f"{operand.to_text(False)} and result is {result.to_text(False)}")
        return None
    if a > b:
        if a % b:
            return f"{a}-bit operand cannot be split into {b}-bit elements"
        want = operand.dims + (a // b,)
    else:
        if b % a:
            return f"{a}-bit elements cannot be joined into {b}-bit elements"
        if not operand.dims or operand.dims[-1] != b // a:
            return (f"a {b}-bit result needs the operand's minor dimension to be {b // a}, "
                    f"operand is {operand.to_text(False)}")
        want = operand.dims[:-1]
    if result.dims != tuple(want):
        return (f"result dimensions {list(result.dims)} should be {list(want)} for "
                f"{operand.dtype} -> {result.dtype}")
    return None
