"""Data movement: shapes change, values do not (broadcast, slices, pads, gather/scatter ...).

Gather and scatter follow the StableHLO spec's index arithmetic, vectorized over every
result (gather) or update (scatter) element at once. Where XLA and the spec's "undefined"
cases meet, XLA wins: gather clamps start indices so the slice fits; scatter skips a whole
update window when any part of it would fall outside the operand.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import EvaluationError
from ..ir import Instruction
from ..ops import rule
from .core import TOKEN
from .elementwise import convert_array
from .reductions import apply_elementwise


def _ints(inst: Instruction, name: str, default: Sequence[int] | None = None) -> tuple[int, ...]:
    v = inst.attrs.get(name, default)
    if v is None:
        raise EvaluationError(f"{inst.opcode} %{inst.name} lacks attribute {name}")
    return tuple(int(i) for i in v)


# --- identity-like -------------------------------------------------------------------------
@rule("evaluate", "constant")
def _constant(inst, ops, ctx):
    if inst.literal is None:
        raise EvaluationError(f"constant %{inst.name} has no value (elided as {{...}} in the text)")
    return inst.literal


@rule("evaluate", "tuple")
def _tuple(inst, ops, ctx):
    return tuple(ops)


@rule("evaluate", "get-tuple-element")
def _gte(inst, ops, ctx):
    t = ops[0]
    if not isinstance(t, tuple):
        raise EvaluationError("get-tuple-element of a non-tuple value")
    return t[int(inst.attrs["index"])]


@rule("evaluate", "optimization-barrier", "domain")
def _identity(inst, ops, ctx):
    return ops[0]


@rule("evaluate", "add-dependency")
def _add_dependency(inst, ops, ctx):
    return ops[0]


@rule("evaluate", "after-all")
def _after_all(inst, ops, ctx):
    return TOKEN


@rule("evaluate", "copy-start")
def _copy_start(inst, ops, ctx):
    # XLA's copy-start yields (destination, source, u32[] context); copy-done takes {0}.
    x = ops[0]
    return (x.copy(), x, np.zeros((), np.uint32))


@rule("evaluate", "copy-done")
def _copy_done(inst, ops, ctx):
    return ops[0][0]


@rule("evaluate", "get-dimension-size")
def _get_dimension_size(inst, ops, ctx):
    d = _ints(inst, "dimensions")[0]
    return np.asarray(ops[0].shape[d], dtype=inst.shape.dtype.np_dtype)


# --- shape changes -------------------------------------------------------------------------
@rule("evaluate", "broadcast")
def _broadcast(inst, ops, ctx):
    x = ops[0]
    dims = _ints(inst, "dimensions", ())
    out_dims = inst.shape.dims
    if len(dims) != x.ndim:
        raise EvaluationError(f"broadcast dimensions {dims} do not match operand rank {x.ndim}")
    # Put the operand's dims in the order they take in the output, then insert 1s.
    order = sorted(range(x.ndim), key=lambda i: dims[i])
    xt = np.transpose(x, order)
    shape = [1] * len(out_dims)
    for i in order:
        shape[dims[i]] = x.shape[i]
    return np.broadcast_to(xt.reshape(shape), out_dims).copy()


@rule("evaluate", "reshape", "dynamic-reshape")
def _reshape(inst, ops, ctx):
    return ops[0].reshape(inst.shape.dims)


@rule("evaluate", "bitcast")
def _bitcast(inst, ops, ctx):
    """A bitcast reinterprets the physical buffer (``hlo.layout_util``): the operand's bytes
    in its layout are read back as the result's physical dims in the result's layout, and as
    the result's element type when that differs (same width only; the verifier checks)."""
    from ..layout_util import from_physical, is_default, to_physical
    src_shape, dst_shape = inst.operands[0].shape, inst.shape
    if src_shape.dtype != dst_shape.dtype and (
            src_shape.dtype.bits != dst_shape.dtype.bits or src_shape.dtype.bits % 8):
        raise EvaluationError(f"bitcast %{inst.name} changes the element width "
                              f"{src_shape.dtype} -> {dst_shape.dtype}; that is bitcast-convert")
    x = np.asarray(ops[0])
    if src_shape.dims == dst_shape.dims and (src_shape.layout == dst_shape.layout or (
            is_default(src_shape.layout) and is_default(dst_shape.layout))):
        # Same physical order: reinterpret element by element. This is also the path for
        # reducer/comparator bodies evaluated on whole arrays at once.
        return x.view(dst_shape.dtype.np_dtype) if src_shape.dtype != dst_shape.dtype else x
    physical = to_physical(x, src_shape.layout)
    if src_shape.dtype != dst_shape.dtype:
        physical = np.ascontiguousarray(physical).view(dst_shape.dtype.np_dtype)
    return from_physical(physical, dst_shape)


@rule("evaluate", "transpose")
def _transpose(inst, ops, ctx):
    return np.transpose(ops[0], _ints(inst, "dimensions")).copy()


@rule("evaluate", "reverse")
def _reverse(inst, ops, ctx):
    return np.flip(ops[0], axis=_ints(inst, "dimensions", ())).copy()


@rule("evaluate", "slice")
def _slice(inst, ops, ctx):
    spec = inst.attrs["slice"]
    return ops[0][tuple(slice(d.start, d.limit, d.stride) for d in spec.dims)].copy()


@rule("evaluate", "concatenate")
def _concatenate(inst, ops, ctx):
    return np.concatenate(ops, axis=_ints(inst, "dimensions")[0])


@rule("evaluate", "pad")
def _pad(inst, ops, ctx):
    x, value = ops
    config = inst.attrs["padding"]
    out = x
    for axis, d in enumerate(config.dims):
        n = out.shape[axis]
        # Interior padding first: n elements with `interior` pad values between neighbours.
        size = n + max(n - 1, 0) * d.interior
        shape = list(out.shape)
        shape[axis] = size
        spread = np.full(shape, value, dtype=x.dtype)
        idx = [slice(None)] * out.ndim
        idx[axis] = slice(0, size, d.interior + 1)
        spread[tuple(idx)] = out
        # Then edges: positive pads add values, negative ones cut elements off.
        lo = max(d.low, 0)
        hi = max(d.high, 0)
        shape[axis] = size + lo + hi
        full = np.full(shape, value, dtype=x.dtype)
        idx[axis] = slice(lo, lo + size)
        full[tuple(idx)] = spread
        idx[axis] = slice(-min(d.low, 0), shape[axis] + min(d.high, 0))
        out = full[tuple(idx)]
    if out.shape != tuple(inst.shape.dims):
        raise EvaluationError(f"pad produced {out.shape}, expected {inst.shape.dims}")
    return out.copy()


@rule("evaluate", "iota")
def _iota(inst, ops, ctx):
    dims = inst.shape.dims
    d = int(inst.attrs["iota_dimension"])
    dtype = inst.shape.dtype
    ramp = np.arange(dims[d], dtype=np.int64)
    shape = [1] * len(dims)
    shape[d] = dims[d]
    return np.broadcast_to(convert_array(ramp, dtype).reshape(shape), dims).copy()


# --- dynamic slices --------------------------------------------------------------------------
def _clamped_starts(x: np.ndarray, index_values: Sequence[np.ndarray],
                    sizes: Sequence[int]) -> list[int]:
    """Start indices clamped into [0, dim - size], as the spec and XLA do."""
    if len(index_values) == 1 and np.asarray(index_values[0]).ndim == 1:
        index_values = list(np.asarray(index_values[0]))   # old-style single vector operand
    if len(index_values) != x.ndim:
        raise EvaluationError(f"{len(index_values)} start indices for a rank-{x.ndim} operand")
    return [int(min(max(int(np.asarray(s)), 0), n - k))
            for s, n, k in zip(index_values, x.shape, sizes)]


@rule("evaluate", "dynamic-slice")
def _dynamic_slice(inst, ops, ctx):
    x = ops[0]
    sizes = _ints(inst, "dynamic_slice_sizes")
    starts = _clamped_starts(x, ops[1:], sizes)
    return x[tuple(slice(s, s + k) for s, k in zip(starts, sizes))].copy()


@rule("evaluate", "dynamic-update-slice")
def _dynamic_update_slice(inst, ops, ctx):
    x, update = ops[0], ops[1]
    starts = _clamped_starts(x, ops[2:], update.shape)
    out = x.copy()
    out[tuple(slice(s, s + k) for s, k in zip(starts, update.shape))] = update
    return out


# --- gather ----------------------------------------------------------------------------------
def _index_vector_components(indices: np.ndarray, ivd: int, batch_index: list[np.ndarray]
                             ) -> list[np.ndarray]:
    """For each batch position, the index vector's components (one array per component)."""
    if ivd == indices.ndim:
        indices = indices[..., None]
    comps = []
    for k in range(indices.shape[ivd]):
        sel = batch_index[:ivd] + [np.asarray(k)] + batch_index[ivd:]
        comp = indices[tuple(sel)]
        if comp.dtype == np.uint64:
            # A u64 index above int64's range must stay large (clamped or skipped as out
            # of range), not wrap to a negative int64.
            comp = np.minimum(comp, np.iinfo(np.int64).max)
        comps.append(comp.astype(np.int64))
    return comps


@rule("evaluate", "gather")
def _gather(inst, ops, ctx):
    operand, indices = ops
    offset_dims = _ints(inst, "offset_dims", ())
    collapsed = _ints(inst, "collapsed_slice_dims", ())
    start_index_map = _ints(inst, "start_index_map", ())
    op_batching = _ints(inst, "operand_batching_dims", ())
    idx_batching = _ints(inst, "start_indices_batching_dims", ())
    ivd = int(inst.attrs.get("index_vector_dim", indices.ndim))
    slice_sizes = _ints(inst, "slice_sizes")
    out_dims = inst.shape.dims

    res = np.indices(out_dims, dtype=np.int64) if out_dims else np.zeros((0,), np.int64)
    batch_dims = [d for d in range(len(out_dims)) if d not in offset_dims]
    batch_index = [res[d] for d in batch_dims]
    start = _index_vector_components(indices, ivd, batch_index)
    if len(start) != len(start_index_map):
        raise EvaluationError(f"index vector has {len(start)} components but start_index_map "
                              f"has {len(start_index_map)}")
    operand_index = [np.zeros(out_dims, np.int64) for _ in range(operand.ndim)]
    for k, d in enumerate(start_index_map):
        hi = operand.shape[d] - slice_sizes[d]
        operand_index[d] = operand_index[d] + np.clip(start[k], 0, hi)
    for d_op, d_idx in zip(op_batching, idx_batching):
        operand_index[d_op] = operand_index[d_op] + batch_index[d_idx if d_idx < ivd else d_idx - 1]
    window_operand_dims = [d for d in range(operand.ndim)
                           if d not in collapsed and d not in op_batching]
    for d_out, d_op in zip(sorted(offset_dims), window_operand_dims):
        operand_index[d_op] = operand_index[d_op] + res[d_out]
    if not out_dims:
        return operand[tuple(int(np.asarray(i)) for i in operand_index)].copy()
    return operand[tuple(operand_index)]


# --- scatter ---------------------------------------------------------------------------------
def _is_add_combiner(comp) -> bool:
    """True when the combiner is ``add(param 0, param 1)``."""
    root, params = comp.root, comp.parameters
    return (len(params) == 2 and root.opcode == "add"
            and {id(o) for o in root.operands} == {id(p) for p in params})


@rule("evaluate", "scatter")
def _scatter(inst, ops, ctx):
    n = (len(ops) - 1) // 2
    inputs, indices, updates = list(ops[:n]), ops[n], list(ops[n + 1:])
    window_dims = _ints(inst, "update_window_dims", ())
    inserted = _ints(inst, "inserted_window_dims", ())
    to_operand = _ints(inst, "scatter_dims_to_operand_dims", ())
    in_batching = _ints(inst, "input_batching_dims", ())
    idx_batching = _ints(inst, "scatter_indices_batching_dims", ())
    ivd = int(inst.attrs.get("index_vector_dim", indices.ndim))
    comp = inst.attrs["to_apply"]
    operand = inputs[0]
    upd_dims = updates[0].shape
    rank = operand.ndim

    upd = np.indices(upd_dims, dtype=np.int64).reshape(len(upd_dims), -1) if upd_dims else \
        np.zeros((0, 1), np.int64)
    scatter_dims = [d for d in range(len(upd_dims)) if d not in window_dims]
    scatter_index = [upd[d] for d in scatter_dims]
    start = _index_vector_components(indices, ivd, scatter_index)
    if len(start) != len(to_operand):
        raise EvaluationError(f"index vector has {len(start)} components but "
                              f"scatter_dims_to_operand_dims has {len(to_operand)}")
    count = upd.shape[1]
    window_start = [np.zeros(count, np.int64) for _ in range(rank)]
    for k, d in enumerate(to_operand):
        window_start[d] = window_start[d] + start[k]
    for d_in, d_idx in zip(in_batching, idx_batching):
        window_start[d_in] = window_start[d_in] + scatter_index[d_idx if d_idx < ivd else d_idx - 1]
    window_input_dims = [d for d in range(rank) if d not in inserted and d not in in_batching]
    window_size = [1] * rank
    offset = [np.zeros(count, np.int64) for _ in range(rank)]
    for d_upd, d_in in zip(sorted(window_dims), window_input_dims):
        window_size[d_in] = upd_dims[d_upd]
        offset[d_in] = upd[d_upd]
    # XLA drops a whole update window when it does not fit in the operand.
    valid = np.ones(count, bool)
    for d in range(rank):
        valid &= (window_start[d] >= 0) & (window_start[d] + window_size[d] <= operand.shape[d])
    target = tuple((window_start[d] + offset[d])[valid] for d in range(rank))
    flat_updates = [u.reshape(-1)[valid] for u in updates]
    results = [x.copy() for x in inputs]

    if n == 1 and operand.dtype.kind in "iu" and _is_add_combiner(comp):
        # Integer addition wraps and is associative: numpy's unbuffered add is exact.
        np.add.at(results[0], target, flat_updates[0])
        return results[0]
    # General case. Updates to one position must be combined in row-major update order;
    # different positions are independent. So apply "rounds": round k holds the k-th update
    # of every position (no position twice), each round one vectorized combiner call.
    count = len(flat_updates[0])
    if count == 0:
        return results[0] if n == 1 else tuple(results)
    linear = np.ravel_multi_index(target, operand.shape) if rank else np.zeros(count, np.int64)
    order = np.argsort(linear, kind="stable")
    sorted_lin = linear[order]
    group_start = np.r_[0, np.flatnonzero(np.diff(sorted_lin)) + 1]
    starts = np.repeat(group_start, np.diff(np.r_[group_start, count]))
    occurrence = np.empty(count, np.int64)
    occurrence[order] = np.arange(count) - starts
    dtypes = [r.dtype for r in results]
    for k in range(int(occurrence.max()) + 1):
        sel = occurrence == k
        pos = tuple(t[sel] for t in target)
        current = [r[pos] for r in results]
        combined = apply_elementwise(comp, current + [u[sel] for u in flat_updates], ctx, dtypes)
        for r, v in zip(results, combined):
            r[pos] = v
    return results[0] if n == 1 else tuple(results)
