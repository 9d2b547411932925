"""Reductions and sorting: reduce, reduce-window, select-and-scatter, sort, topk,
batch-norm-*. Reducer/comparator signatures are checked here too, so the verifier gets
them from inference."""
from __future__ import annotations

from typing import Any, Sequence

from .. import dtypes as dt
from ..errors import ShapeError
from ..shape import AnyShape, Shape, TupleShape
from ._common import (array_operand, arity, attr, check_dims_in_range, infer, ints,
                      tuple_or_single, window_output_size)


def _same_ignoring_fp_precision(a: dt.DType, b: dt.DType) -> bool:
    return a == b or (a.is_float and b.is_float) or (a.is_complex and b.is_complex)


def _params(comp: Any) -> list[AnyShape]:
    return [p.shape for p in comp.parameters]


def check_reducer(op: str, comp: Any, accumulators: Sequence[Shape],
                  inputs: Sequence[dt.DType], name: str = "to_apply") -> None:
    """A reducer takes (acc_0..acc_{n-1}, x_0..x_{n-1}) scalars and returns the n
    accumulators (a tuple when n > 1), as XLA's VerifyReducerShape demands."""
    if comp is None or comp.root is None:
        raise ShapeError(f"{op}: {name} computation is missing or has no root")
    n = len(accumulators)
    params = _params(comp)
    if len(params) != 2 * n:
        raise ShapeError(f"{op}: {name} computation %{comp.name} must take {2 * n} "
                         f"parameters, takes {len(params)}")
    for i, (p, acc) in enumerate(zip(params[:n], accumulators)):
        if p.is_tuple or p.rank != 0 or p.dtype != acc.dtype:
            raise ShapeError(f"{op}: {name} parameter {i} must be {acc.dtype}[] (the "
                             f"accumulator type), got {p}")
    for i, (p, t) in enumerate(zip(params[n:], inputs), n):
        if p.is_tuple or p.rank != 0 or not _same_ignoring_fp_precision(p.dtype, t):
            raise ShapeError(f"{op}: {name} parameter {i} must be a {t}[] scalar, got {p}")
    root = comp.root.shape
    want = accumulators[0] if n == 1 else TupleShape(tuple(accumulators))
    if not root.compatible(want):
        raise ShapeError(f"{op}: {name} computation %{comp.name} must return {want}, "
                         f"returns {root.to_text(False)}")


def _inputs_and_inits(op: str, shapes: list[AnyShape]) -> tuple[list[Shape], list[Shape]]:
    if len(shapes) < 2 or len(shapes) % 2:
        raise ShapeError(f"{op}: expects N inputs followed by N init values, got "
                         f"{len(shapes)} operands")
    n = len(shapes) // 2
    inputs = [array_operand(op, s, f"input {i}") for i, s in enumerate(shapes[:n])]
    inits = [array_operand(op, s, f"init value {i}") for i, s in enumerate(shapes[n:])]
    for i, s in enumerate(inputs[1:], 1):
        if s.dims != inputs[0].dims:
            raise ShapeError(f"{op}: input {i} {s.to_text(False)} differs in dimensions from "
                             f"input 0 {inputs[0].to_text(False)}")
    for i, s in enumerate(inits):
        if s.rank != 0:
            raise ShapeError(f"{op}: init value {i} must be a scalar, got {s}")
    return inputs, [s.without_layout() for s in inits]


@infer("reduce")
def infer_reduce(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    inputs, inits = _inputs_and_inits("reduce", shapes)
    x = inputs[0]
    dims = ints("reduce", attrs, "dimensions", None)
    check_dims_in_range("reduce", dims, x.rank, "reduced dimension")
    check_reducer("reduce", attrs.get("to_apply"), inits, [s.dtype for s in inputs])
    kept = tuple(n for i, n in enumerate(x.dims) if i not in dims)
    return tuple_or_single([Shape(init.dtype, kept) for init in inits])


def window_dims(op: str, x: Shape, window: Any) -> tuple[int, ...]:
    wdims = window.dims if window is not None else ()
    if len(wdims) != x.rank:
        raise ShapeError(f"{op}: window has {len(wdims)} dimensions but the operand "
                         f"{x.to_text(False)} has rank {x.rank}")
    return tuple(window_output_size(op, n, wd, i) for i, (n, wd) in enumerate(zip(x.dims, wdims)))


@infer("reduce-window")
def infer_reduce_window(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    inputs, inits = _inputs_and_inits("reduce-window", shapes)
    out = window_dims("reduce-window", inputs[0], attr("reduce-window", attrs, "window"))
    check_reducer("reduce-window", attrs.get("to_apply"), inits, [s.dtype for s in inputs])
    return tuple_or_single([Shape(init.dtype, out) for init in inits])


@infer("select-and-scatter")
def infer_select_and_scatter(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    op = "select-and-scatter"
    arity(op, shapes, 3)
    x = array_operand(op, shapes[0])
    source = array_operand(op, shapes[1], "source")
    init = array_operand(op, shapes[2], "init value")
    if init.rank != 0 or init.dtype != source.dtype:
        raise ShapeError(f"{op}: init value must be a {source.dtype} scalar, got {init}")
    win = window_dims(op, x, attr(op, attrs, "window"))
    if source.dims != win:
        raise ShapeError(f"{op}: source {source.to_text(False)} must have the windowed "
                         f"dimensions {list(win)} of the operand")
    sel = attrs.get("select")
    if sel is None or sel.root is None:
        raise ShapeError(f"{op}: select computation is missing")
    ps = _params(sel)
    scalar = Shape(x.dtype, ())
    if len(ps) != 2 or not all(p.compatible(scalar) for p in ps) \
            or not sel.root.shape.compatible(Shape(dt.PRED, ())):
        raise ShapeError(f"{op}: select computation %{sel.name} must be ({x.dtype}[], "
                         f"{x.dtype}[]) -> pred[]")
    check_reducer(op, attrs.get("scatter"), [init.without_layout()], [source.dtype],
                  name="scatter")
    return x.without_layout()


def check_comparator(op: str, comp: Any, types: Sequence[dt.DType]) -> None:
    """A sort comparator takes (lhs_0, rhs_0, lhs_1, rhs_1, ...) scalars -> pred[]."""
    if comp is None or comp.root is None:
        raise ShapeError(f"{op}: to_apply comparator is missing or has no root")
    ps = _params(comp)
    if len(ps) != 2 * len(types):
        raise ShapeError(f"{op}: comparator %{comp.name} must take {2 * len(types)} "
                         f"parameters, takes {len(ps)}")
    for i, p in enumerate(ps):
        want = Shape(types[i // 2], ())
        if not p.compatible(want):
            raise ShapeError(f"{op}: comparator parameter {i} must be {want}, got {p}")
    if not comp.root.shape.compatible(Shape(dt.PRED, ())):
        raise ShapeError(f"{op}: comparator %{comp.name} must return pred[], returns "
                         f"{comp.root.shape.to_text(False)}")


@infer("sort")
def infer_sort(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("sort", shapes, (1, -1))
    xs = [array_operand("sort", s, f"operand {i}") for i, s in enumerate(shapes)]
    for i, s in enumerate(xs[1:], 1):
        if s.dims != xs[0].dims:
            raise ShapeError(f"sort: operand {i} {s.to_text(False)} differs in dimensions "
                             f"from operand 0 {xs[0].to_text(False)}")
    dims = ints("sort", attrs, "dimensions", None)
    if len(dims) != 1:
        raise ShapeError(f"sort: needs exactly one sort dimension, got {dims}")
    check_dims_in_range("sort", dims, xs[0].rank, "dimension")
    check_comparator("sort", attrs.get("to_apply"), [s.dtype for s in xs])
    return tuple_or_single([s.without_layout() for s in xs])


@infer("topk")
def infer_topk(shapes: list[AnyShape], attrs: dict[str, Any]) -> TupleShape:
    arity("topk", shapes, 1)
    x = array_operand("topk", shapes[0])
    k = attr("topk", attrs, "k")
    if x.rank < 1:
        raise ShapeError("topk: operand must have rank >= 1")
    if not 0 <= k <= x.dims[-1]:
        raise ShapeError(f"topk: k={k} exceeds the last dimension {x.dims[-1]} of "
                         f"{x.to_text(False)}")
    dims = x.dims[:-1] + (k,)
    return TupleShape((Shape(x.dtype, dims), Shape(dt.S32, dims)))


def _batch_norm_operands(op: str, shapes: list[AnyShape], attrs: dict[str, Any],
                         names: Sequence[str]) -> tuple[Shape, int]:
    x = array_operand(op, shapes[0])
    if not x.dtype.is_float:
        raise ShapeError(f"{op}: operand must be floating point, got {x.dtype}")
    fi = attr(op, attrs, "feature_index")
    if not 0 <= fi < x.rank:
        raise ShapeError(f"{op}: feature_index {fi} is out of range for rank {x.rank}")
    want = Shape(x.dtype, (x.dims[fi],))
    for s, name in zip(shapes[1:], names):
        if s.is_tuple or not s.compatible(want):
            raise ShapeError(f"{op}: {name} must be {want} (the feature dimension), got {s}")
    return x.without_layout(), x.dims[fi]


@infer("batch-norm-training")
def infer_batch_norm_training(shapes: list[AnyShape], attrs: dict[str, Any]) -> TupleShape:
    arity("batch-norm-training", shapes, 3)
    x, f = _batch_norm_operands("batch-norm-training", shapes, attrs, ("scale", "offset"))
    return TupleShape((x, Shape(x.dtype, (f,)), Shape(x.dtype, (f,))))


@infer("batch-norm-inference")
def infer_batch_norm_inference(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("batch-norm-inference", shapes, 5)
    x, _ = _batch_norm_operands("batch-norm-inference", shapes, attrs,
                                ("scale", "offset", "mean", "variance"))
    return x


@infer("batch-norm-grad")
def infer_batch_norm_grad(shapes: list[AnyShape], attrs: dict[str, Any]) -> TupleShape:
    arity("batch-norm-grad", shapes, 5)
    x, f = _batch_norm_operands("batch-norm-grad", shapes[:4], attrs,
                                ("scale", "mean", "variance"))
    g = shapes[4]
    if g.is_tuple or not g.compatible(x):
        raise ShapeError(f"batch-norm-grad: grad_output must be {x}, got {g}")
    return TupleShape((x, Shape(x.dtype, (f,)), Shape(x.dtype, (f,))))
