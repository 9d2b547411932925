"""Simplifier rules that move transposes toward the consumers (the transpose half of XLA's
ReshapeMover, and its transpose folding into dots).

``jax.nn.dot_product_attention`` with grouped-query heads computes the scores as
``[b, kv, t, g, s]`` and transposes them to ``[g, b, kv, t, s]`` before the mask and the
softmax; the second dot then reads the probabilities through that order. Moving the
transpose below the elementwise ops and reductions (where every operand is the same
transpose, a broadcast or a scalar) and folding it into the dot gives the softmax in the
order q·k wrote it — the form the attention matcher knows — and in general puts a
transpose where it touches the fewest elements (after a reduction, after a narrowing
convert) or where a dot absorbs it.
"""
from __future__ import annotations

from typing import Optional

from hlo.ir import Instruction
from hlo.shape import Shape

from .degenerate_dims import ELEMENTWISE_OPCODES, shape_like
from .rewrite import Rule, emit


def _transposed(x: Instruction) -> Optional[tuple[Instruction, tuple]]:
    """(source, permutation) of a transpose that keeps the last dim last: moving one below
    a row reduction (a softmax's) keeps it a row reduction; a transpose that brings a dim
    to the end (a key axis written first) stays where the program put it."""
    if x.opcode != "transpose" or not isinstance(x.shape, Shape):
        return None
    perm = tuple(x.attrs["dimensions"])
    if not perm or perm[-1] != len(perm) - 1:
        return None
    return x.operands[0], perm


def _rebroadcast(o: Instruction, anchor: Instruction, perm: tuple,
                 src_dims: tuple) -> Instruction:
    """broadcast ``o`` (in the transposed coordinates) re-aimed at the transpose's source
    coordinates: result dim j of the transpose is source dim perm[j]."""
    x = o.operands[0]
    targets = [perm[d] for d in o.attrs.get("dimensions", ())]
    order = sorted(range(len(targets)), key=targets.__getitem__)
    if order != list(range(len(targets))):      # keep broadcast dims increasing
        x = emit(anchor, "transpose", [x], shape_like(x.shape, [x.shape.dims[k] for k in order]),
                 name="transpose", dimensions=tuple(order))
    return emit(anchor, "broadcast", [x], shape_like(o.shape, src_dims), name="broadcast",
                dimensions=tuple(sorted(targets)))


def elementwise_of_transposes(i: Instruction):
    """op(transpose(a), transpose(b), broadcast(c)) with one permutation ->
    transpose(op(a, b, broadcast'(c)))."""
    if not isinstance(i.shape, Shape) or i.shape.rank == 0:
        return None
    if i.opcode == "convert" and i.shape.dtype.bits > i.operands[0].shape.dtype.bits:
        return None     # a transpose is cheaper on the narrow side of a convert
    first = next((t for t in map(_transposed, i.operands) if t is not None), None)
    if first is None:
        return None
    src, perm = first
    for o in i.operands:
        t = _transposed(o)
        if o.shape.rank and o.opcode != "broadcast" and (
                t is None or t[1] != perm or t[0].shape.dims != src.shape.dims):
            return None
    new_ops = []
    for o in i.operands:
        t = _transposed(o)
        if t is not None and t[1] == perm:
            new_ops.append(t[0])
        elif o.shape.rank == 0:
            new_ops.append(o)
        else:
            new_ops.append(_rebroadcast(o, i, perm, src.shape.dims))
    attrs = {k: v for k, v in i.attrs.items() if k != "metadata"}
    op = emit(i, i.opcode, new_ops, shape_like(i.shape, src.shape.dims),
              name=i.opcode.replace("-", "_"), **attrs)
    return emit(i, "transpose", [op], i.shape, name="transpose", dimensions=perm)


def reduce_of_transpose(i: Instruction):
    """reduce(transpose(x)) -> transpose(reduce(x)) (the transpose on the smaller result)."""
    if len(i.operands) != 2 or not isinstance(i.shape, Shape):
        return None
    t = _transposed(i.operands[0])
    if t is None:
        return None
    x, perm = t
    dims = set(i.attrs.get("dimensions", ()))
    src_dims = tuple(sorted(perm[d] for d in dims))
    kept = [k for k in range(x.shape.rank) if k not in src_dims]       # new result's dims
    wanted = [perm[j] for j in range(len(perm)) if j not in dims]       # old result's order
    residual = tuple(kept.index(k) for k in wanted)
    attrs = {k: v for k, v in i.attrs.items() if k not in ("metadata", "dimensions")}
    red = emit(i, "reduce", [x, i.operands[1]],
               shape_like(i.shape, [x.shape.dims[k] for k in kept]), name="reduce",
               dimensions=src_dims, **attrs)
    if residual == tuple(range(len(residual))):
        return red
    return emit(i, "transpose", [red], i.shape, name="transpose", dimensions=residual)


def dot_of_transpose_reordering_free_dims(i: Instruction):
    """dot(transpose(a), b) whose free dims change order -> transpose(dot(a, b)) (the
    simplifier's dot-transposed-operand takes the order-keeping case)."""
    if not isinstance(i.shape, Shape):
        return None
    for idx, side in enumerate(("lhs", "rhs")):
        t = _transposed(i.operands[idx])
        if t is None:
            continue
        x, perm = t
        batch = tuple(i.attrs.get(f"{side}_batch_dims", ()))
        contract = tuple(i.attrs.get(f"{side}_contracting_dims", ()))
        free = [d for d in range(len(perm)) if d not in batch and d not in contract]
        new_free = [perm[d] for d in free]
        if new_free == sorted(new_free):
            continue
        attrs = {k: v for k, v in i.attrs.items() if k != "metadata"}
        attrs[f"{side}_batch_dims"] = tuple(perm[d] for d in batch)
        attrs[f"{side}_contracting_dims"] = tuple(perm[d] for d in contract)
        if not batch:
            attrs.pop(f"{side}_batch_dims")
        nb = len(i.attrs.get("lhs_batch_dims", ()))
        n_lhs_free = i.operands[0].shape.rank - nb - len(i.attrs.get("lhs_contracting_dims", ()))
        # output positions of this side's free dims, before and after
        start = nb + (0 if idx == 0 else n_lhs_free)
        sorted_free = sorted(new_free)
        out_perm = list(range(i.shape.rank))
        for j, d in enumerate(new_free):
            out_perm[start + j] = start + sorted_free.index(d)
        operands = list(i.operands)
        operands[idx] = x
        dims = [i.shape.dims[k] for k in range(i.shape.rank)]
        for j, d in enumerate(new_free):
            dims[start + sorted_free.index(d)] = i.shape.dims[start + j]
        dot = emit(i, "dot", operands, shape_like(i.shape, dims), name="dot", **attrs)
        return emit(i, "transpose", [dot], i.shape, name="transpose", dimensions=tuple(out_perm))
    return None


TRANSPOSE_RULES: list[Rule] = [
    Rule("elementwise-of-transposes", ELEMENTWISE_OPCODES, elementwise_of_transposes),
    Rule("reduce-of-transpose", ("reduce",), reduce_of_transpose),
    Rule("dot-of-transpose-reordering-free-dims", ("dot",), dot_of_transpose_reordering_free_dims),
]
