"""How a tiling passes through one op, forwards (operands -> result) and backwards
(result -> operand). Shared by sharding propagation and the partitioner.

Each rule returns a valid ``Tiling`` or None (no opinion). Dimensions an op cannot keep
split (a sliced or padded dim, a concatenated dim) come out replicated.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from hlo.dots import dot_dims  # noqa: F401  (rules.dot_dims: the handlers use it from here)
from hlo.ir import Instruction

from .tiling import Tiling


# --- dimension maps ---------------------------------------------------------------------
def map_dims(t: Tiling, src_to_dst: dict[int, int], dst_rank: int) -> Optional[Tiling]:
    """Move split dims: source dim s becomes result dim ``src_to_dst[s]``; source dims not
    in the map are dropped (their split becomes replication); other result dims are whole."""
    tiles = [1] * dst_rank
    for s, d in src_to_dst.items():
        tiles[d] = t.tiles[s]
    index = []
    for ix in t.index:
        out = [0] * dst_rank
        for s, d in src_to_dst.items():
            out[d] = ix[s]
        index.append(tuple(out))
    return Tiling.from_index(tiles, index)


def passthrough_dims(inst: Instruction) -> Optional[list[int]]:
    """Dims along which slice/pad/concatenate/reverse/dynamic-slice/dynamic-update-slice
    act elementwise (same size in and out, element i from element i), or None for other
    ops."""
    op = inst.opcode
    rank = len(inst.shape.dims) if not inst.shape.is_tuple else 0
    if op == "slice":
        dims = inst.operands[0].shape.dims
        return [i for i, sd in enumerate(inst.attrs["slice"].dims)
                if sd.start == 0 and sd.limit == dims[i] and sd.stride == 1]
    if op == "pad":
        return [i for i, pd in enumerate(inst.attrs["padding"].dims)
                if pd.low == 0 and pd.high == 0 and pd.interior == 0]
    if op == "concatenate":
        return [i for i in range(rank) if i != inst.attrs["dimensions"][0]]
    if op == "reverse":
        return [i for i in range(rank) if i not in inst.attrs["dimensions"]]
    if op == "dynamic-slice":
        dims = inst.operands[0].shape.dims
        return [i for i, s in enumerate(inst.attrs["dynamic_slice_sizes"]) if s == dims[i]]
    if op == "dynamic-update-slice":     # the update covers these dims whole
        dims, upd = inst.operands[0].shape.dims, inst.operands[1].shape.dims
        return [i for i in range(rank) if upd[i] == dims[i]]
    return None


def passthrough_data_operands(inst: Instruction) -> int:
    """How many leading operands of a passthrough op are split with its result (the rest,
    start indices and padding values, are whole)."""
    if inst.opcode == "concatenate":
        return len(inst.operands)
    return 2 if inst.opcode == "dynamic-update-slice" else 1


def reshape_groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Minimal groups of dims (of a, of b) with equal element counts, in order."""
    groups = []
    i = j = 0
    while i < len(a) or j < len(b):
        ga, gb = [], []
        pa = pb = 1
        if i < len(a):
            ga.append(i)
            pa *= a[i]
            i += 1
        if j < len(b):
            gb.append(j)
            pb *= b[j]
            j += 1
        while pa != pb:
            if pa < pb:
                ga.append(i)
                pa *= a[i]
                i += 1
            else:
                gb.append(j)
                pb *= b[j]
                j += 1
        groups.append((ga, gb))
    return groups


def reshape_tiling(t: Tiling, src: Sequence[int], dst: Sequence[int]) -> Tiling:
    """The tiling of a reshape's result (src dims -> dst dims) keeping every split that
    stays contiguous: a group of dims split only on its first non-trivial dim, by a factor
    that divides it and the first non-trivial dim on the other side (or the dim passes
    through unchanged). Other groups replicate."""
    mapping: dict[int, int] = {}
    for ga, gb in reshape_groups(src, dst):
        split = [d for d in ga if t.tiles[d] > 1]
        if not split:
            continue
        first_a = next((d for d in ga if src[d] > 1), None)
        first_b = next((d for d in gb if dst[d] > 1), None)
        if len(split) != 1 or split[0] != first_a or first_b is None:
            continue
        n = t.tiles[split[0]]
        # An uneven (padded) split survives only a dim kept as it is: anywhere else the
        # padding would land in the middle of the reshaped piece.
        one_to_one = ([d for d in ga if src[d] > 1] == [first_a]
                      and [d for d in gb if dst[d] > 1] == [first_b]
                      and src[first_a] == dst[first_b])
        if one_to_one or (src[first_a] % n == 0 and dst[first_b] % n == 0):
            mapping[split[0]] = first_b
    out = map_dims(t.without_partial(), mapping, len(dst))
    assert out is not None   # dropping or moving whole dims keeps a tiling uniform
    return out


def _shape_dims(inst: Instruction) -> tuple[int, ...]:
    return tuple(inst.shape.dims)


# --- dot ---------------------------------------------------------------------------------


def dot_operand_from_result(inst: Instruction, out: Tiling, which: int) -> Optional[Tiling]:
    """The operand tiling matching the result's split of batch and free dims (contracting
    dims whole): the operands a dot needs to produce ``out`` with no communication after."""
    lb, rb, lc, rc, lf, rf = dot_dims(inst)
    nb = len(lb)
    if which == 0:
        m = {i: d for i, d in enumerate(lb)}
        m.update({nb + i: d for i, d in enumerate(lf)})
        rank = len(inst.operands[0].shape.dims)
    else:
        m = {i: d for i, d in enumerate(rb)}
        m.update({nb + len(lf) + i: d for i, d in enumerate(rf)})
        rank = len(inst.operands[1].shape.dims)
    return map_dims(out.without_partial(), m, rank)


def dot_result(inst: Instruction, lhs: Optional[Tiling], rhs: Optional[Tiling]
               ) -> Optional[Tiling]:
    """The result tiling from the operands' batch/free splits (contracting splits are
    summed away). Combines both operands when that is a valid tiling, else the more split."""
    lb, rb, lc, rc, lf, rf = dot_dims(inst)
    nb, nl = len(lb), len(lf)
    rank = nb + nl + len(rf)
    cands = []
    if lhs is not None and rhs is not None:
        tiles = [lhs.tiles[d] for d in lb] + [lhs.tiles[d] for d in lf] + [rhs.tiles[d] for d in rf]
        index = [tuple(li[d] for d in lb) + tuple(li[d] for d in lf) + tuple(ri[d] for d in rf)
                 for li, ri in zip(lhs.index, rhs.index)]
        both = Tiling.from_index(tiles, index)
        if both is not None:
            return both
    if lhs is not None:
        m = {d: i for i, d in enumerate(lb)}
        m.update({d: nb + i for i, d in enumerate(lf)})
        cands.append(map_dims(lhs.without_partial(), m, rank))
    if rhs is not None:
        m = {d: i for i, d in enumerate(rb)}
        m.update({d: nb + nl + i for i, d in enumerate(rf)})
        cands.append(map_dims(rhs.without_partial(), m, rank))
    cands = [c for c in cands if c is not None]
    return max(cands, key=lambda c: math.prod(c.tiles), default=None)


# --- forward and backward ----------------------------------------------------------------
_IDENTITY_LIKE = ("copy", "custom-call", "optimization-barrier")


def forward(inst: Instruction, ops: list[Optional[Tiling]]) -> Optional[Tiling]:
    if inst.shape.is_tuple:
        return None
    rank = len(inst.shape.dims)
    opc = inst.opcode
    if inst.op.elementwise or opc in ("copy",) or (
            opc == "custom-call" and inst.attrs.get("custom_call_target") == "Sharding"):
        known = [t for t, o in zip(ops, inst.operands)
                 if t is not None and not o.shape.is_tuple and len(o.shape.dims) == rank]
        return max((t.without_partial() for t in known), key=lambda t: math.prod(t.tiles),
                   default=None)
    if not ops or ops[0] is None:
        if opc == "dot" and len(ops) == 2 and ops[1] is not None:
            return dot_result(inst, None, ops[1])
        if opc == "gather" and len(ops) == 2 and ops[1] is not None:
            return map_dims(ops[1].without_partial(), gather_dim_maps(inst)[1], rank)
        if opc == "dynamic-update-slice" and ops[1] is not None:
            return map_dims(ops[1].without_partial(), {d: d for d in passthrough_dims(inst)},
                            rank)
        return None
    t = ops[0].without_partial()
    if opc == "broadcast":
        return map_dims(t, {k: d for k, d in enumerate(inst.attrs["dimensions"])}, rank)
    if opc == "transpose":
        perm = inst.attrs["dimensions"]
        return map_dims(t, {p: i for i, p in enumerate(perm)}, rank)
    if opc == "reshape":
        return reshape_tiling(t, _shape_dims(inst.operands[0]), _shape_dims(inst))
    if opc == "dot":
        return dot_result(inst, ops[0], ops[1])
    if opc == "reduce" and len(inst.operands) == 2:
        red = inst.attrs["dimensions"]
        kept = [d for d in range(t.rank) if d not in red]
        return map_dims(t, {d: i for i, d in enumerate(kept)}, rank)
    pt = passthrough_dims(inst)
    if pt is not None:
        data = [o.without_partial() for o in ops[:passthrough_data_operands(inst)]
                if o is not None]
        cands = [map_dims(o, {d: d for d in pt}, rank) for o in data]
        return max((c for c in cands if c is not None), key=lambda c: math.prod(c.tiles),
                   default=None)
    if opc == "scatter" and len(inst.operands) == 3:
        fixed = set(inst.attrs.get("inserted_window_dims", ())) | set(
            inst.attrs.get("scatter_dims_to_operand_dims", ()))
        return map_dims(t, {d: d for d in range(rank) if d not in fixed}, rank)
    if opc == "gather":
        return _gather_forward(inst, t, ops[1] if len(ops) > 1 else None)
    if opc == "sort":
        return t.replicate_dims(inst.attrs["dimensions"])
    return None


def tuple_forward(inst: Instruction, ops: list[Optional[Tiling]]) -> Optional[list[Tiling]]:
    """Element tilings of a tuple-shaped op (sort, topk) from its operands'."""
    if inst.opcode == "sort" and ops and ops[0] is not None:
        t = ops[0].without_partial().replicate_dims(inst.attrs["dimensions"])
        return [t] * len(inst.shape.elements)
    if inst.opcode == "topk" and ops and ops[0] is not None:
        t = ops[0].without_partial()
        t = t.replicate_dims([t.rank - 1])
        return [t, t]
    return None


def gather_dim_maps(inst: Instruction) -> tuple[dict[int, int], dict[int, int]]:
    """(operand dim -> result dim for dims every slice takes whole; indices dim -> result
    dim for the batch dims). Those are the dims a gather is local along."""
    a = inst.attrs
    collapsed = set(a.get("collapsed_slice_dims", ())) | set(a.get("operand_batching_dims", ()))
    op_dims = inst.operands[0].shape.dims
    kept = [d for d in range(len(op_dims)) if d not in collapsed]
    offset = list(a.get("offset_dims", ()))
    whole = {d: out_d for d, out_d in zip(kept, offset)
             if d not in a.get("start_index_map", ()) and a["slice_sizes"][d] == op_dims[d]}
    ivd = a["index_vector_dim"]
    idx_rank = len(inst.operands[1].shape.dims)
    batch_out = [d for d in range(len(inst.shape.dims)) if d not in offset]
    batch_idx = [d for d in range(idx_rank) if d != ivd]
    return whole, dict(zip(batch_idx, batch_out))


def _gather_forward(inst: Instruction, t: Tiling, idx: Optional[Tiling]) -> Optional[Tiling]:
    """Operand dims taken whole by every slice keep their split in the offset dims; the
    indices' batch dims keep theirs in the result's batch dims (index-parallel)."""
    whole, batch = gather_dim_maps(inst)
    rank = len(inst.shape.dims)
    from_operand = map_dims(t, whole, rank)
    if idx is None:
        return from_operand
    from_indices = map_dims(idx.without_partial(), batch, rank)
    cands = [c for c in (from_operand, from_indices) if c is not None]
    return max(cands, key=lambda c: math.prod(c.tiles), default=None)


def backward(user: Instruction, k: int, out: Tiling) -> Optional[Tiling]:
    """The tiling operand ``k`` of ``user`` would want for ``user`` to be split as ``out``."""
    if user.shape.is_tuple:
        return None
    operand = user.operands[k]
    if operand.shape.is_tuple:
        return None
    rank = len(operand.shape.dims)
    opc = user.opcode
    out = out.without_partial()
    if user.op.elementwise or opc == "copy" or (
            opc == "custom-call" and user.attrs.get("custom_call_target") == "Sharding"):
        return out if rank == out.rank else None
    if opc == "broadcast":
        return map_dims(out, {d: i for i, d in enumerate(user.attrs["dimensions"])}, rank)
    if opc == "transpose":
        return map_dims(out, {i: p for i, p in enumerate(user.attrs["dimensions"])}, rank)
    if opc == "reshape":
        return reshape_tiling(out, _shape_dims(user), _shape_dims(operand))
    if opc == "dot":
        return dot_operand_from_result(user, out, k)
    if opc == "reduce" and k == 0 and len(user.operands) == 2:
        red = user.attrs["dimensions"]
        kept = [d for d in range(rank) if d not in red]
        return map_dims(out, {i: d for i, d in enumerate(kept)}, rank)
    pt = passthrough_dims(user)
    if pt is not None and k < passthrough_data_operands(user):
        return map_dims(out, {d: d for d in pt}, rank)
    if opc == "sort":
        return out.replicate_dims(user.attrs["dimensions"])
    if opc == "gather" and k in (0, 1):
        m = gather_dim_maps(user)[k]
        return map_dims(out, {r: o for o, r in m.items()}, rank)
    return None
