"""Data movement: broadcast, reshape, transpose, slices, pad, concatenate, gather, scatter,
tuples, and the leaves (parameter, constant, iota) whose shape is always given."""
from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import ShapeError
from ..shape import AnyShape, Shape, TupleShape
from ._common import (array_operand, arity, attr, check_dims_in_range, infer, ints,
                      needs_shape, result_check, tuple_or_single)
from .reductions import check_reducer


# --- leaves: their shape is part of the instruction ------------------------------------
@infer("parameter")
def infer_parameter(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    raise needs_shape("parameter", "a parameter's shape is its declaration")


@infer("constant")
def infer_constant(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    raise needs_shape("constant", "a constant's shape comes with its literal")


@infer("iota")
def infer_iota(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("iota", shapes, 0)
    raise needs_shape("iota", "the output dimensions")


@result_check("iota")
def check_iota(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    r = array_operand("iota", result, "result")
    d = attr("iota", attrs, "iota_dimension")
    if not 0 <= d < max(r.rank, 1) or r.rank == 0:
        raise ShapeError(f"iota: iota_dimension {d} is out of range for {r.to_text(False)}")


# --- reshapes --------------------------------------------------------------------------
@infer("reshape")
def infer_reshape(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("reshape", shapes, 1)
    array_operand("reshape", shapes[0])
    raise needs_shape("reshape", "the target dimensions")


@result_check("reshape")
def check_reshape(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    x = array_operand("reshape", shapes[0])
    r = array_operand("reshape", result, "result")
    if x.dtype != r.dtype:
        raise ShapeError(f"reshape: element type changes from {x.dtype} to {r.dtype}")
    if x.size != r.size:
        raise ShapeError(f"reshape: operand {x.to_text(False)} has {x.size} elements but "
                         f"result {r.to_text(False)} has {r.size}")


@infer("bitcast")
def infer_bitcast(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("bitcast", shapes, 1)
    raise needs_shape("bitcast", "the reinterpreted shape")


@result_check("bitcast")
def check_bitcast(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    x, r = shapes[0], result
    if x.is_tuple or r.is_tuple:
        return
    if x.size * x.dtype.bits != r.size * r.dtype.bits:
        raise ShapeError(f"bitcast: operand {x.to_text(False)} and result {r.to_text(False)} "
                         "have different sizes in bits")


@infer("dynamic-reshape")
def infer_dynamic_reshape(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("dynamic-reshape", shapes, (1, -1))
    raise needs_shape("dynamic-reshape", "the bounded output dimensions")


@result_check("dynamic-reshape")
def check_dynamic_reshape(shapes: list[AnyShape], attrs: dict[str, Any],
                          result: AnyShape) -> None:
    r = array_operand("dynamic-reshape", result, "result")
    if len(shapes) - 1 != r.rank:
        raise ShapeError(f"dynamic-reshape: needs one size operand per result dimension "
                         f"({r.rank}), got {len(shapes) - 1}")


# --- broadcast -------------------------------------------------------------------------
@infer("broadcast")
def infer_broadcast(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("broadcast", shapes, 1)
    x = array_operand("broadcast", shapes[0])
    dims = ints("broadcast", attrs, "dimensions")
    if len(dims) != x.rank:
        raise ShapeError(f"broadcast: dimensions {dims} must name one output dimension per "
                         f"operand dimension (operand rank {x.rank})")
    raise needs_shape("broadcast", "the output dimensions")


@result_check("broadcast")
def check_broadcast(shapes: list[AnyShape], attrs: dict[str, Any], result: AnyShape) -> None:
    """XLA's HLO broadcast: operand dim i becomes output dim dimensions[i], same size."""
    x = array_operand("broadcast", shapes[0])
    r = array_operand("broadcast", result, "result")
    dims = ints("broadcast", attrs, "dimensions")
    if x.dtype != r.dtype:
        raise ShapeError(f"broadcast: element type changes from {x.dtype} to {r.dtype}")
    if len(dims) != x.rank:
        raise ShapeError(f"broadcast: dimensions {dims} must have one entry per operand "
                         f"dimension (operand rank {x.rank})")
    check_dims_in_range("broadcast", dims, r.rank, "dimensions entry")
    for i, d in enumerate(dims):
        if x.dims[i] != r.dims[d]:
            raise ShapeError(f"broadcast: operand dimension {i} has size {x.dims[i]} but "
                             f"output dimension {d} has size {r.dims[d]}")


# --- permutations and slices -----------------------------------------------------------
@infer("transpose")
def infer_transpose(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("transpose", shapes, 1)
    x = array_operand("transpose", shapes[0])
    perm = ints("transpose", attrs, "dimensions", None)
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"transpose: dimensions {perm} is not a permutation of "
                         f"0..{x.rank - 1} for {x.to_text(False)}")
    return Shape(x.dtype, tuple(x.dims[p] for p in perm))


@infer("reverse")
def infer_reverse(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("reverse", shapes, 1)
    x = array_operand("reverse", shapes[0])
    check_dims_in_range("reverse", ints("reverse", attrs, "dimensions"), x.rank, "dimension")
    return x.without_layout()


@infer("slice")
def infer_slice(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("slice", shapes, 1)
    x = array_operand("slice", shapes[0])
    spec = attr("slice", attrs, "slice")
    sdims = spec.dims if hasattr(spec, "dims") else tuple(spec)
    if len(sdims) != x.rank:
        raise ShapeError(f"slice: {len(sdims)} slice ranges for operand of rank {x.rank}")
    out = []
    for i, (d, n) in enumerate(zip(sdims, x.dims)):
        if d.stride < 1:
            raise ShapeError(f"slice: stride {d.stride} in dimension {i} must be positive")
        if not 0 <= d.start <= d.limit <= n:
            raise ShapeError(f"slice: range [{d.start}:{d.limit}] in dimension {i} does not "
                             f"fit size {n}")
        out.append(-(-(d.limit - d.start) // d.stride))
    return Shape(x.dtype, tuple(out))


def _start_indices(op: str, shapes: list[AnyShape], rank: int) -> None:
    """Start indices: ``rank`` integer scalars of one type (or XLA's old 1-D vector)."""
    if len(shapes) == 1 and not shapes[0].is_tuple and shapes[0].rank == 1:
        s = shapes[0]
        if s.dims[0] != rank or not s.dtype.is_integer:
            raise ShapeError(f"{op}: start index vector {s.to_text(False)} must be an "
                             f"integer vector of length {rank}")
        return
    if len(shapes) != rank:
        raise ShapeError(f"{op}: expects {rank} start indices (one per operand dimension), "
                         f"got {len(shapes)}")
    for i, s in enumerate(shapes):
        if s.is_tuple or s.rank != 0 or not s.dtype.is_integer:
            raise ShapeError(f"{op}: start index {i} must be an integer scalar, got {s}")
        if s.dtype != shapes[0].dtype:
            raise ShapeError(f"{op}: start indices must share one type, got {shapes[0].dtype}"
                             f" and {s.dtype}")


@infer("dynamic-slice")
def infer_dynamic_slice(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("dynamic-slice", shapes, (1, -1))
    x = array_operand("dynamic-slice", shapes[0])
    _start_indices("dynamic-slice", shapes[1:], x.rank)
    sizes = ints("dynamic-slice", attrs, "dynamic_slice_sizes", None)
    if len(sizes) != x.rank:
        raise ShapeError(f"dynamic-slice: dynamic_slice_sizes {sizes} must have one entry per "
                         f"operand dimension ({x.rank})")
    for i, (s, n) in enumerate(zip(sizes, x.dims)):
        if not 0 <= s <= n:
            raise ShapeError(f"dynamic-slice: slice size {s} in dimension {i} exceeds "
                             f"operand size {n}")
    return Shape(x.dtype, sizes)


@infer("dynamic-update-slice")
def infer_dynamic_update_slice(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("dynamic-update-slice", shapes, (2, -1))
    x = array_operand("dynamic-update-slice", shapes[0])
    u = array_operand("dynamic-update-slice", shapes[1], "update")
    if u.dtype != x.dtype:
        raise ShapeError(f"dynamic-update-slice: update type {u.dtype} differs from operand "
                         f"type {x.dtype}")
    if u.rank != x.rank:
        raise ShapeError(f"dynamic-update-slice: update {u.to_text(False)} and operand "
                         f"{x.to_text(False)} differ in rank")
    for i, (a, b) in enumerate(zip(u.dims, x.dims)):
        if a > b:
            raise ShapeError(f"dynamic-update-slice: update dimension {i} has size {a}, "
                             f"larger than operand size {b}")
    _start_indices("dynamic-update-slice", shapes[2:], x.rank)
    return x.without_layout()


@infer("concatenate")
def infer_concatenate(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("concatenate", shapes, (1, -1))
    xs = [array_operand("concatenate", s, f"operand {i}") for i, s in enumerate(shapes)]
    dims = ints("concatenate", attrs, "dimensions", None)
    if len(dims) != 1:
        raise ShapeError(f"concatenate: needs exactly one dimension, got {dims}")
    d = dims[0]
    first = xs[0]
    check_dims_in_range("concatenate", [d], first.rank, "dimension")
    total = 0
    for i, x in enumerate(xs):
        if x.dtype != first.dtype:
            raise ShapeError(f"concatenate: operand {i} has type {x.dtype}, operand 0 has "
                             f"{first.dtype}")
        if x.rank != first.rank or any(a != b for j, (a, b) in enumerate(zip(x.dims, first.dims))
                                       if j != d):
            raise ShapeError(f"concatenate: operand {i} {x.to_text(False)} does not match "
                             f"operand 0 {first.to_text(False)} outside dimension {d}")
        total += x.dims[d]
    out = list(first.dims)
    out[d] = total
    return Shape(first.dtype, tuple(out))


@infer("pad")
def infer_pad(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("pad", shapes, 2)
    x = array_operand("pad", shapes[0])
    v = array_operand("pad", shapes[1], "padding value")
    if v.rank != 0 or v.dtype != x.dtype:
        raise ShapeError(f"pad: padding value must be a {x.dtype} scalar, got {v}")
    cfg = attr("pad", attrs, "padding")
    pdims = cfg.dims if hasattr(cfg, "dims") else tuple(cfg)
    if len(pdims) != x.rank:
        raise ShapeError(f"pad: padding has {len(pdims)} dimensions, operand rank is {x.rank}")
    out = []
    for i, (p, n) in enumerate(zip(pdims, x.dims)):
        if p.interior < 0:
            raise ShapeError(f"pad: interior padding {p.interior} in dimension {i} is negative")
        size = p.low + p.high + n + max(n - 1, 0) * p.interior
        if size < 0:
            raise ShapeError(f"pad: dimension {i} would have negative size {size}")
        out.append(size)
    return Shape(x.dtype, tuple(out))


# --- gather / scatter ------------------------------------------------------------------
def _sorted_unique(op: str, name: str, dims: tuple[int, ...], rank: int) -> None:
    check_dims_in_range(op, dims, rank, name + " entry")
    if list(dims) != sorted(dims):
        raise ShapeError(f"{op}: {name} {dims} must be sorted")


def _index_dims(op: str, idx: Shape, ivd: int) -> tuple[tuple[int, ...], int]:
    """(batch dimensions of the indices, index vector length), ``ivd == rank`` meaning an
    implicit trailing index vector of length 1."""
    if not 0 <= ivd <= idx.rank:
        raise ShapeError(f"{op}: index_vector_dim {ivd} is out of range for indices "
                         f"{idx.to_text(False)}")
    if not idx.dtype.is_integer:
        raise ShapeError(f"{op}: indices must be integers, got {idx.dtype}")
    if ivd == idx.rank:
        return idx.dims, 1
    return idx.dims[:ivd] + idx.dims[ivd + 1:], idx.dims[ivd]


@infer("gather")
def infer_gather(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    op = "gather"
    arity(op, shapes, 2)
    x = array_operand(op, shapes[0])
    idx = array_operand(op, shapes[1], "start_indices")
    offset_dims = ints(op, attrs, "offset_dims")
    collapsed = ints(op, attrs, "collapsed_slice_dims")
    start_map = ints(op, attrs, "start_index_map")
    obatch = ints(op, attrs, "operand_batching_dims")
    ibatch = ints(op, attrs, "start_indices_batching_dims")
    ivd = attr(op, attrs, "index_vector_dim", idx.rank)
    sizes = ints(op, attrs, "slice_sizes", None)
    batch_dims, vec_len = _index_dims(op, idx, ivd)

    if len(sizes) != x.rank:
        raise ShapeError(f"gather: slice_sizes {sizes} must have one entry per operand "
                         f"dimension ({x.rank})")
    for i, (s, n) in enumerate(zip(sizes, x.dims)):
        if not 0 <= s <= n:
            raise ShapeError(f"gather: slice size {s} in dimension {i} exceeds operand size {n}")
    _sorted_unique(op, "collapsed_slice_dims", collapsed, x.rank)
    _sorted_unique(op, "operand_batching_dims", obatch, x.rank)
    for name, group in (("collapsed_slice_dims", collapsed), ("operand_batching_dims", obatch)):
        for d in group:
            if sizes[d] > 1:
                raise ShapeError(f"gather: {name} entry {d} needs slice size 1, got {sizes[d]}")
    if set(collapsed) & set(obatch):
        raise ShapeError("gather: collapsed_slice_dims and operand_batching_dims overlap")
    if len(start_map) != vec_len:
        raise ShapeError(f"gather: start_index_map {start_map} must have one entry per index "
                         f"vector element ({vec_len})")
    check_dims_in_range(op, start_map, x.rank, "start_index_map entry")
    if set(start_map) & set(obatch):
        raise ShapeError("gather: start_index_map and operand_batching_dims overlap")
    if len(ibatch) != len(obatch):
        raise ShapeError(f"gather: operand_batching_dims {obatch} and "
                         f"start_indices_batching_dims {ibatch} differ in length")
    check_dims_in_range(op, ibatch, idx.rank, "start_indices_batching_dims entry")
    if ivd in ibatch:
        raise ShapeError("gather: index_vector_dim is among start_indices_batching_dims")
    for od, idd in zip(obatch, ibatch):
        if x.dims[od] != idx.dims[idd]:
            raise ShapeError(f"gather: operand batching dim {od} has size {x.dims[od]} but "
                             f"indices batching dim {idd} has size {idx.dims[idd]}")

    window = [sizes[i] for i in range(x.rank) if i not in collapsed and i not in obatch]
    if len(offset_dims) != len(window):
        raise ShapeError(f"gather: offset_dims {offset_dims} must have one entry per slice "
                         f"dimension that is not collapsed or batching ({len(window)})")
    out_rank = len(batch_dims) + len(offset_dims)
    _sorted_unique(op, "offset_dims", offset_dims, out_rank)
    out, w, b = [], iter(window), iter(batch_dims)
    for i in range(out_rank):
        out.append(next(w) if i in offset_dims else next(b))
    return Shape(x.dtype, tuple(out))


@infer("scatter")
def infer_scatter(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    op = "scatter"
    if len(shapes) < 3 or len(shapes) % 2 == 0:
        raise ShapeError(f"scatter: expects N inputs, indices and N updates (an odd count "
                         f">= 3), got {len(shapes)} operands")
    n = (len(shapes) - 1) // 2
    inputs = [array_operand(op, s, f"input {i}") for i, s in enumerate(shapes[:n])]
    idx = array_operand(op, shapes[n], "scatter_indices")
    updates = [array_operand(op, s, f"update {i}") for i, s in enumerate(shapes[n + 1:])]
    x = inputs[0]
    for i, s in enumerate(inputs[1:], 1):
        if s.dims != x.dims:
            raise ShapeError(f"scatter: input {i} {s.to_text(False)} differs in dimensions "
                             f"from input 0 {x.to_text(False)}")
    uwd = ints(op, attrs, "update_window_dims")
    inserted = ints(op, attrs, "inserted_window_dims")
    to_op = ints(op, attrs, "scatter_dims_to_operand_dims")
    ibatch = ints(op, attrs, "input_batching_dims")
    sbatch = ints(op, attrs, "scatter_indices_batching_dims")
    ivd = attr(op, attrs, "index_vector_dim", idx.rank)
    batch_dims, vec_len = _index_dims(op, idx, ivd)

    _sorted_unique(op, "inserted_window_dims", inserted, x.rank)
    _sorted_unique(op, "input_batching_dims", ibatch, x.rank)
    if set(inserted) & set(ibatch):
        raise ShapeError("scatter: inserted_window_dims and input_batching_dims overlap")
    if len(to_op) != vec_len:
        raise ShapeError(f"scatter: scatter_dims_to_operand_dims {to_op} must have one entry "
                         f"per index vector element ({vec_len})")
    check_dims_in_range(op, to_op, x.rank, "scatter_dims_to_operand_dims entry")
    if set(to_op) & set(ibatch):
        raise ShapeError("scatter: scatter_dims_to_operand_dims and input_batching_dims overlap")
    if len(sbatch) != len(ibatch):
        raise ShapeError(f"scatter: input_batching_dims {ibatch} and "
                         f"scatter_indices_batching_dims {sbatch} differ in length")
    check_dims_in_range(op, sbatch, idx.rank, "scatter_indices_batching_dims entry")
    if ivd in sbatch:
        raise ShapeError("scatter: index_vector_dim is among scatter_indices_batching_dims")
    for od, idd in zip(ibatch, sbatch):
        if x.dims[od] != idx.dims[idd]:
            raise ShapeError(f"scatter: input batching dim {od} has size {x.dims[od]} but "
                             f"indices batching dim {idd} has size {idx.dims[idd]}")
    window_operand_dims = [i for i in range(x.rank) if i not in inserted and i not in ibatch]
    if len(uwd) != len(window_operand_dims):
        raise ShapeError(f"scatter: update_window_dims {uwd} must have one entry per operand "
                         f"dimension that is not inserted or batching "
                         f"({len(window_operand_dims)})")
    for k, u in enumerate(updates):
        if u.rank != len(uwd) + len(batch_dims):
            raise ShapeError(f"scatter: update {k} {u.to_text(False)} must have rank "
                             f"{len(uwd) + len(batch_dims)} (window dims + scatter dims)")
        _sorted_unique(op, "update_window_dims", uwd, u.rank)
        if u.dtype != inputs[k].dtype:
            raise ShapeError(f"scatter: update {k} has type {u.dtype}, input {k} has "
                             f"{inputs[k].dtype}")
        for wd, od in zip(uwd, window_operand_dims):
            if u.dims[wd] > x.dims[od]:
                raise ShapeError(f"scatter: update {k} window dim {wd} has size {u.dims[wd]}, "
                                 f"larger than operand dim {od} ({x.dims[od]})")
        scatter_sizes = tuple(u.dims[i] for i in range(u.rank) if i not in uwd)
        if scatter_sizes != tuple(batch_dims):
            raise ShapeError(f"scatter: update {k} scatter dims {list(scatter_sizes)} must "
                             f"equal the indices' batch dims {list(batch_dims)}")
    check_reducer(op, attrs.get("to_apply"), [Shape(s.dtype, ()) for s in inputs],
                  [u.dtype for u in updates])
    return tuple_or_single([s.without_layout() for s in inputs])


# --- tuples and odds -------------------------------------------------------------------
@infer("tuple")
def infer_tuple(shapes: list[AnyShape], attrs: dict[str, Any]) -> TupleShape:
    return TupleShape(tuple(s.without_layout() for s in shapes))


@infer("get-tuple-element")
def infer_gte(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("get-tuple-element", shapes, 1)
    t = shapes[0]
    if not t.is_tuple:
        raise ShapeError(f"get-tuple-element: operand must be a tuple, got {t}")
    i = attr("get-tuple-element", attrs, "index")
    if not 0 <= i < len(t.elements):
        raise ShapeError(f"get-tuple-element: index {i} is out of range for a tuple of "
                         f"{len(t.elements)} elements {t}")
    return t.elements[i].without_layout()


@infer("get-dimension-size")
def infer_get_dimension_size(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("get-dimension-size", shapes, 1)
    x = array_operand("get-dimension-size", shapes[0])
    check_dims_in_range("get-dimension-size", ints("get-dimension-size", attrs, "dimensions"),
                        x.rank, "dimension")
    return Shape(dt.S32, ())


@infer("set-dimension-size")
def infer_set_dimension_size(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    arity("set-dimension-size", shapes, 2)
    x = array_operand("set-dimension-size", shapes[0])
    size = shapes[1]
    if size.is_tuple or size.rank != 0 or size.dtype != dt.S32:
        raise ShapeError(f"set-dimension-size: size must be s32[], got {size}")
    check_dims_in_range("set-dimension-size", ints("set-dimension-size", attrs, "dimensions"),
                        x.rank, "dimension")
    return x.without_layout()   # static bound unchanged; hlotk has no dynamic dims


@infer("optimization-barrier", "domain")
def infer_same_as_operand(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("optimization-barrier/domain", shapes, 1)
    return shapes[0].without_layout()


@infer("add-dependency")
def infer_add_dependency(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("add-dependency", shapes, 2)
    return shapes[0].without_layout()


@infer("after-all")
def infer_after_all(shapes: list[AnyShape], attrs: dict[str, Any]) -> Shape:
    for i, s in enumerate(shapes):
        if not s.is_token:
            raise ShapeError(f"after-all: operand {i} must be a token, got {s}")
    return Shape(dt.TOKEN, ())


@infer("copy-start")
def infer_copy_start(shapes: list[AnyShape], attrs: dict[str, Any]) -> TupleShape:
    # (destination, source, context): XLA's asynchronous copy carries a u32[] context.
    arity("copy-start", shapes, 1)
    s = shapes[0].without_layout()
    return TupleShape((s, s, Shape(dt.U32, ())))


@infer("copy-done")
def infer_copy_done(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("copy-done", shapes, 1)
    t = shapes[0]
    if not t.is_tuple or len(t.elements) < 2:
        raise ShapeError(f"copy-done: operand must be a copy-start tuple, got {t}")
    return t.elements[0].without_layout()
