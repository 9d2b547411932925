"""Elementwise ops with XLA's exact semantics.

Integers wrap (two's complement) at every width, division by zero and INT_MIN / -1 give
XLA's fixed answers, shifts saturate, narrow floats are computed in f32 and rounded back
after every op (XLA:CPU), maximum/minimum propagate NaN and order -0 below +0.
"""
from __future__ import annotations

from typing import Callable

import functools

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import EvaluationError, UnimplementedError
from ..ir import Instruction
from ..ops import rule
from .complex_math import complex_exp, complex_log1p
from .reductions import apply_elementwise
from .numerics import (compute_dtype, float_op, flush_denormals, from_bits, hlo_dtype, int_range,
                       make_complex, reduce_precision, round_half_away, to_bits, widen, wrap_int)


def _out_dtype(inst: Instruction) -> DType:
    return inst.shape.dtype


def _int_op(fn: Callable[..., np.ndarray], dtype: DType, *args: np.ndarray) -> np.ndarray:
    """Integer op computed wide, then wrapped into ``dtype``."""
    with np.errstate(all="ignore"):
        return wrap_int(fn(*[widen(np.asarray(a)) for a in args]), dtype)


def _arith(inst: Instruction, ops: list, ctx, float_fn, int_fn=None, complex_fn=None,
           pred_fn=None) -> np.ndarray:
    """Dispatch an arithmetic op on the operands' element type."""
    dtype = hlo_dtype(np.asarray(ops[0]))
    flush = ctx.flush_denormals
    if dtype.is_float:
        return float_op(float_fn, dtype, *ops, flush=flush)
    if dtype.is_complex:
        with np.errstate(all="ignore"):
            out = (complex_fn or float_fn)(*[flush_denormals(o, flush) for o in ops])
            return flush_denormals(np.asarray(out), flush).astype(dtype.np_dtype)
    if dtype.is_integer and int_fn is not None:
        return _int_op(int_fn, dtype, *ops)
    if dtype.is_pred and pred_fn is not None:
        return np.asarray(pred_fn(*ops)).astype(np.bool_)
    raise EvaluationError(f"{inst.opcode} is not defined for element type {dtype}")


# --- simple binary arithmetic -------------------------------------------------------------
@rule("evaluate", "add")
def _add(inst, ops, ctx):
    return _arith(inst, ops, ctx, np.add, np.add, pred_fn=np.logical_or)


@rule("evaluate", "subtract")
def _subtract(inst, ops, ctx):
    return _arith(inst, ops, ctx, np.subtract, np.subtract)


@rule("evaluate", "multiply")
def _multiply(inst, ops, ctx):
    return _arith(inst, ops, ctx, np.multiply, np.multiply, pred_fn=np.logical_and)


def _int_divide(a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    """XLA: x / 0 = -1 (all ones), INT_MIN / -1 = INT_MIN, truncation toward zero."""
    a, b = np.broadcast_arrays(widen(a), widen(b))
    zero = b == 0
    lo, _ = int_range(dtype)
    overflow = (a == lo) & (b == -1) if dtype.kind == "sint" else np.zeros_like(zero)
    safe_b = np.where(zero | overflow, 1, b).astype(b.dtype)
    with np.errstate(all="ignore"):
        q = a // safe_b
        if dtype.kind == "sint":
            # numpy floors; XLA truncates toward zero.
            q = np.where((np.fmod(a, safe_b) != 0) & ((a < 0) != (safe_b < 0)), q + 1, q)
    q = np.where(zero, -1 if dtype.kind == "sint" else np.uint64(2**64 - 1) if a.dtype == np.uint64
                 else (1 << dtype.bits) - 1, q)
    q = np.where(overflow, lo, q)
    return wrap_int(q, dtype)


def _int_remainder(a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    """XLA: x % 0 = x, INT_MIN % -1 = 0, the result has the dividend's sign."""
    a, b = np.broadcast_arrays(widen(a), widen(b))
    zero = b == 0
    safe_b = np.where(zero | ((b == -1) if dtype.kind == "sint" else zero), 1, b).astype(b.dtype)
    with np.errstate(all="ignore"):
        r = np.fmod(a, safe_b)
    return wrap_int(np.where(zero, a, r), dtype)


def _int_power(base: np.ndarray, exponent: np.ndarray, dtype: DType) -> np.ndarray:
    """XLA's integer pow: square-and-multiply over the exponent's low 6 bits only (so
    2**65 == 2 in XLA, checked on XLA:CPU); a negative exponent gives 0 unless |base| == 1."""
    b, e = np.broadcast_arrays(widen(base), widen(exponent))
    acc = np.ones_like(b)
    cur = b.copy()
    bits = to_bits(wrap_int(e, dtype)).astype(np.uint64)
    with np.errstate(all="ignore"):
        for _ in range(6):
            acc = np.where((bits & np.uint64(1)) == 1, wrap_int(acc * cur, dtype).astype(acc.dtype),
                           acc)
            cur = wrap_int(cur * cur, dtype).astype(cur.dtype)
            bits = bits >> np.uint64(1)
    negative = (e < 0) if dtype.kind == "sint" else np.zeros(e.shape, bool)
    # 1/b**|e| truncates to 0 except for |b| == 1: 1 stays 1, -1 alternates with e's parity.
    odd = (e % 2) != 0
    inverse = np.where(b == 1, 1, np.where(b == -1, np.where(odd, -1, 1), 0))
    return wrap_int(np.where(negative, inverse, acc), dtype)


def _complex_divide(x: np.ndarray, y: np.ndarray, flush: bool = True) -> np.ndarray:
    """Complex division as XLA:CPU does it: Smith's scaling by the larger part of the
    divisor, and where that gives (nan, nan), the C99 corner cases -- zero divisor (inf
    with the divisor's real sign), infinite dividend over a finite divisor (inf times the
    dividend's direction), finite dividend over an infinite divisor (signed zeros). numpy
    stops at Smith's step: (inf+nanj)/(1+0j) is nan+nanj there, inf+nanj in XLA. Like
    XLA:CPU, the multiply-adds are fused (one rounding) and subnormal intermediates are
    zero (``flush``)."""
    x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
    a, b, c, d = x.real, x.imag, y.real, y.imag
    part = a.dtype
    one, zero, inf = np.ones((), part), np.zeros((), part), np.array(np.inf, part)
    wide = np.float64 if part.itemsize < 8 else np.longdouble

    def ftz(u):
        return flush_denormals(u, flush)

    def fma(p, q, r):       # p*q + r rounded once
        return ftz((p.astype(wide) * q + r).astype(part))

    c_smaller = np.abs(c) < np.abs(d)
    r1, r2 = ftz(c / d), ftz(d / c)         # the divisor's smaller part over its larger
    den1, den2 = fma(c, r1, d), fma(d, r2, c)
    re = np.where(c_smaller, fma(r1, a, b) / den1, fma(r2, b, a) / den2)
    im = np.where(c_smaller, fma(r1, b, -a) / den1, fma(-r2, a, b) / den2)

    def direction(u, infinite):     # +-1 where infinite, a zero of u's sign elsewhere
        return np.copysign(np.where(infinite, one, zero), u)

    zero_div = (c == 0) & (d == 0) & ~(np.isnan(a) & np.isnan(b))
    inf_sign = np.copysign(inf, c)
    a_inf, b_inf, c_inf, d_inf = (np.isinf(u) for u in (a, b, c, d))
    inf_over_finite = (a_inf | b_inf) & np.isfinite(c) & np.isfinite(d)
    a1, b1 = direction(a, a_inf), direction(b, b_inf)
    finite_over_inf = (c_inf | d_inf) & np.isfinite(a) & np.isfinite(b)
    c1, d1 = direction(c, c_inf), direction(d, d_inf)
    fixes = [(zero_div, inf_sign * a, inf_sign * b),
             (inf_over_finite, inf * (a1 * c + b1 * d), inf * (b1 * c - a1 * d)),
             (finite_over_inf, zero * (a * c1 + b * d1), zero * (b * c1 - a * d1))]
    both_nan = np.isnan(re) & np.isnan(im)
    for case, fix_re, fix_im in reversed(fixes):     # the first matching case wins
        pick = both_nan & case
        re, im = np.where(pick, fix_re, re), np.where(pick, fix_im, im)
    out = np.empty(re.shape, x.dtype)
    out.real, out.imag = re, im
    return out


# Ops whose integer semantics (XLA's, see the helpers above) differ from numpy's, and the
# numpy function for their float case (and complex, unless _COMPLEX names another).
_INT_OR_FLOAT = {"divide": (_int_divide, np.divide), "remainder": (_int_remainder, np.fmod),
                 "power": (_int_power, np.power)}
_COMPLEX = {"divide": _complex_divide}


@rule("evaluate", *_INT_OR_FLOAT)
def _int_or_float(inst, ops, ctx):
    int_fn, float_fn = _INT_OR_FLOAT[inst.opcode]
    dtype = hlo_dtype(ops[0])
    if dtype.is_integer:
        return int_fn(ops[0], ops[1], dtype)
    complex_fn = _COMPLEX.get(inst.opcode)
    if complex_fn is not None:
        complex_fn = functools.partial(complex_fn, flush=ctx.flush_denormals)
    return _arith(inst, ops, ctx, float_fn, complex_fn=complex_fn)


@rule("evaluate", "atan2")
def _atan2(inst, ops, ctx):
    dtype = hlo_dtype(ops[0])
    if dtype.is_complex:
        # StableHLO: atan2 on complex is -i * log((x + i*y) / sqrt(x*x + y*y)).
        x, y = ops[1], ops[0]
        with np.errstate(all="ignore"):
            return (-1j * np.log((x + 1j * y) / np.sqrt(x * x + y * y))).astype(dtype.np_dtype)
    return _arith(inst, ops, ctx, np.arctan2)


def _float_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NaN-propagating maximum with -0 < +0 (what XLA:CPU returns)."""
    a, b = np.broadcast_arrays(a, b)
    pick_a = (a > b) | ((a == b) & ~np.signbit(a))
    out = np.where(pick_a, a, b)
    return np.where(np.isnan(a), a, np.where(np.isnan(b), b, out))


def _float_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    pick_a = (a < b) | ((a == b) & np.signbit(a))
    out = np.where(pick_a, a, b)
    return np.where(np.isnan(a), a, np.where(np.isnan(b), b, out))


def _complex_lex(fn_name: str):
    # XLA orders complex numbers lexicographically (real part, then imaginary) for max/min.
    def f(a, b):
        a, b = np.broadcast_arrays(a, b)
        a_first = (a.real > b.real) | ((a.real == b.real) & (a.imag >= b.imag))
        if fn_name == "min":
            a_first = (a.real < b.real) | ((a.real == b.real) & (a.imag <= b.imag))
        return np.where(a_first, a, b)
    return f


@rule("evaluate", "maximum")
def _maximum(inst, ops, ctx):
    return _arith(inst, ops, ctx, _float_max, np.maximum, _complex_lex("max"), np.logical_or)


@rule("evaluate", "minimum")
def _minimum(inst, ops, ctx):
    return _arith(inst, ops, ctx, _float_min, np.minimum, _complex_lex("min"), np.logical_and)


@rule("evaluate", "clamp")
def _clamp(inst, ops, ctx):
    lo, x, hi = ops
    dtype = hlo_dtype(x)
    if dtype.is_float:
        return float_op(lambda l, v, h: _float_min(h, _float_max(l, v)), dtype, lo, x, hi,
                        flush=ctx.flush_denormals)
    if dtype.is_integer:
        return np.minimum(hi, np.maximum(lo, x)).astype(dtype.np_dtype)
    if dtype.is_pred:
        return np.logical_and(hi, np.logical_or(lo, x))
    raise EvaluationError(f"clamp is not defined for {dtype}")


# --- logical / bitwise ---------------------------------------------------------------------
def _bitwise(inst, ops, np_fn, pred_fn):
    dtype = hlo_dtype(ops[0])
    if dtype.is_pred:
        return pred_fn(*ops)
    if dtype.is_integer:
        return _int_op(np_fn, dtype, *ops)
    raise EvaluationError(f"{inst.opcode} is not defined for element type {dtype}")


@rule("evaluate", "and")
def _and(inst, ops, ctx):
    return _bitwise(inst, ops, np.bitwise_and, np.logical_and)


@rule("evaluate", "or")
def _or(inst, ops, ctx):
    return _bitwise(inst, ops, np.bitwise_or, np.logical_or)


@rule("evaluate", "xor")
def _xor(inst, ops, ctx):
    return _bitwise(inst, ops, np.bitwise_xor, np.logical_xor)


@rule("evaluate", "not")
def _not(inst, ops, ctx):
    return _bitwise(inst, ops, np.invert, np.logical_not)


def _shift_amount(rhs: np.ndarray, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """(amount clamped to [0, 63], mask of amounts >= bit width); rhs read as unsigned."""
    u = to_bits(rhs).astype(np.uint64)
    too_big = u >= np.uint64(dtype.bits)
    return np.where(too_big, np.uint64(0), u), too_big


@rule("evaluate", "shift-left")
def _shl(inst, ops, ctx):
    lhs, rhs = np.broadcast_arrays(*ops)
    dtype = hlo_dtype(lhs)
    amount, too_big = _shift_amount(rhs, dtype)
    bits = to_bits(lhs).astype(np.uint64) << amount
    out = from_bits(bits & np.uint64((1 << dtype.bits) - 1), dtype)
    return np.where(too_big, np.zeros((), dtype.np_dtype), out).astype(dtype.np_dtype)


@rule("evaluate", "shift-right-logical")
def _shrl(inst, ops, ctx):
    lhs, rhs = np.broadcast_arrays(*ops)
    dtype = hlo_dtype(lhs)
    amount, too_big = _shift_amount(rhs, dtype)
    out = from_bits(to_bits(lhs).astype(np.uint64) >> amount, dtype)
    return np.where(too_big, np.zeros((), dtype.np_dtype), out).astype(dtype.np_dtype)


@rule("evaluate", "shift-right-arithmetic")
def _shra(inst, ops, ctx):
    lhs, rhs = np.broadcast_arrays(*ops)
    dtype = hlo_dtype(lhs)
    amount, too_big = _shift_amount(rhs, dtype)
    # Read the bits as a signed number of the same width, shift in int64 (sign-filling).
    bits = to_bits(lhs).astype(np.int64) if dtype.bits < 64 else to_bits(lhs).view(np.int64)
    if dtype.bits < 64:
        bits = np.where(bits >= (1 << (dtype.bits - 1)), bits - (1 << dtype.bits), bits)
    shifted = bits >> np.where(too_big, np.uint64(63), amount).astype(np.int64)
    return wrap_int(shifted, dtype)


@rule("evaluate", "popcnt")
def _popcnt(inst, ops, ctx):
    dtype = hlo_dtype(ops[0])
    counts = np.bitwise_count(to_bits(ops[0]))
    return wrap_int(counts.astype(np.int64), dtype)


@rule("evaluate", "count-leading-zeros")
def _clz(inst, ops, ctx):
    dtype = hlo_dtype(ops[0])
    u = to_bits(ops[0]).astype(np.uint64)
    length = np.zeros(u.shape, np.int64)   # bit length, by binary search
    for step in (32, 16, 8, 4, 2, 1):
        big = u >= (np.uint64(1) << np.uint64(step))
        u = np.where(big, u >> np.uint64(step), u)
        length += np.where(big, step, 0)
    length += (u > 0).astype(np.int64)
    return wrap_int(dtype.bits - length, dtype)


# --- unary ---------------------------------------------------------------------------------
@rule("evaluate", "abs")
def _abs(inst, ops, ctx):
    x = ops[0]
    dtype = hlo_dtype(x)
    if dtype.is_complex:
        with np.errstate(all="ignore"):
            flush = ctx.flush_denormals
            return flush_denormals(np.abs(flush_denormals(x, flush)), flush).astype(
                _out_dtype(inst).np_dtype)
    if dtype.is_unsigned:
        return x.copy()
    if dtype.is_float:   # a sign-bit operation: subnormals survive
        return float_op(np.abs, dtype, x, flush=False)
    return _arith(inst, ops, ctx, np.abs, np.abs)


@rule("evaluate", "negate")
def _negate(inst, ops, ctx):
    dtype = hlo_dtype(ops[0])
    if dtype.is_float:   # a sign-bit operation: subnormals survive
        return float_op(np.negative, dtype, ops[0], flush=False)
    return _arith(inst, ops, ctx, np.negative, np.negative)


@rule("evaluate", "sign")
def _sign(inst, ops, ctx):
    x = ops[0]
    dtype = hlo_dtype(x)
    if dtype.is_complex:
        with np.errstate(all="ignore"):
            mag = np.abs(x)
            out = np.where(mag == 0, 0, x / np.where(mag == 0, 1, mag))
        return np.where(np.isnan(x.real) | np.isnan(x.imag), complex(np.nan, np.nan),
                        out).astype(dtype.np_dtype)
    if dtype.is_float:
        # sign(+-0) = +-0, sign(NaN) = NaN: np.sign keeps NaN; fix up the zeros' signs.
        return float_op(lambda v: np.where(v == 0, v, np.sign(v)), dtype, x,
                        flush=ctx.flush_denormals)
    if dtype.is_integer:
        return _int_op(np.sign, dtype, x)
    raise EvaluationError(f"sign is not defined for {dtype}")


def _float_unary(np_fn: Callable, *, wide: bool = False, complex_fn: Callable | None = None):
    """Rule for a float/complex unary op. ``wide``: compute f32 in f64 and round once
    (correctly rounded, the reference for functions numpy approximates loosely);
    ``complex_fn``: the complex version where ``np_fn`` has none."""
    def evaluate(inst, ops, ctx):
        x = ops[0]
        dtype = hlo_dtype(x)
        flush = ctx.flush_denormals
        if dtype.is_float:
            if wide and dtype.bits <= 32:
                with np.errstate(all="ignore"):
                    x32 = flush_denormals(x.astype(np.float32), flush)
                    out = np.asarray(np_fn(x32.astype(np.float64))).astype(np.float32)
                    return flush_denormals(out, flush).astype(dtype.np_dtype)
            return float_op(np_fn, dtype, x, flush=flush)
        if dtype.is_complex:
            with np.errstate(all="ignore"):
                out = np.asarray((complex_fn or np_fn)(flush_denormals(x, flush)))
                return flush_denormals(out.astype(dtype.np_dtype), flush)
        raise EvaluationError(f"{inst.opcode} is not defined for element type {dtype}")
    return evaluate


@rule("evaluate", "logistic")
def _logistic(inst, ops, ctx):
    # XLA expands logistic(x) into 1 / (1 + exp(-x)) before codegen (LogisticExpander), so
    # for bf16/f16 each of the four steps rounds to the storage type.
    x = ops[0]
    dtype = hlo_dtype(x)
    if not (dtype.is_float or dtype.is_complex):
        raise EvaluationError(f"logistic is not defined for element type {dtype}")
    step = (lambda fn, *a: float_op(fn, dtype, *a, flush=ctx.flush_denormals)) if dtype.is_float else \
        (lambda fn, *a: np.asarray(fn(*a)).astype(dtype.np_dtype))
    one = np.ones((), dtype.np_dtype)
    with np.errstate(all="ignore"):
        e = step(np.exp, step(np.negative, x))
        return step(np.divide, one, step(np.add, e, one))


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; scipy's f64 erf rounded once to f32 is correctly rounded in practice.
    import scipy.special       # imported here: it costs ~0.7 s, erf is rare
    return scipy.special.erf(x.astype(np.float64))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return 1.0 / np.sqrt(x)


def _complex_cbrt(z: np.ndarray) -> np.ndarray:
    """The principal cube root: |z|**(1/3) at a third of z's argument (StableHLO's
    reference interpreter computes it this way, in f64)."""
    z = z.astype(np.complex128)
    theta = np.arctan2(z.imag, z.real) / 3.0
    mag = np.power(z.real * z.real + z.imag * z.imag, 1.0 / 6.0)
    return make_complex(mag * np.cos(theta), mag * np.sin(theta), np.complex128)


# numpy's complex exp/log1p are inaccurate or give other special values (complex_math.py).
_COMPLEX_FNS = {"exponential": complex_exp, "log-plus-one": complex_log1p}
rule("evaluate", "cbrt")(_float_unary(np.cbrt, wide=True, complex_fn=_complex_cbrt))
for _opcode, _fn, _wide in [
        ("cosine", np.cos, False), ("sine", np.sin, False), ("tan", np.tan, False),
        ("tanh", np.tanh, False), ("exponential", np.exp, False),
        ("exponential-minus-one", np.expm1, False), ("log", np.log, False),
        ("log-plus-one", np.log1p, False), ("sqrt", np.sqrt, False),
        ("rsqrt", _rsqrt, True), ("erf", _erf, True),
        ("ceil", np.ceil, False), ("floor", np.floor, False),
        ("round-nearest-even", np.rint, False), ("round-nearest-afz", round_half_away, False)]:
    rule("evaluate", _opcode)(_float_unary(_fn, wide=_wide,
                                           complex_fn=_COMPLEX_FNS.get(_opcode)))


@rule("evaluate", "is-finite")
def _is_finite(inst, ops, ctx):
    return np.isfinite(ops[0].astype(compute_dtype(hlo_dtype(ops[0]))))


@rule("evaluate", "real")
def _real(inst, ops, ctx):
    x = ops[0]
    return np.real(x).astype(_out_dtype(inst).np_dtype)


@rule("evaluate", "imag")
def _imag(inst, ops, ctx):
    x = ops[0]
    if not np.iscomplexobj(x):
        return np.zeros_like(x)
    return np.imag(x).astype(_out_dtype(inst).np_dtype)


@rule("evaluate", "complex")
def _complex(inst, ops, ctx):
    re, im = np.broadcast_arrays(*ops)
    out = np.empty(re.shape, _out_dtype(inst).np_dtype)
    out.real = re
    out.imag = im
    return out


@rule("evaluate", "copy")
def _copy(inst, ops, ctx):
    v = ops[0]
    return v.copy() if isinstance(v, np.ndarray) else v


@rule("evaluate", "reduce-precision")
def _reduce_precision(inst, ops, ctx):
    return reduce_precision(ops[0], int(inst.attrs["exponent_bits"]),
                            int(inst.attrs["mantissa_bits"]), nan_to_inf=ctx.numerics == "spec")


# --- select / compare --------------------------------------------------------------------
@rule("evaluate", "select")
def _select(inst, ops, ctx):
    pred, on_true, on_false = ops
    return np.where(np.asarray(pred, bool), on_true, on_false).astype(on_true.dtype)


def _total_order_key(x: np.ndarray) -> np.ndarray:
    """Signed integers ordered like XLA's total order: -NaN < -inf < .. < -0 < +0 < .. < NaN."""
    dtype = hlo_dtype(x)
    n = dtype.bits
    if n == 64:
        signed = to_bits(x).view(np.int64)
    else:
        bits = to_bits(x).astype(np.int64)
        signed = np.where(bits >= (1 << (n - 1)), bits - (1 << n), bits)
    # Negative floats: larger magnitude has larger bit pattern, so flip the magnitude bits.
    return np.where(signed < 0, signed ^ np.int64((1 << (n - 1)) - 1), signed)


_CMP = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
        "GT": np.greater, "GE": np.greater_equal}


@rule("evaluate", "compare")
def _compare(inst, ops, ctx):
    direction = str(inst.attrs.get("direction", ""))
    if direction not in _CMP:
        raise EvaluationError(f"compare: unknown direction {direction!r}")
    a, b = ops
    dtype = hlo_dtype(a)
    cmp_type = str(inst.attrs.get("type", "")) or None
    if dtype.is_complex and direction not in ("EQ", "NE"):
        raise EvaluationError(f"compare {direction} is not defined for {dtype}")
    if cmp_type == "TOTALORDER" and dtype.is_float:
        return _CMP[direction](_total_order_key(a), _total_order_key(b))
    if dtype.is_float or dtype.is_complex:
        # Compared in the compute type with subnormals read as zero (XLA:CPU's DAZ).
        a = flush_denormals(a.astype(compute_dtype(dtype)), ctx.flush_denormals)
        b = flush_denormals(b.astype(compute_dtype(dtype)), ctx.flush_denormals)
    elif dtype.is_integer:
        a, b = widen(a), widen(b)
        if cmp_type == "UNSIGNED" and dtype.kind == "sint":
            a, b = to_bits(ops[0]).astype(np.uint64), to_bits(ops[1]).astype(np.uint64)
        elif cmp_type == "SIGNED" and dtype.kind == "uint":
            signed = dt.by_name("s" + dtype.name[1:])
            a, b = widen(from_bits(to_bits(ops[0]), signed)), widen(from_bits(to_bits(ops[1]), signed))
    with np.errstate(all="ignore"):
        return np.asarray(_CMP[direction](a, b), dtype=bool)


# --- conversions ---------------------------------------------------------------------------
def convert_array(x: np.ndarray, to: DType, flush: bool = True) -> np.ndarray:
    """XLA's convert: wrap int->int, saturate float->int (NaN -> 0), RNE to floats,
    x != 0 to pred, real part of complex. ``flush``: XLA:CPU's DAZ/FTZ on f32/f64."""
    src = hlo_dtype(x)
    if src == to:
        return x.copy()
    if src.is_complex and to.is_complex:     # c64 <-> c128: each part on its own
        part = to.component
        return make_complex(convert_array(np.real(x), part, flush),
                            convert_array(np.imag(x), part, flush), to.np_dtype)
    if src.is_complex and not to.is_complex:
        x = np.real(x)
        src = src.component
    if src.is_float and src.bits >= 32 and (to.is_pred or to.bits >= 32):
        # DAZ: a subnormal f32/f64 operand reads as zero in the FP unit (f32->f64 widening,
        # f64->f32, != 0). Narrowing to bf16 is done with integer ops and keeps it.
        x = flush_denormals(x, flush)
    if to.is_pred:
        return np.asarray(x != 0, dtype=bool)
    if to.is_complex:
        return x.astype(np.float64 if src.bits > 32 else np.float32).astype(to.np_dtype) \
            if not (src.is_integer or src.is_pred) else x.astype(np.float64).astype(to.np_dtype)
    if to.is_integer:
        if src.is_float:
            lo, hi = int_range(to)
            f = x.astype(np.float64)
            with np.errstate(all="ignore"):
                t = np.trunc(np.where(np.isnan(f), 0.0, f))
                inside = (t >= float(lo)) & (t < float(hi) + 1.0)
                v = np.where(inside, t, 0.0)
                wide_t = np.uint64 if to.name == "u64" else np.int64
                out = v.astype(wide_t)
            out = np.where(t < float(lo), lo, out)
            out = np.where(t >= float(hi) + 1.0, np.asarray(hi, dtype=wide_t), out)
            return wrap_int(out.astype(wide_t), to)
        return wrap_int(widen(x) if not src.is_pred else x.astype(np.int64), to)
    # to float
    if src.is_integer and to.bits < 32 and src.bits > 16:
        # One rounding straight to the narrow type: go through f64 (exact for <= 2**53).
        return x.astype(np.float64).astype(to.np_dtype)
    if src.bits < 8 and src.is_integer:
        return x.astype(np.int64).astype(to.np_dtype)
    if src.is_pred:
        return x.astype(np.float32).astype(to.np_dtype)
    with np.errstate(all="ignore"):
        out = x.astype(to.np_dtype)
    # FTZ applies to results in f32/f64 (f64 -> f32); narrow results keep their subnormals.
    return flush_denormals(out, flush) if src.is_float and to.bits >= 32 else out


@rule("evaluate", "convert")
def _convert(inst, ops, ctx):
    return convert_array(ops[0], _out_dtype(inst), ctx.flush_denormals)


def _bitcast_widths(operand_dims: tuple, result_dims: tuple, src: DType, to: DType,
                    ) -> tuple[int, int]:
    """The element widths in bits a bitcast-convert joins or splits, read off the shapes.

    pred is 1 bit in StableHLO (64 x i1 <-> i64) and a byte in XLA (8 x pred <-> s64);
    which one is meant follows from the size of the minor dimension that is added or
    removed, so both spellings work.
    """
    sb, tb = src.bits, to.bits
    if len(result_dims) == len(operand_dims) + 1 and result_dims[:-1] == operand_dims:
        k = result_dims[-1]                     # the operand is split into k elements
        if to.is_pred and not src.is_pred:
            tb = sb // k if k and sb % k == 0 else tb
    elif len(operand_dims) == len(result_dims) + 1 and operand_dims[:-1] == result_dims:
        k = operand_dims[-1]                    # k operand elements are joined into one
        if src.is_pred and not to.is_pred:
            sb = tb // k if k and tb % k == 0 else sb
    elif operand_dims == result_dims:
        k = 1
        if src.is_pred != to.is_pred:           # pred <-> 8-bit (XLA) or 1-bit types
            sb = tb = to.bits if src.is_pred else src.bits
    else:
        raise EvaluationError(f"bitcast-convert from {src}{list(operand_dims)} to "
                              f"{to}{list(result_dims)}: dimensions do not match")
    wide, narrow = max(sb, tb), min(sb, tb)
    if wide != narrow * k:
        raise EvaluationError(f"bitcast-convert from {src}{list(operand_dims)} ({sb}-bit) to "
                              f"{to}{list(result_dims)} ({tb}-bit): the minor dimension "
                              f"should be {wide // narrow}")
    return sb, tb


@rule("evaluate", "bitcast-convert")
def _bitcast_convert(inst, ops, ctx):
    x = ops[0]
    src, to = hlo_dtype(x), _out_dtype(inst)
    dims = tuple(inst.shape.dims)
    if src.is_complex or to.is_complex:
        # Complex values have no single bit pattern: reinterpret the bytes (little-endian
        # within each element, numpy's view on x86), real part first.
        raw = np.ascontiguousarray(x)
        if src.bits > to.bits:
            raw = raw.reshape(x.shape + (1,))
        return raw.view(np.uint8).view(to.np_dtype).reshape(dims)
    sb, tb = _bitcast_widths(tuple(x.shape), dims, src, to)
    bits = to_bits(x).astype(np.uint64)
    if sb == tb:
        return from_bits(bits, to).reshape(dims)
    if sb < tb:
        # Join: element i of the minor dimension supplies bits [i*sb, (i+1)*sb).
        out = np.zeros(dims, np.uint64)
        for i in range(tb // sb):
            out |= bits[..., i] << np.uint64(i * sb)
        return from_bits(out, to)
    mask = np.uint64((1 << tb) - 1)
    parts = [(bits >> np.uint64(i * tb)) & mask for i in range(sb // tb)]
    return from_bits(np.stack(parts, axis=-1), to).reshape(dims)


@rule("evaluate", "stochastic-convert")
def _stochastic_convert(inst, ops, ctx):
    """XLA's decomposition: |x| rounds up when the unsigned random bits (same width as x)
    are below frac(|x|) * 2**bits; the sign is put back, values beyond the range saturate,
    NaN gives 0. XLA supports signed integer results only."""
    x, random = ops
    src, to = hlo_dtype(x), _out_dtype(inst)
    if to.kind != "sint":
        raise UnimplementedError(f"stochastic-convert from {src} to {to}: XLA supports only "
                                 "signed integer results")
    f = x.astype(np.float64)
    a = np.abs(f)
    trunc = np.floor(a)
    frac_fixed = np.floor((a - trunc) * float(1 << src.bits))
    r = to_bits(random).astype(np.float64)
    rounded = trunc + (r < frac_fixed)
    signed = np.where(f < 0, -rounded, rounded)
    return convert_array(np.where(np.isnan(f), 0.0, signed), to, ctx.flush_denormals)


# --- map ------------------------------------------------------------------------------------
@rule("evaluate", "map")
def _map(inst, ops, ctx):
    # One vectorized call of the scalar computation when its ops allow it, else one call
    # per element (apply_elementwise decides).
    comp = inst.attrs["to_apply"]
    return apply_elementwise(comp, list(ops), ctx, [_out_dtype(inst).np_dtype])[0]
