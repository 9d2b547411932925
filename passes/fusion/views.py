"""Index maps through view instructions: which operand element does a view read?

A *view* here is an instruction whose element at index ``i`` is one element of its operand
at an index that is a permutation/selection of ``i``'s coordinates: broadcast, transpose,
copy, reshapes and bitcasts that only insert or drop size-1 dimensions (or keep the non-1
dimensions in place), and, where the caller allows it, float converts (same element,
another precision).

``trace_view(inst)`` follows a chain of views down to the first instruction that is not
one and returns ``(source, where)``: ``where[d]`` is the source dimension that ``inst``'s
dimension ``d`` indexes, or None where ``d`` does not index the source (a broadcast
dimension, or a size-1 dimension). Pattern matchers use it to ask "is this the row maximum
broadcast back along the reduced axis?" without caring how JAX spelled the broadcast.
"""
from __future__ import annotations

from typing import Optional, Sequence

from hlo.ir import Instruction
from hlo.layout_util import major_to_minor

Where = tuple[Optional[int], ...]

VIEW_OPS = frozenset({"broadcast", "transpose", "copy", "reshape", "bitcast"})


def _pair_non_one(src_order: Sequence[int], src_dims: Sequence[int],
                  dst_order: Sequence[int], dst_dims: Sequence[int]) -> Optional[dict[int, int]]:
    """dst dim -> src dim pairing the non-1 dims in the given orders, when their sizes agree
    one to one (a reshape/bitcast that moves no element); else None."""
    a = [d for d in src_order if src_dims[d] != 1]
    b = [d for d in dst_order if dst_dims[d] != 1]
    if len(a) != len(b) or any(src_dims[x] != dst_dims[y] for x, y in zip(a, b)):
        return None
    return dict(zip(b, a))


def view_step(inst: Instruction, converts: bool = False) -> Optional[Where]:
    """``where`` for one view instruction (its operand 0 is the source), or None."""
    op = inst.opcode
    if inst.shape.is_tuple or not inst.operands or inst.operands[0].shape.is_tuple:
        return None
    src = inst.operands[0].shape
    rank = inst.shape.rank
    if op == "broadcast":
        dims = list(inst.attrs.get("dimensions", ()))
        out: list[Optional[int]] = [None] * rank
        for i, d in enumerate(dims):
            out[d] = i
        return tuple(out)
    if op == "transpose":
        return tuple(inst.attrs["dimensions"])
    if op == "copy":
        return tuple(range(rank))
    if op == "convert":
        if not converts or not (src.dtype.is_float and inst.shape.dtype.is_float):
            return None
        return tuple(range(rank))
    if op in ("reshape", "bitcast"):
        if op == "bitcast" and src.dtype != inst.shape.dtype:
            return None
        if op == "bitcast":
            pairs = _pair_non_one(major_to_minor(src.layout, src.rank), src.dims,
                                  major_to_minor(inst.shape.layout, rank), inst.shape.dims)
        else:
            pairs = _pair_non_one(range(src.rank), src.dims, range(rank), inst.shape.dims)
        if pairs is None:
            return None
        return tuple(pairs.get(d) for d in range(rank))
    return None


def compose(outer: Where, inner: Where) -> Where:
    """``where`` of a chain: ``outer`` maps the top dims to a middle value's dims, ``inner``
    maps the middle value's dims to the source's."""
    return tuple(None if d is None else inner[d] for d in outer)


def trace_view(inst: Instruction, converts: bool = False,
               through: Optional[list[Instruction]] = None) -> tuple[Instruction, Where]:
    """Follow views from ``inst`` to a non-view source: ``(source, where)``. Dims that map
    to a size-1 source dim come back as None. ``through`` collects the views passed."""
    where: Where = tuple(range(inst.shape.rank)) if inst.shape.is_array else ()
    cur = inst
    while True:
        step = view_step(cur, converts) if cur.opcode in VIEW_OPS | {"convert"} else None
        if step is None:
            break
        if through is not None:
            through.append(cur)
        where = compose(where, step)
        cur = cur.operands[0]
    dims = cur.shape.dims if cur.shape.is_array else ()
    return cur, tuple(None if d is None or dims[d] == 1 else d for d in where)
