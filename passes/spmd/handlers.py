"""Partitioning rules of the arithmetic ops: elementwise, layout ops, reduce, dot, iota,
sort. Each takes the partitioner and the old instruction and returns its Value.

The rules that combine elements along a dimension mask that dimension's padding first:
a reduce fills it with its init value, a dot contracting a padded dimension with zeros (on
both operands: the padding may hold inf or NaN, and 0 * inf is not 0).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from hlo import dtypes as dt
from hlo.attrs import SliceDim, SliceSpec
from hlo.ir import Instruction
from hlo.sharding import Sharding

from . import rules
from hlo.shape import TupleShape

from .partitioner import Partitioner, Value, handler, local_shape, mixed_index, \
    partial_is_wellformed
from .tiling import Tiling


@handler("elementwise")
def elementwise(p: Partitioner, inst: Instruction) -> Value:
    t = p.target(inst)
    ops = [p.get(o, t) if len(o.shape.dims) == t.rank else p.whole(o) for o in inst.operands]
    return p.local_op(inst, ops, t)


@handler("copy")
def copy(p: Partitioner, inst: Instruction) -> Value:
    t = p.target(inst)
    return p.local_op(inst, [p.get(inst.operands[0], t)], t)


@handler("broadcast", "transpose")
def through_operand_map(p: Partitioner, inst: Instruction) -> Value:
    t = p.target(inst)
    want = rules.backward(inst, 0, t)
    return p.local_op(inst, [p.get(inst.operands[0], want)], t)


@handler("reshape")
def reshape(p: Partitioner, inst: Instruction) -> Value:
    t = p.target(inst)
    src, dst = inst.operands[0].shape.dims, inst.shape.dims
    want_in = rules.reshape_tiling(t, dst, src)
    out = rules.reshape_tiling(want_in, src, dst)
    return p.local_op(inst, [p.get(inst.operands[0], want_in)], out)


@handler("passthrough")
def passthrough(p: Partitioner, inst: Instruction) -> Value:
    """slice / pad / concatenate / reverse / dynamic-slice / dynamic-update-slice: local on
    the dims they leave alone (``rules.passthrough_dims``); the others whole."""
    t = p.target(inst)
    pt = rules.passthrough_dims(inst)
    want = rules.map_dims(t, {d: d for d in pt}, t.rank)
    n_data = rules.passthrough_data_operands(inst)
    ops = [p.get(o, want) if k < n_data else p.whole(o) for k, o in enumerate(inst.operands)]
    loc = p.local(want, inst.shape)
    attrs: dict[str, Any] = {}
    if inst.opcode == "slice":
        attrs["slice"] = SliceSpec(tuple(SliceDim(0, loc[i], 1) if i in pt else sd
                                         for i, sd in enumerate(inst.attrs["slice"].dims)))
    if inst.opcode == "dynamic-slice":
        attrs["dynamic_slice_sizes"] = tuple(loc)
    return p.local_op(inst, ops, want, attrs)


@handler("iota")
def iota(p: Partitioner, inst: Instruction) -> Value:
    """Each device makes its own piece: a local iota plus the offset of its tile along the
    iota dimension (no communication)."""
    t = p.target(inst)
    d = inst.attrs["iota_dimension"]
    val = p.local_op(inst, [], t)
    if t.tiles[d] == 1:
        return val
    loc = p.local(t, inst.shape)
    dtype = inst.shape.dtype
    offset = p.per_device_scalar([ix[d] * loc[d] for ix in t.index], dt.S32)
    if dtype != dt.S32:
        offset = p.add("convert", [offset], val.inst.shape.with_dims(()).with_layout(None))
    shifted = p.add("add", [val.inst, p.broadcast(offset, loc)], val.inst.shape)
    return Value(shifted, t, inst.shape)


# --- reduce ----------------------------------------------------------------------------
@handler("reduce")
def reduce(p: Partitioner, inst: Instruction) -> Value:
    """Local along the kept dims. Along a split reduced dim: the padding is filled with the
    init value, each device reduces its piece, then the pieces are combined: one operand
    as a pending sum (an all-reduce or reduce-scatter when a user needs it), several
    (argmax: values and indices) by gathering every device's partial results and reducing
    them again (XLA's way for a reducer that is not one collective op)."""
    k = len(inst.operands) // 2
    xs, inits = inst.operands[:k], inst.operands[k:]
    rank = len(xs[0].shape.dims)
    if any(len(x.shape.dims) != rank for x in xs):
        return p.fallback(inst)
    s = inst.sharding
    first = s.elements[0] if isinstance(s, Sharding) and s.is_tuple and s.elements else s
    out_shape = inst.shape.elements[0] if inst.shape.is_tuple else inst.shape
    t = Tiling.from_sharding(first, len(out_shape.dims), p.n)
    red = list(inst.attrs["dimensions"])
    kept = [d for d in range(rank) if d not in red]
    cur = p.tiling_of(xs[0])
    options = [rules.map_dims(t, {i: d for i, d in enumerate(kept)}, rank)]
    # Keep the operand's split of the reduced dims: reduce locally, then combine.
    keep = Tiling.from_index(
        [cur.tiles[d] if d in red else t.tiles[kept.index(d)] for d in range(rank)],
        [tuple(ci[d] if d in red else ti[kept.index(d)] for d in range(rank))
         for ci, ti in zip(cur.index, t.index)])
    if keep is not None and any(keep.tiles[d] > 1 for d in red):
        options.append(keep)
    if not any(cur.same_as(o) for o in options):
        options.append(cur)             # as the operand is: the result keeps its kept splits
    now = [p.vals[id(x)].tiling for x in xs]

    def cost(o: Tiling) -> int:
        moved = sum(p.plan_cost(v, o, x.shape) for v, x in zip(now, xs))
        res = _reduce_result(o, red, inst)
        if k == 1:
            return moved + p.plan_cost(res, t, out_shape)
        pieces = math.prod(o.tiles[d] for d in red)
        gathered = sum(math.prod(p.local(res, e)) * e.dtype.itemsize * pieces
                       for e in inst.shape.elements) if pieces > 1 else 0
        return moved + gathered + p.plan_cost(res.without_partial(), t, out_shape)
    best = p.cheapest([(o, lambda o=o: cost(o)) for o in options])
    init_whole = [p.whole(i) for i in inits]
    ins = [p.mask_padding(p.get(x, best), best, x.shape, red, i)
           for x, i in zip(xs, init_whole)]
    res = _reduce_result(best, red, inst)
    if k == 1:
        return p.local_op(inst, ins + init_whole, res)
    loc = p.local(res, out_shape)
    shape = TupleShape(tuple(local_shape(e, loc) for e in inst.shape.elements))
    local = p.add("reduce", ins + init_whole, shape, _attrs(inst), name=inst.name)
    parts = [p.add("get-tuple-element", [local], e, {"index": j})
             for j, e in enumerate(shape.elements)]
    if res.partial is not None:
        parts = _gather_and_reduce_again(p, inst, parts, best, red, init_whole)
    tiling = res.without_partial()
    return p.tuple_value(p.add("tuple", parts, TupleShape(tuple(x.shape for x in parts))),
                         [tiling] * k, inst.shape)


def _gather_and_reduce_again(p: Partitioner, inst: Instruction, parts: list[Instruction],
                             o: Tiling, red: list[int], inits: list[Instruction]
                             ) -> list[Instruction]:
    """Every device's partial results of a variadic reduce, gathered along a new leading
    dim over the devices splitting the reduced dims, and reduced again along it."""
    from .tiling import layered_groups
    kept = [d for d in range(o.rank) if d not in red]
    groups = layered_groups([tuple(ix[d] for d in kept) for ix in o.index],
                            [mixed_index(ix, red, o.tiles) for ix in o.index])
    pieces = len(groups[0])
    gathered = []
    for part in parts:
        dims = list(part.shape.dims)
        one = p.add("reshape", [part], local_shape(part.shape, [1] + dims))
        gathered.append(p.collective("all-gather", one, local_shape(part.shape, [pieces] + dims),
                                     groups, [1] + dims, dimensions=(0,)))
    shape = TupleShape(tuple(x.shape.with_dims(x.shape.dims[1:]).with_layout(
        local_shape(x.shape, x.shape.dims[1:]).layout) for x in gathered))
    again = p.add("reduce", gathered + inits, shape,
                  {"dimensions": (0,), "to_apply": inst.attrs["to_apply"]})
    return [p.add("get-tuple-element", [again], e, {"index": j})
            for j, e in enumerate(shape.elements)]


def _reduce_result(o: Tiling, red: list[int], inst: Instruction) -> Tiling:
    kept = [d for d in range(o.rank) if d not in red]
    tiles = tuple(o.tiles[d] for d in kept)
    index = tuple(tuple(ix[d] for d in kept) for ix in o.index)
    if any(o.tiles[d] > 1 for d in red):
        partial = tuple(mixed_index(ix, red, o.tiles) for ix in o.index)
        return Tiling(tiles, index, partial, inst.attrs["to_apply"])
    return Tiling(tiles, index)


# --- dot -------------------------------------------------------------------------------
@handler("dot")
def dot(p: Partitioner, inst: Instruction) -> Value:
    """Four placements (operands as they are; operands matching the result; the rhs
    matching the lhs; the lhs matching the rhs); the one moving fewest bytes wins."""
    t = p.target(inst)
    lhs, rhs = inst.operands
    lt, rt = p.tiling_of(lhs), p.tiling_of(rhs)
    adder = p.adder(inst.shape.dtype) if p.emit else None
    best = p.place(inst, [(lt, rt),
                          (rules.dot_operand_from_result(inst, t, 0),
                           rules.dot_operand_from_result(inst, t, 1)),
                          (lt, _dot_match(inst, lt, 1)),
                          (_dot_match(inst, rt, 0), rt)],
                   lambda cl, cr: _dot_local_result(inst, cl, cr, adder))
    if best is None:
        return p.fallback(inst)
    cl, cr, res = best
    lb, rb, lc, rc, lf, rf = rules.dot_dims(inst)
    a, b = p.get(lhs, cl), p.get(rhs, cr)
    if cl.padded_dims(lhs.shape.dims) and any(cl.tiles[d] > 1 for d in lc):
        a = p.mask_padding(a, cl, lhs.shape, lc, p.scalar(0, lhs.shape.dtype))
        b = p.mask_padding(b, cr, rhs.shape, rc, p.scalar(0, rhs.shape.dtype))
    return p.local_op(inst, [a, b], res)


def _dot_match(inst: Instruction, t: Tiling, which: int) -> Optional[Tiling]:
    """The other operand's tiling splitting batch and contracting dims like ``t`` does
    (operand ``1 - which``), its free dims whole."""
    lb, rb, lc, rc, lf, rf = rules.dot_dims(inst)
    if which == 1:   # build rhs from lhs t
        m = dict(zip(lb, rb))
        m.update(zip(lc, rc))
        rank = len(inst.operands[1].shape.dims)
    else:
        m = dict(zip(rb, lb))
        m.update(zip(rc, lc))
        rank = len(inst.operands[0].shape.dims)
    return rules.map_dims(t.without_partial(), m, rank)


def _dot_local_result(inst: Instruction, lt: Tiling, rt: Tiling, adder: Any
                      ) -> Optional[Tiling]:
    """The tiling a local dot of these operand tiles produces, or None if the devices'
    batch/contracting tiles disagree."""
    lb, rb, lc, rc, lf, rf = rules.dot_dims(inst)
    for a, b in list(zip(lb, rb)) + list(zip(lc, rc)):
        if lt.tiles[a] != rt.tiles[b]:
            return None
        if any(li[a] != ri[b] for li, ri in zip(lt.index, rt.index)):
            return None
    tiles = [lt.tiles[d] for d in lb + lf] + [rt.tiles[d] for d in rf]
    index = tuple(tuple(li[d] for d in lb + lf) + tuple(ri[d] for d in rf)
                  for li, ri in zip(lt.index, rt.index))
    partial = None
    if any(lt.tiles[d] > 1 for d in lc):
        partial = tuple(mixed_index(li, lc, lt.tiles) for li in lt.index)
    res = Tiling(tuple(tiles), index, partial, adder)
    pieces = 1
    for d in lc:
        pieces *= lt.tiles[d]
    return res if partial_is_wellformed(res, pieces) else None


# --- sort and top-k: local along the other dims ----------------------------------------
@handler("sort")
def sort(p: Partitioner, inst: Instruction) -> Value:
    """Sorted along one dimension, independent along the others: every operand split the
    same way on the other dims and whole on the sort dim, then a local sort."""
    d = inst.attrs["dimensions"][0]
    g = inst.operands[0].shape
    rank = len(g.dims)
    if any(len(o.shape.dims) != rank for o in inst.operands):
        return p.fallback(inst)
    s = inst.sharding
    first = s.elements[0] if isinstance(s, Sharding) and s.is_tuple and s.elements else s
    target = Tiling.from_sharding(first, rank, p.n)
    current = p.tiling_of(inst.operands[0])
    options = [c.replicate_dims([d]) for c in (target, current)]
    cur_vals = [p.vals[id(o)].tiling for o in inst.operands]
    want = p.cheapest([(o, lambda o=o: sum(p.plan_cost(c, o, op.shape) for c, op in
                                           zip(cur_vals, inst.operands))
                        + p.plan_cost(o, target, g)) for o in options])
    ops = [p.get(o, want) for o in inst.operands]
    loc = p.local(want, g)
    if inst.shape.is_tuple:
        shape = TupleShape(tuple(local_shape(e, loc) for e in inst.shape.elements))
        new = p.add("sort", ops, shape, _attrs(inst), name=inst.name)
        return p.tuple_value(new, [want] * len(ops), inst.shape)
    return p.local_op(inst, ops, want)


@handler("topk")
def topk(p: Partitioner, inst: Instruction) -> Value:
    """XLA's TopK (along the last dim): local on the leading dims."""
    x = inst.operands[0]
    last = len(x.shape.dims) - 1
    want = p.tiling_of(x).replicate_dims([last])
    loc = list(p.local(want, x.shape))
    loc[last] = inst.attrs["k"]
    shape = TupleShape(tuple(local_shape(e, loc) for e in inst.shape.elements))
    new = p.add("topk", [p.get(x, want)], shape, _attrs(inst), name=inst.name)
    out = Tiling(want.tiles, want.index)
    return p.tuple_value(new, [out, out], inst.shape)


def _attrs(inst: Instruction) -> dict:
    return {k: v for k, v in inst.attrs.items() if k != "sharding"}


# --- custom calls ----------------------------------------------------------------------
@handler("custom-call")
def custom_call(p: Partitioner, inst: Instruction) -> Value:
    target = inst.attrs.get("custom_call_target")
    if target == "Sharding" and not inst.shape.is_tuple:
        t = p.target(inst)
        return Value(p.get(inst.operands[0], t), t, inst.shape)
    if target == "SPMDShardToFullShape":
        from .control import shard_to_full
        return shard_to_full(p, inst)
    return p.fallback(inst)
