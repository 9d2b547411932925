"""dot, ragged-dot, convolution, fft, cholesky and triangular-solve.

Accumulation follows XLA:CPU: narrow floats (bf16, f16, f8) are multiplied and summed in
f32 and rounded once to the result type; integers accumulate exactly (int64, which wraps
modulo 2**64 like any two's-complement accumulator) and wrap into the result type, so
s8 x s8 -> s32 is exact; f32 uses f32 BLAS and f64 uses f64. The result type (XLA's
preferred element type) decides the rounding; ``operand_precision`` is ignored.

Complex dots follow the StableHLO reference interpreter instead of BLAS: each product is
``(ar*br - ai*bi) + (ar*bi + ai*br)i`` rounded in the element type (no FMA), and the
products are summed one after another in contraction order. Its goldens are defined that
way, and where a real part cancels (a real matrix converted to complex times a complex
one) BLAS's fused multiply-adds land tens of ULP away. Computing in c128 and rounding once
is no closer: it lands on the exact value, which the goldens are not. That order costs
numpy ~50x BLAS, so it is used up to ``IN_ORDER_MAX_TERMS`` products per dot (every
conformance case, and small dots like XLA:CPU's naive loop emitter) and larger complex dots
go to BLAS; the interpreter and the CPU backend share these functions, so they agree at
every size.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..errors import EvaluationError
from ..ir import Instruction
from ..ops import rule
from .core import EvalContext
from .numerics import wrap_int


def accumulation_dtype(result: dt.DType, *operands: np.ndarray) -> np.dtype:
    """The numpy dtype to multiply and sum in for a dot/conv producing ``result``."""
    kinds = [dt.from_numpy(o.dtype) for o in operands] + [result]
    if any(k.is_complex for k in kinds):
        return np.dtype(np.complex128 if any(k.bits == 128 for k in kinds) else np.complex64)
    if any(k.is_float for k in kinds):
        return np.dtype(np.float64 if any(k.is_float and k.bits == 64 for k in kinds)
                        else np.float32)
    if result.kind == "uint" and all(k.kind in ("uint", "pred") for k in kinds[:-1]):
        return np.dtype(np.uint64)
    return np.dtype(np.int64)


def to_result(acc: np.ndarray, result: dt.DType) -> np.ndarray:
    """Round or wrap an accumulator array into the result element type."""
    if result.is_integer:
        return wrap_int(acc, result)
    if result.kind == "pred":
        return acc != 0
    if result.is_float and np.iscomplexobj(acc):
        acc = acc.real
    return np.asarray(acc).astype(result.np_dtype)


# ---------------------------------------------------------------------------------------
# dot
# ---------------------------------------------------------------------------------------
def _annex_g_products(a: np.ndarray, b: np.ndarray, c: np.ndarray,
                      d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a+bi)(c+di) as C99 Annex G's multiply (``__mulsc3``, what std::complex and so XLA's
    CPU dot use): the textbook parts, and where both are NaN although an operand is
    infinite, the infinity recovered (inf * the product of the operands' directions)."""
    x, y = a * c - b * d, a * d + b * c
    both_nan = np.isnan(x) & np.isnan(y)
    if not both_nan.any():
        return x, y

    def box(u, v):      # an infinite operand as its direction; NaNs of the other become 0
        inf = np.isinf(u) | np.isinf(v)
        return inf, (np.where(inf, np.copysign(np.isinf(u).astype(u.dtype), u), u),
                     np.where(inf, np.copysign(np.isinf(v).astype(v.dtype), v), v))

    def unnan(cond, u):
        return np.where(cond & np.isnan(u), np.copysign(np.zeros_like(u), u), u)

    z_inf, (a2, b2) = box(a, b)
    w_inf, (c2, d2) = box(c, d)
    c2, d2 = unnan(z_inf, c2), unnan(z_inf, d2)
    a2, b2 = unnan(w_inf, a2), unnan(w_inf, b2)
    overflow = ~z_inf & ~w_inf & (np.isinf(a * c) | np.isinf(b * d) | np.isinf(a * d)
                                  | np.isinf(b * c))
    a2, b2, c2, d2 = (unnan(overflow, u) for u in (a2, b2, c2, d2))
    recalc = both_nan & (z_inf | w_inf | overflow)
    x = np.where(recalc, np.inf * (a2 * c2 - b2 * d2), x)
    y = np.where(recalc, np.inf * (a2 * d2 + b2 * c2), y)
    return x, y


def _complex_matmul(L: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Complex batched matmul ``[b,m,k] @ [b,k,n]``: finite operands in the reference
    interpreter's order (``complex_matmul``). With an inf or NaN among the operands,
    each product is formed as XLA's CPU dot does (``_annex_g_products``) and the products
    summed: BLAS's complex GEMM combines the parts in another order and gives nan+nanj
    where XLA gives, e.g., inf+nanj. (Which sums are nan or +-inf does not depend on the
    summation order.)"""
    if np.isfinite(L).all() and np.isfinite(R).all():
        return complex_matmul(L, R)
    a, b = L[:, :, :, None], R[:, None, :, :]
    with np.errstate(invalid="ignore", over="ignore"):
        if L.shape[2] == 1:
            # XLA's simplifier makes a dot contracting one element a multiply: textbook
            # products, no recovery of infinities.
            ar, ai, br, bi = a.real, a.imag, b.real, b.imag
            re, im = ar * br - ai * bi, ar * bi + ai * br
        else:
            re, im = _annex_g_products(a.real, a.imag, b.real, b.imag)
        out = np.empty(L.shape[:-1] + R.shape[-1:], L.dtype)
        out.real, out.imag = re.sum(axis=2), im.sum(axis=2)
    return out


def dot_general(lhs: np.ndarray, rhs: np.ndarray, lb: Sequence[int], rb: Sequence[int],
                lc: Sequence[int], rc: Sequence[int], acc: np.dtype) -> np.ndarray:
    """XLA DotGeneral in ``acc``: result dims are batch, lhs free, rhs free."""
    lb, rb, lc, rc = list(lb), list(rb), list(lc), list(rc)
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise EvaluationError("dot: batch/contracting dimension lists differ in length")
    for a, b in zip(lb + lc, rb + rc):
        if lhs.shape[a] != rhs.shape[b]:
            raise EvaluationError(f"dot: lhs dim {a} (size {lhs.shape[a]}) does not match "
                                  f"rhs dim {b} (size {rhs.shape[b]})")
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
    bshape = [lhs.shape[d] for d in lb]
    m = int(np.prod([lhs.shape[d] for d in lf], dtype=np.int64))
    n = int(np.prod([rhs.shape[d] for d in rf], dtype=np.int64))
    k = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
    b = int(np.prod(bshape, dtype=np.int64))
    L = np.transpose(lhs, lb + lf + lc).astype(acc).reshape(b, m, k)
    R = np.transpose(rhs, rb + rc + rf).astype(acc).reshape(b, k, n)
    out = _complex_matmul(L, R) if np.iscomplexobj(L) else np.matmul(L, R)
    return out.reshape(bshape + [lhs.shape[d] for d in lf] + [rhs.shape[d] for d in rf])


# Elements of product terms materialised at once by matmul_in_order (bounds its memory).
_IN_ORDER_BLOCK = 1 << 21
# Complex dots with at most this many products (batch * m * k * n) are summed in order.
IN_ORDER_MAX_TERMS = 1 << 20
# From this many outputs on, matmul_in_order steps through k over all of them at once.
_IN_ORDER_STEP_MIN_OUTPUTS = 256


def complex_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched complex matmul: the reference order (``matmul_in_order``) for small ones,
    BLAS above ``IN_ORDER_MAX_TERMS`` products."""
    terms = a.size * b.shape[-1]
    return matmul_in_order(a, b) if terms <= IN_ORDER_MAX_TERMS else np.matmul(a, b)


def matmul_in_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched complex ``a @ b`` ([..., m, k] x [..., k, n]) as the reference interpreter
    computes it: every product rounded on its own (four real multiplies, a subtract and an
    add, each in the element type) and the k products added left to right.

    With many outputs, one step per k updates all of them in place; with few, a block of k
    is formed at once and summed in order with ``np.add.accumulate`` (a running sum, never
    pairwise) from the previous block's total, so Python's loop stays short either way."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if k == 0 or int(np.prod(batch + (m, n), dtype=np.int64)) == 0:
        return np.zeros(batch + (m, n), a.dtype)
    if m * n * int(np.prod(batch, dtype=np.int64)) >= _IN_ORDER_STEP_MIN_OUTPUTS:
        return _in_order_by_step(a, b, batch + (m, n))
    out = np.zeros(batch + (m, 1, n), a.dtype)
    step = max(1, _IN_ORDER_BLOCK // out.size)
    ar, ai = a.real[..., :, :, None], a.imag[..., :, :, None]      # [..., m, k, 1]
    br, bi = b.real[..., None, :, :], b.imag[..., None, :, :]      # [..., 1, k, n]
    for k0 in range(0, k, step):
        ks = slice(k0, k0 + step)
        # Two separate roundings before the subtraction/addition (no fused multiply-add).
        re = np.subtract(ar[..., ks, :] * br[..., ks, :], ai[..., ks, :] * bi[..., ks, :])
        im = np.add(ar[..., ks, :] * bi[..., ks, :], ai[..., ks, :] * br[..., ks, :])
        terms = np.concatenate([out, _complex(re, im)], axis=-2)
        out = np.add.accumulate(terms, axis=-2)[..., -1:, :]
    return out.reshape(batch + (m, n))


def _in_order_by_step(a: np.ndarray, b: np.ndarray, shape: tuple) -> np.ndarray:
    """``matmul_in_order`` as k in-place steps over all outputs (real arrays, no temps)."""
    real = a.real.dtype
    re, im = np.zeros(shape, real), np.zeros(shape, real)
    t1, t2 = np.empty(shape, real), np.empty(shape, real)
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    for p in range(a.shape[-1]):
        xr, xi = ar[..., :, p:p + 1], ai[..., :, p:p + 1]         # [..., m, 1]
        yr, yi = br[..., p:p + 1, :], bi[..., p:p + 1, :]         # [..., 1, n]
        np.multiply(xr, yr, out=t1)
        np.multiply(xi, yi, out=t2)
        np.subtract(t1, t2, out=t1)
        np.add(re, t1, out=re)
        np.multiply(xr, yi, out=t1)
        np.multiply(xi, yr, out=t2)
        np.add(t1, t2, out=t1)
        np.add(im, t1, out=im)
    return _complex(re, im)


def _complex(re: np.ndarray, im: np.ndarray) -> np.ndarray:
    """The complex array with these real and imaginary parts (exactly: no arithmetic)."""
    out = np.empty(re.shape, np.result_type(re.dtype, np.complex64))
    out.real, out.imag = re, im
    return out


@rule("evaluate", "dot")
def _dot(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    lhs, rhs = operands
    a = inst.attrs
    res = inst.shape.dtype
    acc = accumulation_dtype(res, lhs, rhs)
    out = dot_general(lhs, rhs, a.get("lhs_batch_dims", ()), a.get("rhs_batch_dims", ()),
                      a.get("lhs_contracting_dims", ()), a.get("rhs_contracting_dims", ()), acc)
    return to_result(out, res).reshape(inst.shape.dims)


@rule("evaluate", "ragged-dot")
def _ragged_dot(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    """Three modes (by where lhs_ragged_dims points): a non-contracting lhs dim (rhs has a
    group dim; rows of group g use rhs[g]), a contracting dim (one result per group) or a
    batch dim (groups of batch rows)."""
    lhs, rhs, sizes = operands
    a = inst.attrs
    lb, rb = list(a.get("lhs_batch_dims", ())), list(a.get("rhs_batch_dims", ()))
    lc, rc = list(a.get("lhs_contracting_dims", ())), list(a.get("rhs_contracting_dims", ()))
    ragged = list(a.get("lhs_ragged_dims", ()))
    rgroup = list(a.get("rhs_group_dims", ()))
    if len(ragged) != 1:
        raise EvaluationError("ragged-dot needs exactly one lhs_ragged_dims entry")
    rd = ragged[0]
    res = inst.shape.dtype
    acc = accumulation_dtype(res, lhs, rhs)
    g_count = sizes.shape[-1]
    if sizes.ndim != 1:
        raise EvaluationError("ragged-dot: only 1-D group_sizes are supported")
    bounds = np.concatenate([[0], np.cumsum(sizes.astype(np.int64))])

    def group_mask(g: int, dim: int, arr: np.ndarray) -> np.ndarray:
        idx = np.arange(arr.shape[dim])
        m = (idx >= bounds[g]) & (idx < bounds[g + 1])
        shape = [1] * arr.ndim
        shape[dim] = -1
        return np.where(m.reshape(shape), arr, np.zeros((), arr.dtype))

    if rd in lc:                            # ragged contraction: [g] + normal dot result
        outs = []
        rci = rc[lc.index(rd)]
        for g in range(g_count):
            outs.append(dot_general(group_mask(g, rd, lhs), group_mask(g, rci, rhs),
                                    lb, rb, lc, rc, acc))
        out = np.stack(outs, axis=len(lb))
        return to_result(out, res).reshape(inst.shape.dims)
    if rd in lb:                            # ragged batch: plain dot, groups only label rows
        out = dot_general(lhs, rhs, lb, rb, lc, rc, acc)
        return to_result(out, res).reshape(inst.shape.dims)
    if len(rgroup) != 1:
        raise EvaluationError("ragged-dot with a non-contracting ragged dim needs one "
                              "rhs_group_dims entry")
    gd = rgroup[0]
    out = None
    for g in range(g_count):
        r = np.take(rhs, g, axis=gd)
        rb_g = [d - (d > gd) for d in rb]
        rc_g = [d - (d > gd) for d in rc]
        part = dot_general(group_mask(g, rd, lhs), r, lb, rb_g, lc, rc_g, acc)
        out = part if out is None else out + part
    return to_result(out, res).reshape(inst.shape.dims)


# ---------------------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------------------
def _dilate_pad(x: np.ndarray, spatial_from: int, dims) -> np.ndarray:
    """Base-dilate and pad (negative pads crop) the trailing spatial dims with zeros."""
    for i, d in enumerate(dims):
        ax = spatial_from + i
        s = x.shape[ax]
        if d.base_dilation > 1 and s > 1:
            shape = list(x.shape)
            shape[ax] = (s - 1) * d.base_dilation + 1
            y = np.zeros(shape, x.dtype)
            sl = [slice(None)] * x.ndim
            sl[ax] = slice(None, None, d.base_dilation)
            y[tuple(sl)] = x
            x = y
        lo, hi = d.padding_low, d.padding_high
        if lo > 0 or hi > 0:
            pw = [(0, 0)] * x.ndim
            pw[ax] = (max(lo, 0), max(hi, 0))
            x = np.pad(x, pw)
        if lo < 0 or hi < 0:
            sl = [slice(None)] * x.ndim
            sl[ax] = slice(-min(lo, 0), x.shape[ax] + min(hi, 0))
            x = x[tuple(sl)]
    return x


def conv_general(lhs: np.ndarray, rhs: np.ndarray, labels, dims, fgc: int, bgc: int,
                 acc: np.dtype) -> np.ndarray:
    """Convolution in ``acc`` returning [N, O, spatial...] (then permuted by the caller).

    One batched matmul per kernel spatial position: for window offset w the input slice
    x[:, :, o*stride + w*rhs_dilation] is contracted with kernel[..., w] over the input
    features of each group.
    """
    x = np.transpose(lhs, [labels.input_batch, labels.input_feature, *labels.input_spatial])
    k = np.transpose(rhs, [labels.kernel_output_feature, labels.kernel_input_feature,
                           *labels.kernel_spatial])
    x = x.astype(acc)
    k = k.astype(acc)
    for i, d in enumerate(dims):
        if d.window_reversal:
            k = np.flip(k, axis=2 + i)
    x = _dilate_pad(x, 2, dims)
    N, C = x.shape[:2]
    O, I = k.shape[:2]
    if C != I * fgc:
        raise EvaluationError(f"convolution: input features {C} != kernel input features "
                              f"{I} x feature_group_count {fgc}")
    if O % (fgc * bgc) or N % bgc:
        raise EvaluationError("convolution: output features / batch not divisible by the "
                              "group counts")
    out_sp = []
    for i, d in enumerate(dims):
        span = (d.size - 1) * d.window_dilation + 1
        s = x.shape[2 + i]
        out_sp.append(0 if s < span else (s - span) // d.stride + 1)
    Nb = N // bgc
    G = fgc * bgc
    Og = O // G
    # x -> [bgc, Nb, fgc, I, spatial...]; kernel -> [bgc*fgc groups, Og, I, kspatial]
    xg = x.reshape((bgc, Nb, fgc, I) + x.shape[2:])
    kg = k.reshape((bgc, fgc, Og, I) + k.shape[2:])
    out = np.zeros((bgc, fgc, Nb, int(np.prod(out_sp, dtype=np.int64)), Og), acc)
    for offs in itertools.product(*[range(d.size) for d in dims]):
        sl = [slice(None)] * 4
        for o, d, n in zip(offs, dims, out_sp):
            start = o * d.window_dilation
            sl.append(slice(start, start + (n - 1) * d.stride + 1 if n else start, d.stride))
        patch = xg[tuple(sl)]                                  # [bgc, Nb, fgc, I, out...]
        patch = np.moveaxis(patch, 2, 0)                       # [fgc, bgc, Nb, I, out...]
        patch = patch.reshape(fgc, bgc, Nb, I, -1)
        patch = np.swapaxes(patch, 3, 4).reshape(fgc, bgc, Nb * patch.shape[4], I)
        kern = kg[(slice(None),) * 4 + offs]                   # [bgc, fgc, Og, I]
        kern = np.swapaxes(np.moveaxis(kern, 1, 0), 2, 3)      # [fgc, bgc, I, Og]
        res = (complex_matmul(patch, kern) if acc.kind == "c"
               else np.matmul(patch, kern))                # [fgc, bgc, Nb*P, Og]
        out += np.swapaxes(res, 0, 1).reshape(out.shape)
    # Output feature index = (bgc group, fgc group, Og) flattened in that order.
    out = out.reshape(bgc, fgc, Nb, *out_sp, Og)
    out = np.moveaxis(out, 2, 0)                                # [Nb, bgc, fgc, sp..., Og]
    out = np.moveaxis(out, -1, 3)                               # [Nb, bgc, fgc, Og, sp...]
    return out.reshape((Nb, O) + tuple(out_sp))


@rule("evaluate", "convolution")
def _convolution(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    lhs, rhs = operands
    labels = inst.attrs.get("dim_labels")
    if labels is None:
        raise EvaluationError("convolution needs dim_labels")
    window = inst.attrs.get("window")
    dims = window.dims if window is not None else ()
    if len(dims) != len(labels.input_spatial):
        raise EvaluationError(f"convolution: window has {len(dims)} dims, dim_labels "
                              f"{len(labels.input_spatial)} spatial dims")
    res = inst.shape.dtype
    acc = accumulation_dtype(res, lhs, rhs)
    out = conv_general(lhs, rhs, labels, dims, int(inst.attrs.get("feature_group_count", 1)),
                       int(inst.attrs.get("batch_group_count", 1)), acc)
    # [N, O, spatial...] -> the output layout named by dim_labels.
    order = [labels.output_batch, labels.output_feature, *labels.output_spatial]
    result = np.empty(inst.shape.dims, res.np_dtype)
    perm = np.argsort(order)
    result[...] = to_result(np.transpose(out, perm), res)
    return result


# ---------------------------------------------------------------------------------------
# fft
# ---------------------------------------------------------------------------------------
@rule("evaluate", "fft")
def _fft(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    x = operands[0]
    kind = inst.attrs.get("fft_type", "FFT")
    lengths = [int(n) for n in inst.attrs.get("fft_length", ())]
    axes = list(range(x.ndim - len(lengths), x.ndim))
    out_dt = inst.shape.dtype.np_dtype
    if kind == "FFT":
        r = np.fft.fftn(x, s=lengths, axes=axes)
    elif kind == "IFFT":
        r = np.fft.ifftn(x, s=lengths, axes=axes)
    elif kind == "RFFT":
        r = np.fft.rfftn(x, s=lengths, axes=axes)
    elif kind == "IRFFT":
        r = np.fft.irfftn(x, s=lengths, axes=axes)
    else:
        raise EvaluationError(f"unknown fft_type {kind!r}")
    return np.asarray(r).astype(out_dt)


# ---------------------------------------------------------------------------------------
# cholesky, triangular-solve
# ---------------------------------------------------------------------------------------
def _compute_float(x: np.ndarray) -> np.dtype:
    if np.iscomplexobj(x):
        return np.dtype(np.complex128)
    return np.dtype(np.float64)


@rule("evaluate", "cholesky")
def _cholesky(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    """Factor of the (lower or upper) triangle; the other triangle is zero, as jax returns.
    A matrix that is not positive definite gives NaNs (XLA's expander does)."""
    a = operands[0]
    lower = inst.attrs.get("lower", False)
    cdt = _compute_float(a)
    out = np.zeros(a.shape, cdt)
    for idx in np.ndindex(*a.shape[:-2]):
        m = a[idx].astype(cdt)
        # Only the named triangle is read: mirror it to get the Hermitian matrix.
        tri = np.tril(m) if lower else np.triu(m)
        herm = tri + np.conj(tri.swapaxes(-1, -2)) - np.diag(np.diag(tri).real)
        try:
            low = np.linalg.cholesky(herm)
        except np.linalg.LinAlgError:
            out[idx] = np.nan
            continue
        out[idx] = low if lower else np.conj(low.T)
    return out.astype(a.dtype)


def triangular_solve(a: np.ndarray, b: np.ndarray, left_side: bool, lower: bool,
                     unit_diagonal: bool, transpose_a: str) -> np.ndarray:
    """Solve op(a) x = b (left_side) or x op(a) = b for x, a's other triangle ignored."""
    # Complex if either side is: casting a complex matrix to f64 would drop its imaginary part.
    cdt = np.dtype(np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(b) else np.float64)
    transpose_a = str(transpose_a) if transpose_a is not None else None
    t = np.tril(a.astype(cdt)) if lower else np.triu(a.astype(cdt))
    if unit_diagonal:
        n = t.shape[-1]
        t[..., np.arange(n), np.arange(n)] = 1
    if transpose_a == "TRANSPOSE":
        t = np.swapaxes(t, -1, -2)
    elif transpose_a == "ADJOINT":
        t = np.conj(np.swapaxes(t, -1, -2))
    elif transpose_a not in ("NO_TRANSPOSE", None):
        raise EvaluationError(f"unknown transpose_a {transpose_a!r}")
    bc = b.astype(cdt)
    if left_side:
        x = np.linalg.solve(t, bc)
    else:   # x t = b  <=>  t^T x^T = b^T
        x = np.swapaxes(np.linalg.solve(np.swapaxes(t, -1, -2), np.swapaxes(bc, -1, -2)),
                        -1, -2)
    return x


@rule("evaluate", "triangular-solve")
def _triangular_solve(inst: Instruction, operands: list, ctx: EvalContext) -> np.ndarray:
    a, b = operands
    at = inst.attrs
    with np.errstate(all="ignore"):
        try:
            x = triangular_solve(a, b, bool(at.get("left_side", False)),
                                 bool(at.get("lower", False)),
                                 bool(at.get("unit_diagonal", False)),
                                 at.get("transpose_a", "NO_TRANSPOSE"))
        except np.linalg.LinAlgError:
            # A zero on the diagonal: back-substitution divides by zero -> inf/nan.
            x = np.full(b.shape, np.nan)
    return np.asarray(x).astype(inst.shape.dtype.np_dtype)


__all__: list[Any] = ["dot_general", "conv_general", "triangular_solve",
                      "accumulation_dtype", "to_result"]
