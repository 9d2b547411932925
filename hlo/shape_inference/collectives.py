"""Collectives. all-gather and reduce-scatter change one dimension by the number of
participants in a group, which depends on ``replica_groups`` and, when those are empty
or the mode includes partitions, on the module's replica/partition counts.

Those rules accept ``module=``; without one (e.g. a Builder with no module) they raise a
ShapeError asking for ``shape=``.
"""
from __future__ import annotations

from typing import Any, Optional

from ..errors import ShapeError
from ..shape import AnyShape, Shape, TupleShape
from ._common import (array_operand, arity, check_dims_in_range, infer, ints, needs_shape,
                      result_check, tuple_or_single)
from .reductions import check_reducer


def _config_int(module: Any, key: str) -> int:
    v = module.config.get(key, 1)
    return int(str(v))


def group_size(op: str, attrs: dict[str, Any], module: Optional[Any]) -> int:
    """Number of participants per group, following XLA's collective op group modes:
    no channel_id -> cross-replica; channel_id -> cross-replica-and-partition (each
    listed replica brings all its partitions); use_global_device_ids -> flattened ids."""
    groups = attrs.get("replica_groups")
    expanded = groups.expand() if groups is not None else []
    expanded = [g for g in expanded if g] if expanded else []
    sizes = {len(g) for g in expanded}
    if len(sizes) > 1:
        raise ShapeError(f"{op}: replica groups must all have the same size, got {groups}")
    has_channel = attrs.get("channel_id") is not None
    global_ids = bool(attrs.get("use_global_device_ids"))
    per_replica = has_channel and not global_ids
    if expanded and not per_replica:
        return len(expanded[0])
    if module is None:
        why = ("replica_groups are empty" if not expanded
               else "the group includes every partition of its replicas")
        raise ShapeError(f"{op}: the group size depends on the module's replica/partition "
                         f"counts ({why}) and no module is known; pass shape=")
    replicas = _config_int(module, "replica_count")
    partitions = _config_int(module, "num_partitions")
    if expanded:
        return len(expanded[0]) * partitions
    return replicas * (partitions if has_channel else 1)


def _dimension(op: str, attrs: dict[str, Any], rank: int) -> int:
    dims = ints(op, attrs, "dimensions", None) if "dimensions" in attrs else \
        ints(op, attrs, "all_gather_dimension" if op.startswith("all-gather")
             else "scatter_dimension", None)
    if len(dims) != 1:
        raise ShapeError(f"{op}: needs exactly one dimension, got {dims}")
    check_dims_in_range(op, dims, rank, "dimension")
    return dims[0]


def _arrays(op: str, shapes: list[AnyShape]) -> list[Shape]:
    arity(op, shapes, (1, -1))
    return [array_operand(op, s, f"operand {i}") for i, s in enumerate(shapes)]


@infer("all-reduce", "all-reduce-start")
def infer_all_reduce(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    xs = _arrays("all-reduce", shapes)
    for x in xs:
        check_reducer("all-reduce", attrs.get("to_apply"), [Shape(x.dtype, ())], [x.dtype])
    return tuple_or_single([x.without_layout() for x in xs])


@infer("all-reduce-done")
def infer_all_reduce_done(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("all-reduce-done", shapes, 1)
    return shapes[0].without_layout()


def _gathered(op: str, shapes: list[AnyShape], attrs: dict[str, Any],
              module: Optional[Any]) -> list[Shape]:
    xs = _arrays(op, shapes)
    n = group_size(op, attrs, module)
    out = []
    for x in xs:
        d = _dimension(op, attrs, x.rank)
        dims = list(x.dims)
        dims[d] *= n
        out.append(Shape(x.dtype, tuple(dims)))
    return out


@infer("all-gather", wants_module=True)
def infer_all_gather(shapes: list[AnyShape], attrs: dict[str, Any],
                     module: Optional[Any] = None) -> AnyShape:
    return tuple_or_single(_gathered("all-gather", shapes, attrs, module))


@infer("all-gather-start", wants_module=True)
def infer_all_gather_start(shapes: list[AnyShape], attrs: dict[str, Any],
                           module: Optional[Any] = None) -> TupleShape:
    out = _gathered("all-gather-start", shapes, attrs, module)
    ins = [s.without_layout() for s in shapes]
    return TupleShape((tuple_or_single(ins), tuple_or_single(out)))


def _done_element_1(op: str, shapes: list[AnyShape]) -> AnyShape:
    arity(op, shapes, 1)
    t = shapes[0]
    if not t.is_tuple or len(t.elements) < 2:
        raise ShapeError(f"{op}: operand must be the start op's tuple, got {t}")
    return t.elements[1].without_layout()


@infer("all-gather-done")
def infer_all_gather_done(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    return _done_element_1("all-gather-done", shapes)


@infer("collective-permute-done")
def infer_collective_permute_done(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    return _done_element_1("collective-permute-done", shapes)


@infer("reduce-scatter", wants_module=True)
def infer_reduce_scatter(shapes: list[AnyShape], attrs: dict[str, Any],
                         module: Optional[Any] = None) -> AnyShape:
    op = "reduce-scatter"
    xs = _arrays(op, shapes)
    n = group_size(op, attrs, module)
    out = []
    for x in xs:
        check_reducer(op, attrs.get("to_apply"), [Shape(x.dtype, ())], [x.dtype])
        d = _dimension(op, attrs, x.rank)
        if x.dims[d] % n:
            raise ShapeError(f"{op}: dimension {d} of {x.to_text(False)} ({x.dims[d]}) is not "
                             f"divisible by the group size {n}")
        dims = list(x.dims)
        dims[d] //= n
        out.append(Shape(x.dtype, tuple(dims)))
    return tuple_or_single(out)


@infer("all-to-all")
def infer_all_to_all(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    xs = _arrays("all-to-all", shapes)
    if "dimensions" in attrs:
        # Array form: split along one dimension, then concatenate the received pieces
        # along the same dimension: the shape is unchanged.
        arity("all-to-all", shapes, 1)
        d = _dimension("all-to-all", attrs, xs[0].rank)
        groups = attrs.get("replica_groups")
        expanded = groups.expand() if groups is not None else []
        if expanded and expanded[0] and xs[0].dims[d] % len(expanded[0]):
            raise ShapeError(f"all-to-all: split dimension {d} of {xs[0].to_text(False)} is not "
                             f"divisible by the group size {len(expanded[0])}")
        return xs[0].without_layout()
    return tuple_or_single([x.without_layout() for x in xs])


@infer("ragged-all-to-all")
def infer_ragged_all_to_all(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    # (input, output, input_offsets, send_sizes, output_offsets, recv_sizes) -> output
    op = "ragged-all-to-all"
    arity(op, shapes, 6)
    x = array_operand(op, shapes[0], "input")
    out = array_operand(op, shapes[1], "output")
    if x.dtype != out.dtype or x.dims[1:] != out.dims[1:]:
        raise ShapeError(f"{op}: input {x.to_text(False)} and output {out.to_text(False)} "
                         "must agree in type and in all but the first dimension")
    for i, s in enumerate(shapes[2:], 2):
        if s.is_tuple or s.rank != 1 or not s.dtype.is_integer:
            raise ShapeError(f"{op}: operand {i} (offsets/sizes) must be an integer vector, "
                             f"got {s}")
    return out.without_layout()


@infer("collective-broadcast")
def infer_collective_broadcast(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    return tuple_or_single([x.without_layout() for x in _arrays("collective-broadcast", shapes)])


@infer("collective-permute")
def infer_collective_permute(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("collective-permute", shapes, (1, -1))
    _check_pairs(attrs)
    if len(shapes) == 4 and shapes[2].is_tuple:
        # In-place form: (input, output buffer, input offsets, output offsets) -> output.
        return shapes[1].without_layout()
    return tuple_or_single([s.without_layout() for s in shapes])


def _check_pairs(attrs: dict[str, Any]) -> None:
    pairs = attrs.get("source_target_pairs") or ()
    sources = [p[0] for p in pairs]
    targets = [p[1] for p in pairs]
    if len(set(sources)) != len(sources) or len(set(targets)) != len(targets):
        raise ShapeError(f"collective-permute: source_target_pairs {pairs} repeat a source "
                         "or a target")


@infer("collective-permute-start")
def infer_collective_permute_start(shapes: list[AnyShape], attrs: dict[str, Any]) -> AnyShape:
    arity("collective-permute-start", shapes, (1, -1))
    _check_pairs(attrs)
    raise needs_shape("collective-permute-start", "the context elements are backend-specific")


@result_check("collective-permute-start")
def check_collective_permute_start(shapes: list[AnyShape], attrs: dict[str, Any],
                                   result: AnyShape) -> None:
    # (input, output, contexts...): input and output have the operand's shape.
    if not result.is_tuple or len(result.elements) < 2:
        raise ShapeError(f"collective-permute-start: result must be (input, output, ...), "
                         f"got {result}")
    for i in (0, 1):
        if not result.elements[i].compatible(shapes[0]):
            raise ShapeError(f"collective-permute-start: result element {i} "
                             f"{result.elements[i]} must be the operand shape {shapes[0]}")
