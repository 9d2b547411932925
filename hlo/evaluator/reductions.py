"""Reductions: reduce, reduce-window, select-and-scatter, sort, topk, batch-norm.

Calling an interpreted reducer once per element is far too slow, so two tricks are used:

* The common reducer bodies (one add/multiply/maximum/minimum/and/or/xor of the two
  parameters) are recognised and run as one vectorised numpy reduction.
* Any other reducer is still elementwise, so it is evaluated on whole arrays: a reduction
  over K elements becomes a pairwise tree of ~log2(K) calls of the reducer computation, each
  combining all output positions at once. If a body refuses arrays (an op that needs scalar
  shapes), the evaluation falls back to one call per output element.

Float sums of low-precision types (bf16, f16, f8) accumulate in f32 and round once at the
end; XLA:CPU's own bf16 accumulation order is an implementation detail (its vectorised loop
rounds partial sums), so results agree with jax.jit to bf16 tolerance, not bit for bit.
Integer reductions wrap exactly like the element type.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Optional, Sequence

import math

import numpy as np

from .. import dtypes as dt
from ..errors import EvaluationError
from ..ir import Computation, Instruction
from ..ops import rule
from .core import EvalContext
from .numerics import wrap_int

# ---------------------------------------------------------------------------------------
# Recognising simple reducer / comparator bodies
# ---------------------------------------------------------------------------------------
_BINARY_UFUNCS: dict[str, Callable] = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
}


def simple_binary_reducer(comp: Computation) -> Optional[str]:
    """The opcode if ``comp`` is ``ROOT op(p0, p1)`` (either order) on scalars, else None."""
    root = comp.root
    if root is None or len(comp.parameters) != 2 or root.opcode not in _BINARY_UFUNCS:
        return None
    if root.shape.is_tuple or root.shape.dims:
        return None
    ops = root.operands
    if len(ops) != 2 or not all(o.opcode == "parameter" for o in ops):
        return None
    if {ops[0].parameter_number, ops[1].parameter_number} != {0, 1}:
        return None
    return root.opcode


def _ufunc_for(opcode: str, dtype: np.dtype) -> Callable:
    """numpy ufunc implementing ``opcode`` on ``dtype`` with XLA's meaning."""
    is_bool = dtype == np.bool_
    is_int = np.issubdtype(dtype, np.integer) or _is_subbyte_int(dtype)
    if opcode in ("and", "or", "xor"):
        if is_bool:
            return _BINARY_UFUNCS[opcode]
        return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[opcode]
    if is_bool and opcode == "add":
        return np.logical_or
    if is_bool and opcode == "multiply":
        return np.logical_and
    if opcode in ("maximum", "minimum") and not is_int and not is_bool:
        return _BINARY_UFUNCS[opcode]      # NaN-propagating, as XLA's max/min
    return _BINARY_UFUNCS[opcode]


def _is_subbyte_int(dtype: np.dtype) -> bool:
    return dtype.name in ("int2", "int4", "uint2", "uint4")


def _is_float(dtype: np.dtype) -> bool:
    """Any real float type, ml_dtypes' bf16/f8/f6/f4 included."""
    try:
        return dt.from_numpy(dtype).is_float
    except dt.DTypeError:
        return False


def _is_low_float(dtype: np.dtype) -> bool:
    """bf16, f16 and the f8/f6/f4 formats: accumulate these in f32."""
    return _is_float(dtype) and np.dtype(dtype).itemsize < 4


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype numpy should compute a fast-path reduction in (then cast back)."""
    if dtype == np.bool_:
        return dtype
    if dtype.name in ("int2", "int4"):
        return np.dtype(np.int64)
    if dtype.name in ("uint2", "uint4"):
        return np.dtype(np.uint64)
    if _is_low_float(dtype):
        return np.dtype(np.float32)
    return dtype


def cast_wrapping(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast to ``dtype``; integers wrap modulo 2**bits as XLA's do (sub-byte ints too)."""
    dtype = np.dtype(dtype)
    x = np.asarray(x)
    if x.dtype == dtype:
        return x
    hdt = dt.from_numpy(dtype)
    if hdt.is_integer and (x.dtype.kind in "iub" or _is_subbyte_int(x.dtype)):
        return wrap_int(x, hdt)
    return x.astype(dtype)


# ---------------------------------------------------------------------------------------
# Applying a general (elementwise) computation to arrays
# ---------------------------------------------------------------------------------------
def _as_list(v: Any) -> list:
    return list(v) if isinstance(v, tuple) else [v]


def apply_elementwise(comp: Computation, args: Sequence[np.ndarray], ctx: EvalContext,
                      out_dtypes: Sequence[np.dtype]) -> list[np.ndarray]:
    """Evaluate a scalar computation on same-shaped arrays, elementwise.

    First tries one call with whole arrays (the body only uses elementwise ops); if that
    fails or produces the wrong shape, evaluates it once per element.
    """
    shape = np.broadcast_shapes(*[np.shape(a) for a in args])
    args = [np.broadcast_to(a, shape) for a in args]
    try:
        out = _as_list(ctx.call(comp, list(args)))
        if all(np.shape(o) == shape for o in out) and len(out) == len(out_dtypes):
            return [np.asarray(o).astype(d, copy=False) for o, d in zip(out, out_dtypes)]
    except EvaluationError:
        pass
    results = [np.empty(shape, d) for d in out_dtypes]
    for idx in np.ndindex(*shape):
        vals = _as_list(ctx.call(comp, [np.asarray(a[idx]) for a in args]))
        for r, v in zip(results, vals):
            r[idx] = v
    return results


def _tree_fold(comp: Computation, columns: list[np.ndarray], init: list[np.ndarray],
               ctx: EvalContext, dtypes: list[np.dtype]) -> list[np.ndarray]:
    """Reduce the last axis of each array in ``columns`` with ``comp``; then fold in init.

    Adjacent pairs are combined (lhs is always the earlier element), so a reducer that is
    associative but not commutative still gets a correct result.
    """
    k = columns[0].shape[-1]
    out_shape = columns[0].shape[:-1]
    if k == 0:
        return [np.broadcast_to(i, out_shape).astype(d) for i, d in zip(init, dtypes)]
    while k > 1:
        half = k // 2
        lhs = [c[..., 0:2 * half:2] for c in columns]
        rhs = [c[..., 1:2 * half:2] for c in columns]
        combined = apply_elementwise(comp, lhs + rhs, ctx, dtypes)
        if k % 2:
            combined = [np.concatenate([m, c[..., -1:]], axis=-1)
                        for m, c in zip(combined, columns)]
        columns = combined
        k = columns[0].shape[-1]
    last = [c[..., 0] for c in columns]
    inits = [np.broadcast_to(i, out_shape) for i in init]
    return apply_elementwise(comp, inits + last, ctx, dtypes)


def _is_identity(opcode: str, init: np.ndarray) -> bool:
    """Whether ``init`` is ``opcode``'s identity (0 for add, 1 for multiply)."""
    unit = {"add": 0, "multiply": 1}.get(opcode)
    return unit is not None and bool(init == unit)


def _fast_reduce(opcode: str, x: np.ndarray, axes: tuple[int, ...], init: np.ndarray,
                 out_dtype: np.dtype) -> np.ndarray:
    cdt = _compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    ic = np.asarray(init).astype(cdt)
    uf = _ufunc_for(opcode, cdt)
    out_shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    if xc.size == 0 or any(x.shape[a] == 0 for a in axes):
        r = np.broadcast_to(ic, out_shape)
    elif all(x.shape[a] == 1 for a in axes) and _is_identity(opcode, ic):
        # Nothing is combined: the input itself, as XLA (its simplifier makes such a reduce
        # a reshape). Applying the init would not be the identity at the edges: complex
        # (1+0j) * (inf+infj) is nan+nanj, 0.0 + -0.0 is 0.0.
        r = xc.reshape(out_shape)
    else:
        r = uf(ic, uf.reduce(xc, axis=axes)) if axes else uf(ic, xc)
    return cast_wrapping(np.asarray(r), out_dtype)


# ---------------------------------------------------------------------------------------
# reduce
# ---------------------------------------------------------------------------------------
@rule("evaluate", "reduce")
def _reduce(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    axes = tuple(inst.attrs.get("dimensions", ()))
    comp: Computation = inst.attrs["to_apply"]
    out_shapes = list(inst.shape.elements) if inst.shape.is_tuple else [inst.shape]
    dtypes = [s.dtype.np_dtype for s in out_shapes]
    for a in axes:
        if a < 0 or a >= inputs[0].ndim:
            raise EvaluationError(f"reduce dimension {a} out of range for rank {inputs[0].ndim}")
    if n == 1:
        opcode = simple_binary_reducer(comp)
        if opcode is not None:
            return _fast_reduce(opcode, inputs[0], axes, inits[0], dtypes[0])
    keep = [d for d in range(inputs[0].ndim) if d not in axes]
    cols = []
    for x in inputs:
        t = np.transpose(x, keep + list(axes))
        # The reduced extent spelled out: -1 is ambiguous when a kept dimension is 0.
        cols.append(t.reshape(t.shape[:len(keep)] + (math.prod(t.shape[len(keep):]),)))
    out = _tree_fold(comp, cols, [np.asarray(i) for i in inits], ctx, dtypes)
    out = [np.ascontiguousarray(o).reshape(s.dims) for o, s in zip(out, out_shapes)]
    return tuple(out) if inst.shape.is_tuple else out[0]


# ---------------------------------------------------------------------------------------
# reduce-window
# ---------------------------------------------------------------------------------------
def _window_dims(inst: Instruction, rank: int):
    window = inst.attrs.get("window")
    if window is None or len(window.dims) != rank:
        raise EvaluationError(f"{inst.opcode} needs a window of rank {rank}")
    return window.dims


def _pad_dilate(x: np.ndarray, dims, fill: np.ndarray) -> np.ndarray:
    """Base-dilate then pad ``x`` (negative padding slices), filling with ``fill``."""
    shape = []
    for s, d in zip(x.shape, dims):
        dil = (s - 1) * d.base_dilation + 1 if s else 0
        shape.append(dil + max(d.padding_low, 0) + max(d.padding_high, 0))
    out = np.full(shape, fill, dtype=x.dtype)
    sl = tuple(slice(max(d.padding_low, 0), max(d.padding_low, 0) + ((s - 1) * d.base_dilation + 1
                                                                   if s else 0), d.base_dilation)
               for s, d in zip(x.shape, dims))
    out[sl] = x
    crop = tuple(slice(-min(d.padding_low, 0), n + min(d.padding_high, 0))
                 for n, d in zip(shape, dims))
    return out[crop]


def _window_views(padded: np.ndarray, dims, out_dims: Sequence[int]):
    """Yield, for each window offset in row-major order, the strided slice of ``padded``
    holding that window element for every output position."""
    for offs in itertools.product(*[range(d.size) for d in dims]):
        sl = []
        for o, d, n in zip(offs, dims, out_dims):
            start = o * d.window_dilation
            sl.append(slice(start, start + (n - 1) * d.stride + 1 if n else start, d.stride))
        yield offs, padded[tuple(sl)]


def _window_out_dims(padded_shape, dims) -> list[int]:
    out = []
    for s, d in zip(padded_shape, dims):
        span = (d.size - 1) * d.window_dilation + 1
        out.append(0 if s < span else (s - span) // d.stride + 1)
    return out


@rule("evaluate", "reduce-window")
def _reduce_window(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    n = len(operands) // 2
    inputs, inits = operands[:n], [np.asarray(i) for i in operands[n:]]
    dims = _window_dims(inst, inputs[0].ndim)
    comp: Computation = inst.attrs["to_apply"]
    out_shapes = list(inst.shape.elements) if inst.shape.is_tuple else [inst.shape]
    dtypes = [s.dtype.np_dtype for s in out_shapes]
    opcode = simple_binary_reducer(comp) if n == 1 else None
    # The spec pads with the init value, so each padding element is reduced in once more;
    # XLA only visits window elements that land on the operand (padding and base-dilation
    # holes are skipped), which differs where the init value is not the reducer's identity.
    skip = ctx.numerics == "xla_cpu"
    valid = _pad_dilate(np.ones(inputs[0].shape, bool), dims, np.asarray(False)) if skip else None
    valid_views = [v for _, v in _window_views(valid, dims, _window_out_dims(valid.shape, dims))] \
        if skip else None
    if opcode is not None:
        cdt = _compute_dtype(inputs[0].dtype)
        padded = _pad_dilate(inputs[0].astype(cdt), dims, inits[0].astype(cdt))
        out_dims = _window_out_dims(padded.shape, dims)
        uf = _ufunc_for(opcode, cdt)
        acc = np.broadcast_to(inits[0].astype(cdt), out_dims).copy()
        # Narrow floats (bf16, f16, f8) are computed in f32 but every step's result is
        # rounded back to the element type, as XLA:CPU and the reference interpreter do (a
        # bf16 cumsum is a running bf16 sum). One f32 add of two narrow floats rounded to
        # them is their correctly rounded sum: f32 has more than 2p+2 bits for p <= 11.
        step_type = dtypes[0] if _is_low_float(np.dtype(dtypes[0])) else None
        for w, (_, view) in enumerate(_window_views(padded, dims, out_dims)):
            new = uf(acc, view)
            if step_type is not None:
                new = new.astype(step_type).astype(cdt)
            acc = new if not skip else np.where(valid_views[w], new, acc)
        return cast_wrapping(acc, dtypes[0]).reshape(out_shapes[0].dims)
    padded = [_pad_dilate(x, dims, i.astype(x.dtype)) for x, i in zip(inputs, inits)]
    out_dims = _window_out_dims(padded[0].shape, dims)
    accs = [np.broadcast_to(i, out_dims).astype(d) for i, d in zip(inits, dtypes)]
    views = [list(_window_views(p, dims, out_dims)) for p in padded]
    for w in range(len(views[0])):
        new = apply_elementwise(comp, accs + [v[w][1] for v in views], ctx, dtypes)
        accs = new if not skip else [np.where(valid_views[w], a, b) for a, b in zip(new, accs)]
    out = [np.ascontiguousarray(a).reshape(s.dims) for a, s in zip(accs, out_shapes)]
    return tuple(out) if inst.shape.is_tuple else out[0]


# ---------------------------------------------------------------------------------------
# select-and-scatter
# ---------------------------------------------------------------------------------------
def _compare_reducer(comp: Computation) -> Optional[str]:
    """'GE'/'GT'/'LE'/'LT' if ``comp`` is ``ROOT compare(p0, p1)``, else None."""
    root = comp.root
    if root is None or root.opcode != "compare" or len(comp.parameters) != 2:
        return None
    a, b = root.operands
    if a.opcode == b.opcode == "parameter" and (a.parameter_number, b.parameter_number) == (0, 1):
        return root.attrs.get("direction")
    return None


_CMP = {"GE": np.greater_equal, "GT": np.greater, "LE": np.less_equal, "LT": np.less,
        "EQ": np.equal, "NE": np.not_equal}


@rule("evaluate", "select-and-scatter")
def _select_and_scatter(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    """For each window (one per source element), pick the element ``select`` prefers (the
    first one for which select(current, candidate) stays true wins) and combine the
    source value into the result at that element with ``scatter``. Padding is never
    selected (XLA only visits in-bounds window elements)."""
    operand, source, init = operands[0], operands[1], np.asarray(operands[2])
    dims = _window_dims(inst, operand.ndim)
    if any(d.base_dilation != 1 or d.window_dilation != 1 for d in dims):
        raise EvaluationError("select-and-scatter does not take dilations")
    select: Computation = inst.attrs["select"]
    scatter: Computation = inst.attrs["scatter"]
    flat_idx = np.arange(operand.size, dtype=np.int64).reshape(operand.shape)
    pad_dims = [d for d in dims]
    padded_val = _pad_dilate(operand, pad_dims, np.zeros((), operand.dtype))
    padded_idx = _pad_dilate(flat_idx, pad_dims, np.asarray(-1, np.int64))
    out_dims = list(source.shape)
    direction = _compare_reducer(select)
    sel_val = np.zeros(out_dims, operand.dtype)
    sel_idx = np.full(out_dims, -1, np.int64)
    for (_, vidx), (_, vval) in zip(_window_views(padded_idx, dims, out_dims),
                                    _window_views(padded_val, dims, out_dims)):
        valid = vidx >= 0
        have = sel_idx >= 0
        if direction is not None:
            keep = _CMP[direction](sel_val, vval)
        else:
            keep = apply_elementwise(select, [sel_val, vval], ctx, [np.dtype(np.bool_)])[0]
        take = valid & (~have | ~keep)
        sel_val = np.where(take, vval, sel_val)
        sel_idx = np.where(take, vidx, sel_idx)
    out_dtype = inst.shape.dtype.np_dtype
    result = np.full(operand.size, init, dtype=out_dtype)
    idx = sel_idx.ravel()
    src = source.ravel()
    ok = idx >= 0
    opcode = simple_binary_reducer(scatter)
    if opcode in ("add", "maximum", "minimum", "multiply") and out_dtype != np.bool_:
        cdt = _compute_dtype(np.dtype(out_dtype))
        acc = result.astype(cdt)
        _ufunc_for(opcode, cdt).at(acc, idx[ok], src[ok].astype(cdt))
        result = cast_wrapping(acc, out_dtype)
    else:
        for i, v in zip(idx[ok], src[ok]):   # source elements in row-major order, as XLA
            result[i] = np.asarray(ctx.call(scatter, [np.asarray(result[i]), np.asarray(v)]))
    return result.reshape(operand.shape)


# ---------------------------------------------------------------------------------------
# sort and topk
# ---------------------------------------------------------------------------------------
def total_order_key(x: np.ndarray) -> np.ndarray:
    """Integer keys whose order is XLA's TOTALORDER for floats (-NaN < -inf < ... < -0 <
    +0 < ... < inf < NaN) and the natural order for integers and pred."""
    dt = x.dtype
    if dt == np.bool_:
        return x.astype(np.int8)
    if np.issubdtype(dt, np.integer):
        return x
    if dt.name in ("int2", "int4", "uint2", "uint4"):
        return x.astype(np.int64)
    bits = dt.itemsize * 8
    signed = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}[bits]
    i = x.view(signed).astype(np.int64)
    mag = (1 << (bits - 1)) - 1
    return np.where(i < 0, i ^ mag, i)


def _sort_comparator(comp: Computation) -> Optional[tuple[str, int, Optional[str], bool]]:
    """(direction, operand, compare type, canonicalised) if the comparator orders by one operand only, else None.

    Recognises ``compare(p[2i], p[2i+1])`` with LT/GT, directly or through the
    NaN/zero-canonicalising selects jax emits (``select(x != x, nan, select(x == 0, 0, x))``):
    those canonicalise -0 to +0 and every NaN to +NaN before a TOTALORDER compare."""
    root = comp.root
    if root is None or root.opcode != "compare" or root.attrs.get("direction") not in ("LT", "GT"):
        return None
    ctype = root.attrs.get("type")

    def param_of(x: Instruction) -> Optional[tuple[int, bool]]:
        if x.opcode == "parameter":
            return x.parameter_number, False
        # jax's canonicalisation: select(ne(p,p), nan, select(eq(p,0), 0, p))
        if x.opcode == "select" and x.operands[2].opcode == "select":
            inner = x.operands[2]
            p = inner.operands[2]
            if p.opcode == "parameter":
                return p.parameter_number, True
        return None
    a, b = param_of(root.operands[0]), param_of(root.operands[1])
    if a is None or b is None or a[1] != b[1]:
        return None
    if a[0] % 2 or b[0] != a[0] + 1:
        if b[0] % 2 == 0 and a[0] == b[0] + 1:     # compare(p1, p0): the other direction
            return ({"LT": "GT", "GT": "LT"}[root.attrs["direction"]], b[0] // 2,
                    ctype, a[1])
        return None
    return root.attrs["direction"], a[0] // 2, ctype, a[1]


def _keys_for(x: np.ndarray, ctype: Optional[str], canonical: bool) -> np.ndarray:
    if x.dtype.kind == "c":
        raise EvaluationError("complex sort keys need a general comparator")
    if not _is_float(x.dtype):
        return total_order_key(x)
    if canonical:
        x = np.where(x == 0, np.zeros((), x.dtype), x)
        x = np.where(np.isnan(x), np.asarray(np.nan, x.dtype), x)
    elif ctype != "TOTALORDER":
        # FLOAT LT is not a strict weak order with NaNs; XLA leaves the result
        # unspecified. Canonicalise so that NaNs sort last (the usual outcome) and -0 == +0.
        x = np.where(x == 0, np.zeros((), x.dtype), x)
        x = np.where(np.isnan(x), np.asarray(np.nan, x.dtype), x)
    return total_order_key(x)


def stable_argsort(keys: np.ndarray, descending: bool) -> np.ndarray:
    """Stable argsort along the last axis; descending keeps ties in original order."""
    if not descending:
        return np.argsort(keys, axis=-1, kind="stable")
    n = keys.shape[-1]
    p = np.argsort(keys[..., ::-1], axis=-1, kind="stable")
    return (n - 1 - p)[..., ::-1]


def _general_sort(comp: Computation, arrays: list[np.ndarray], ctx: EvalContext) -> np.ndarray:
    """Sorting permutation (last axis) using the comparator computation, vectorised.

    A bitonic network is data-oblivious, so every compare-exchange stage is one call of the
    comparator on whole arrays. Ties are broken by the original index, which makes the
    network's order exactly the stable sort's order. The length is padded to a power of
    two with sentinel elements that compare greater than everything.
    """
    n = arrays[0].shape[-1]
    size = 1
    while size < n:
        size *= 2
    lead = arrays[0].shape[:-1]
    perm = np.broadcast_to(np.arange(size), lead + (size,)).copy()   # original index

    def take(a: np.ndarray, p: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, np.minimum(p, n - 1), axis=-1)

    def less(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """original index i sorts before j (element-wise arrays of indices)."""
        ai = [take(a, i) for a in arrays]
        aj = [take(a, j) for a in arrays]
        args_ij = [v for pair in zip(ai, aj) for v in pair]
        args_ji = [v for pair in zip(aj, ai) for v in pair]
        lt = apply_elementwise(comp, args_ij, ctx, [np.dtype(np.bool_)])[0]
        gt = apply_elementwise(comp, args_ji, ctx, [np.dtype(np.bool_)])[0]
        pi, pj = i >= n, j >= n
        res = np.where(lt, True, np.where(gt, False, i < j))
        return np.where(pi | pj, ~pi & pj | (pi & pj & (i < j)), res)

    k = 2
    pos = np.arange(size)
    while k <= size:
        j = k // 2
        while j >= 1:
            partner = pos ^ j
            lo = pos[partner > pos]
            hi = partner[partner > pos]
            ascending = (lo & k) == 0
            a, b = perm[..., lo], perm[..., hi]
            b_first = less(b, a)
            swap = np.where(ascending, b_first, ~b_first)
            perm[..., lo] = np.where(swap, b, a)
            perm[..., hi] = np.where(swap, a, b)
            j //= 2
        k *= 2
    return perm[..., :n]


@rule("evaluate", "sort")
def _sort(inst: Instruction, operands: list, ctx: EvalContext) -> Any:
    dims = inst.attrs.get("dimensions", (0,))
    d = dims[0] if dims else 0
    comp: Computation = inst.attrs["to_apply"]
    if not operands:
        raise EvaluationError("sort needs at least one operand")
    if d < 0 or d >= operands[0].ndim:
        raise EvaluationError(f"sort dimension {d} out of range for rank {operands[0].ndim}")
    moved = [np.moveaxis(x, d, -1) for x in operands]
    recog = _sort_comparator(comp)
    perm = None
    if recog is not None:
        direction, which, ctype, canonical = recog
        try:
            keys = _keys_for(moved[which], ctype, canonical)
            perm = stable_argsort(keys, descending=(direction == "GT"))
        except EvaluationError:
            perm = None
    if perm is None:
        perm = _general_sort(comp, moved, ctx) if moved[0].shape[-1] > 1 else \
            np.zeros(moved[0].shape, np.int64)
    out = [np.moveaxis(np.take_along_axis(x, perm, axis=-1), -1, d) for x in moved]
    out = [np.ascontiguousarray(o) for o in out]
    return tuple(out) if inst.shape.is_tuple else out[0]


@rule("evaluate", "topk")
def _topk(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    """The k largest (or smallest) along the last axis, ties to the lower index, values in
    TOTALORDER (NaN is above +inf, as XLA:CPU's TopK sorts with a total order)."""
    x = operands[0]
    k = int(inst.attrs["k"])
    largest = inst.attrs.get("largest", True)
    if k > x.shape[-1]:
        raise EvaluationError(f"topk k={k} exceeds the last dimension {x.shape[-1]}")
    perm = stable_argsort(total_order_key(x), descending=largest)[..., :k]
    values = np.take_along_axis(x, perm, axis=-1)
    idx_dtype = inst.shape.elements[1].dtype.np_dtype
    return values, perm.astype(idx_dtype)


# ---------------------------------------------------------------------------------------
# batch norm
# ---------------------------------------------------------------------------------------
def _bn_setup(inst: Instruction, x: np.ndarray):
    f = int(inst.attrs.get("feature_index", x.ndim - 1))
    eps = float(inst.attrs.get("epsilon", 0.001))
    axes = tuple(i for i in range(x.ndim) if i != f)
    cdt = np.float64 if x.dtype == np.float64 else np.float32
    bshape = [1] * x.ndim
    bshape[f] = x.shape[f]
    return f, eps, axes, cdt, bshape


@rule("evaluate", "batch-norm-training")
def _bn_training(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    x, scale, offset = operands
    f, eps, axes, cdt, bshape = _bn_setup(inst, x)
    xc = x.astype(cdt)
    mean = xc.mean(axis=axes)
    var = np.square(xc - mean.reshape(bshape)).mean(axis=axes)   # biased, as XLA
    y = (xc - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + cdt(eps))
    y = y * scale.astype(cdt).reshape(bshape) + offset.astype(cdt).reshape(bshape)
    dt = x.dtype
    return y.astype(dt), mean.astype(dt), var.astype(dt)


@rule("evaluate", "batch-norm-inference")
def _bn_inference(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    x, scale, offset, mean, var = operands
    f, eps, axes, cdt, bshape = _bn_setup(inst, x)
    r = lambda a: a.astype(cdt).reshape(bshape)  # noqa: E731
    y = (x.astype(cdt) - r(mean)) / np.sqrt(r(var) + cdt(eps)) * r(scale) + r(offset)
    return y.astype(x.dtype)


@rule("evaluate", "batch-norm-grad")
def _bn_grad(inst: Instruction, operands: list, ctx: EvalContext) -> tuple:
    """XLA's formulas: with N elements per feature and xhat = (x - mean) / sqrt(var + eps),
    grad_scale = sum(dy * xhat), grad_offset = sum(dy),
    grad_x = scale / sqrt(var + eps) / N * (N * dy - grad_offset - xhat * grad_scale)."""
    x, scale, mean, var, dy = operands
    f, eps, axes, cdt, bshape = _bn_setup(inst, x)
    r = lambda a: a.astype(cdt).reshape(bshape)  # noqa: E731
    n = x.size // x.shape[f] if x.shape[f] else 0
    inv = 1.0 / np.sqrt(r(var) + cdt(eps))
    xhat = (x.astype(cdt) - r(mean)) * inv
    dyc = dy.astype(cdt)
    g_offset = dyc.sum(axis=axes)
    g_scale = (dyc * xhat).sum(axis=axes)
    gx = r(scale) * inv / cdt(n) * (cdt(n) * dyc - g_offset.reshape(bshape)
                                     - xhat * g_scale.reshape(bshape))
    dt = x.dtype
    return gx.astype(dt), g_scale.astype(dt), g_offset.astype(dt)
