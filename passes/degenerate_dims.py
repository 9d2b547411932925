"""Simplifier rules that move size-1 dimensions out of the way (XLA's
RemoveDegenerateDimensionFromDot, transpose-is-reshape and the degenerate part of its
ReshapeMover).

``jax.nn.dot_product_attention`` (``implementation="xla"``) writes attention with a size-1
query-group axis: ``q`` reshaped to ``[b, t, n, 1, h]``, scores ``[b, n, t, 1, s]``
transposed to ``[1, b, n, t, s]``, softmax and the second dot on those 5-D values. These
rules rewrite such programs into the plain 4-D form (dots without size-1 free dims, the
reshapes that add or drop size-1 dims moved below elementwise ops, reductions, broadcasts
and transposes until they meet and cancel), the form the attention matcher and the rest of
the pipeline know. A reshape is *degenerate* when it only adds or drops size-1 dims.
"""
from __future__ import annotations

from typing import Optional

from hlo.ir import Instruction
from hlo.ops import OPS
from hlo.shape import Layout, Shape

from .rewrite import Rule, emit


def _big(dims: tuple) -> list[int]:
    return [k for k, d in enumerate(dims) if d != 1]


def degenerate_map(src: tuple, dst: tuple) -> Optional[dict[int, int]]:
    """src dim -> dst dim for the dims larger than 1, when a reshape src -> dst only adds or
    drops size-1 dims; None otherwise."""
    a, b = _big(src), _big(dst)
    if [src[k] for k in a] != [dst[k] for k in b]:
        return None
    return dict(zip(a, b))


def shape_like(like: Shape, dims, dtype=None) -> Shape:
    """A shape of ``dims`` (row-major when ``like`` has a layout) with ``like``'s type."""
    dims = tuple(dims)
    layout = Layout.row_major(len(dims)) if like.layout is not None else None
    return Shape(dtype or like.dtype, dims, layout)


def _degenerate_source(x: Instruction) -> Optional[Instruction]:
    """The operand of ``x`` when ``x`` is a degenerate reshape."""
    if x.opcode != "reshape" or not isinstance(x.shape, Shape):
        return None
    src = x.operands[0]
    if not isinstance(src.shape, Shape) or degenerate_map(src.shape.dims, x.shape.dims) is None:
        return None
    return src


def transpose_of_size_one_dims(i: Instruction):
    """A transpose that keeps the order of every dim larger than 1 is a reshape."""
    perm = tuple(i.attrs.get("dimensions", ()))
    order = [perm[j] for j in _big(i.shape.dims)]
    if order != sorted(order) or perm == tuple(range(len(perm))):
        return None
    return emit(i, "reshape", [i.operands[0]], i.shape, name="reshape")


def dot_size_one_dims(i: Instruction):
    """dot with size-1 free dims or contracting pairs -> reshape(dot without them):
    contracting over a size-1 dim is a product. Size-1 batch dims stay (the matchers and
    kernels index the batch as written)."""
    if not isinstance(i.shape, Shape):
        return None
    ops = i.operands
    batch = [tuple(i.attrs.get(f"{s}_batch_dims", ())) for s in ("lhs", "rhs")]
    contract = [tuple(i.attrs.get(f"{s}_contracting_dims", ())) for s in ("lhs", "rhs")]
    kept_pairs = [(a, b) for a, b in zip(*contract) if ops[0].shape.dims[a] != 1]
    drop = [{c for c in contract[side] if ops[side].shape.dims[c] == 1} |
            {d for d in range(x.shape.rank) if x.shape.dims[d] == 1
             and d not in batch[side] and d not in contract[side]}
            for side, x in enumerate(ops)]
    free = [[d for d in range(x.shape.rank) if d not in drop[side] and d not in batch[side]
             and d not in contract[side]] for side, x in enumerate(ops)]
    # Kernels and library calls take matrix products: keep a free dim on each side and a
    # contracting dim (a matrix-vector or outer product stays as written).
    if not (drop[0] or drop[1]) or not free[0] or not free[1] or not kept_pairs:
        return None
    new_ops, pos = [], []
    for side, x in enumerate(ops):
        keep = [d for d in range(x.shape.rank) if d not in drop[side]]
        pos.append({d: n for n, d in enumerate(keep)})
        new_ops.append(x if not drop[side] else emit(
            i, "reshape", [x], shape_like(x.shape, [x.shape.dims[d] for d in keep]),
            name="reshape"))
    attrs: dict = {}     # in the order XLA prints them
    for side, name in enumerate(("lhs", "rhs")):
        if batch[side]:
            attrs[f"{name}_batch_dims"] = tuple(pos[side][d] for d in batch[side])
        attrs[f"{name}_contracting_dims"] = tuple(pos[side][p[side]] for p in kept_pairs)
    attrs.update({k: v for k, v in i.attrs.items()
                  if not k.endswith(("_batch_dims", "_contracting_dims")) and k != "metadata"})
    dims = [ops[0].shape.dims[d] for d in batch[0]] + \
        [ops[0].shape.dims[d] for d in free[0]] + [ops[1].shape.dims[d] for d in free[1]]
    dot = emit(i, "dot", new_ops, shape_like(i.shape, dims), name="dot", **attrs)
    return emit(i, "reshape", [dot], i.shape, name="reshape")


def _at_source_shape(o: Instruction, anchor: Instruction, dims: tuple,
                     to_src: dict[int, int]) -> Optional[Instruction]:
    """Operand ``o`` of an elementwise op, seen with ``dims`` (the degenerate reshapes'
    source shape; ``to_src`` maps the op's dims larger than 1 to those): a degenerate
    reshape's source, a broadcast re-aimed, a scalar (clamp's bounds) as is."""
    if o.shape.rank == 0:
        return o
    src = _degenerate_source(o)
    if src is not None and src.shape.dims == dims:
        return src
    if o.opcode != "broadcast":
        return None
    x = o.operands[0]
    bdims = tuple(o.attrs.get("dimensions", ()))
    keep = [k for k in range(x.shape.rank) if o.shape.dims[bdims[k]] != 1]
    if any(bdims[k] not in to_src for k in keep):
        return None
    if len(keep) < x.shape.rank:     # size-1 operand dims on size-1 result dims: dropped
        x = emit(anchor, "reshape", [x], shape_like(x.shape, [x.shape.dims[k] for k in keep]),
                 name="reshape")
    return emit(anchor, "broadcast", [x], shape_like(o.shape, dims), name="broadcast",
                dimensions=tuple(to_src[bdims[k]] for k in keep))


def elementwise_of_degenerate_reshapes(i: Instruction):
    """op(reshape(a), reshape(b), broadcast(c)) with degenerate reshapes from one shape ->
    reshape(op(a, b, broadcast'(c)))."""
    if not i.op.elementwise or not isinstance(i.shape, Shape) or i.shape.rank == 0:
        return None
    first = next((s for s in map(_degenerate_source, i.operands) if s is not None), None)
    if first is None:
        return None
    dims = first.shape.dims
    if dims == i.shape.dims:
        return None
    to_src = {b: a for a, b in degenerate_map(dims, i.shape.dims).items()}
    # every operand must be expressible before anything is emitted: scalars, broadcasts
    # (every dim larger than 1 has a place in ``dims``) and reshapes from ``dims``
    for o in i.operands:
        s = _degenerate_source(o)
        if o.shape.rank and o.opcode != "broadcast" and (s is None or s.shape.dims != dims):
            return None
    new_ops = [_at_source_shape(o, i, dims, to_src) for o in i.operands]
    attrs = {k: v for k, v in i.attrs.items() if k != "metadata"}
    op = emit(i, i.opcode, new_ops, shape_like(i.shape, dims), name=i.opcode.replace("-", "_"),
              **attrs)
    return emit(i, "reshape", [op], i.shape, name="reshape")


def reduce_of_degenerate_reshape(i: Instruction):
    """reduce(reshape(x)) over dims larger than 1 -> reshape(reduce(x))."""
    if len(i.operands) != 2 or not isinstance(i.shape, Shape):
        return None
    x = _degenerate_source(i.operands[0])
    if x is None:
        return None
    to_src = {b: a for a, b in degenerate_map(x.shape.dims, i.operands[0].shape.dims).items()}
    dims = tuple(i.attrs.get("dimensions", ()))
    if any(d not in to_src for d in dims):
        return None
    src_dims = tuple(sorted(to_src[d] for d in dims))
    out = [n for k, n in enumerate(x.shape.dims) if k not in src_dims]
    attrs = {k: v for k, v in i.attrs.items() if k not in ("metadata", "dimensions")}
    red = emit(i, "reduce", [x, i.operands[1]], shape_like(i.shape, out), name="reduce",
               dimensions=src_dims, **attrs)
    return emit(i, "reshape", [red], i.shape, name="reshape")


def broadcast_of_degenerate_reshape(i: Instruction):
    """broadcast(reshape(x)) where the reshape only adds size-1 dims -> broadcast(x)."""
    x = _degenerate_source(i.operands[0])
    if x is None or 1 in x.shape.dims:
        return None
    to_mid = degenerate_map(x.shape.dims, i.operands[0].shape.dims)
    bdims = tuple(i.attrs.get("dimensions", ()))
    return emit(i, "broadcast", [x], i.shape, name="broadcast",
                dimensions=tuple(bdims[to_mid[k]] for k in range(x.shape.rank)))


def transpose_of_degenerate_reshape(i: Instruction):
    """transpose(reshape(x)) where the reshape only adds size-1 dims ->
    reshape(transpose(x))."""
    x = _degenerate_source(i.operands[0])
    if x is None or 1 in x.shape.dims:
        return None
    to_src = {b: a for a, b in degenerate_map(x.shape.dims, i.operands[0].shape.dims).items()}
    perm = tuple(i.attrs["dimensions"])
    src_perm = tuple(to_src[p] for p in perm if p in to_src)
    if src_perm == tuple(range(len(src_perm))):
        return emit(i, "reshape", [x], i.shape, name="reshape")
    t = emit(i, "transpose", [x], shape_like(i.shape, [x.shape.dims[p] for p in src_perm]),
             name="transpose", dimensions=src_perm)
    return emit(i, "reshape", [t], i.shape, name="reshape")


# The op table's elementwise ops, less those whose shape is not their operands' (a
# bitcast-convert between widths), that call a computation (map) or that only set a
# layout (copy).
ELEMENTWISE_OPCODES = tuple(sorted(n for n, d in OPS.items() if d.elementwise
                                   and n not in ("bitcast-convert", "map", "copy")))

DEGENERATE_DIM_RULES: list[Rule] = [
    Rule("transpose-of-size-one-dims", ("transpose",), transpose_of_size_one_dims),
    Rule("transpose-of-degenerate-reshape", ("transpose",), transpose_of_degenerate_reshape),
    Rule("dot-size-one-dims", ("dot",), dot_size_one_dims),
    Rule("elementwise-of-degenerate-reshapes", ELEMENTWISE_OPCODES,
         elementwise_of_degenerate_reshapes),
    Rule("reduce-of-degenerate-reshape", ("reduce",), reduce_of_degenerate_reshape),
    Rule("broadcast-of-degenerate-reshape", ("broadcast",), broadcast_of_degenerate_reshape),
]
