"""Numeric helpers shared by the interpreter's rules: XLA's rounding, wrapping and bit views.

XLA's semantics that numpy does not give for free, in one place:
- integers of every width (s2/s4/u2/u4 included) wrap modulo 2**bits: compute in a wide
  type (``widen``) and narrow with ``wrap_int``;
- bf16, f16 and the f8 types are computed in f32 and rounded back to the storage type after
  every op, as XLA:CPU does (``compute_dtype`` / ``float_op``);
- bit-level views (``to_bits`` / ``from_bits``) for popcnt, clz, shifts, bitcast-convert,
  total-order comparison and reduce-precision.
"""
from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np

from .. import dtypes as dt
from ..dtypes import DType


def hlo_dtype(x: np.ndarray) -> DType:
    """The HLO element type of an interpreter value."""
    return dt.from_numpy(x.dtype)


def is_subbyte_int(dtype: DType) -> bool:
    return dtype.is_integer and dtype.bits < 8


def int_range(dtype: DType) -> tuple[int, int]:
    """(min, max) of an integer type, sub-byte ones included."""
    if dtype.kind == "sint":
        return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1
    if dtype.kind == "uint":
        return 0, (1 << dtype.bits) - 1
    if dtype.kind == "pred":
        return 0, 1
    raise TypeError(f"{dtype} is not an integer type")


def widen(x: np.ndarray) -> np.ndarray:
    """An integer array as int64 (uint64 stays uint64) so arithmetic can wrap afterwards.

    64-bit numpy arithmetic already wraps modulo 2**64, which is exactly two's complement.
    """
    if x.dtype == np.uint64:
        return x
    return x.astype(np.int64)


def wrap_int(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Reduce wide integers modulo 2**bits into ``dtype`` (two's complement wrap)."""
    bits = dtype.bits
    if bits >= 64:
        # 64-bit numpy arithmetic has already wrapped; casting int64<->uint64 keeps the bits.
        return np.asarray(values).astype(dtype.np_dtype)
    v = np.asarray(values).astype(np.int64) & ((1 << bits) - 1)
    if dtype.kind == "sint":
        v = np.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v.astype(dtype.np_dtype)


# XLA:CPU runs float arithmetic with the x86 MXCSR bits DAZ and FTZ set: subnormal f32/f64
# inputs read as (signed) zero and subnormal results become (signed) zero. Moves, negate,
# abs and exact widenings (f16/bf16 -> f32) are bit operations and keep subnormals. The
# StableHLO spec has IEEE gradual underflow instead; rules pass ``ctx.flush_denormals``
# (EvalContext.numerics picks the mode) as ``enabled``.
def flush_denormals(x: np.ndarray, enabled: bool = True) -> np.ndarray:
    """Subnormal f32/f64 (or complex parts) to zero of the same sign, when ``enabled``."""
    if not enabled:
        return x
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return make_complex(flush_denormals(x.real), flush_denormals(x.imag), x.dtype)
    if x.dtype not in (np.float32, np.float64):
        return x
    tiny = np.finfo(x.dtype).tiny
    with np.errstate(invalid="ignore"):
        sub = np.abs(x) < tiny
    if not sub.any():
        return x
    return np.where(sub, np.copysign(np.zeros((), x.dtype), x), x)


def make_complex(re: np.ndarray, im: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A complex array from its parts. (``re + 1j * im`` is wrong for infinite parts:
    1j * inf is nan + inf*j.)"""
    re, im = np.broadcast_arrays(re, im)
    out = np.empty(re.shape, dtype)
    out.real = re
    out.imag = im
    return out


def compute_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype XLA:CPU computes a float op in: f32 for narrow floats."""
    if dtype.is_float and dtype.bits < 32:
        return np.dtype(np.float32)
    return dtype.np_dtype


# numpy's f32 transcendental loops (SIMD) are a few ULP off; the same functions in f64,
# rounded once to f32, are correctly rounded in practice, which is how StableHLO's reference
# interpreter computes them. (+ - * / sqrt are already correctly rounded in f32.)
_WIDE_IN_F64 = frozenset([np.exp, np.expm1, np.log, np.log1p, np.sin, np.cos, np.tan,
                          np.tanh, np.arctan2, np.power, np.cbrt])


def float_op(fn: Callable[..., np.ndarray], dtype: DType, *args: np.ndarray,
             flush: bool = True) -> np.ndarray:
    """Apply ``fn`` in the compute type of ``dtype`` and round the result back (RNE).

    ``flush``: treat subnormal inputs and results as zero, as XLA:CPU's arithmetic does.
    Transcendental functions (``_WIDE_IN_F64``) on f32 and narrower run in f64.
    """
    cd = compute_dtype(dtype)
    with np.errstate(all="ignore"):
        wide = [flush_denormals(np.asarray(a).astype(cd), flush) for a in args]
        if fn in _WIDE_IN_F64 and cd == np.float32:
            out = np.asarray(fn(*[w.astype(np.float64) for w in wide])).astype(cd)
        else:
            out = np.asarray(fn(*wide)).astype(cd)
        return flush_denormals(out, flush).astype(dtype.np_dtype)


# --- bit views --------------------------------------------------------------------------
_UINT_OF_BYTES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def to_bits(x: np.ndarray) -> np.ndarray:
    """The raw bit pattern of each element as an unsigned int (uint8..uint64).

    Sub-byte values (int2/int4/uint2/uint4, f4/f6) occupy the low bits of a byte.
    """
    dtype = hlo_dtype(x)
    if dtype.kind == "complex":
        raise TypeError("complex values have no single bit pattern")
    if is_subbyte_int(dtype):
        return (x.astype(np.int64) & ((1 << dtype.bits) - 1)).astype(np.uint8)
    if dtype.bits < 8 and dtype.is_float:
        # ml_dtypes stores sub-byte floats one per byte, value in the low bits.
        return x.view(np.uint8) & np.uint8((1 << dtype.bits) - 1)
    if dtype.kind == "pred":
        return x.astype(np.uint8)
    return x.view(_UINT_OF_BYTES[x.dtype.itemsize])


def from_bits(bits: np.ndarray, dtype: DType) -> np.ndarray:
    """Inverse of ``to_bits``: unsigned bit patterns reinterpreted as ``dtype``."""
    if dtype.kind == "pred":
        return bits != 0
    if is_subbyte_int(dtype):
        return wrap_int(bits.astype(np.int64), dtype)
    if dtype.bits < 8 and dtype.is_float:
        return (bits.astype(np.uint8) & np.uint8((1 << dtype.bits) - 1)).view(dtype.np_dtype)
    u = _UINT_OF_BYTES[dtype.np_dtype.itemsize]
    # astype makes a fresh C-contiguous copy; (ascontiguousarray would turn 0-d into 1-d).
    return np.asarray(bits).astype(u).view(dtype.np_dtype)


def float_format(dtype: DType) -> tuple[int, int]:
    """(exponent bits, explicit mantissa bits) of a float type."""
    info = ml_dtypes.finfo(dtype.np_dtype)
    return int(info.nexp), int(info.nmant)


# --- rounding ---------------------------------------------------------------------------
def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, ties away from zero (round-nearest-afz)."""
    with np.errstate(all="ignore"):
        t = np.trunc(x)
        # x - trunc(x) is exact in floating point, so the tie test is exact too (adding
        # 0.5 first would round 0.49999997f + 0.5f up to 1).
        r = np.where(np.abs(x - t) >= np.asarray(0.5, x.dtype), t + np.sign(x), t)
    return np.where(np.isfinite(x), r, x).astype(x.dtype)


def reduce_precision(x: np.ndarray, exponent_bits: int, mantissa_bits: int,
                     nan_to_inf: bool = False) -> np.ndarray:
    """Round each value to a float format with the given exponent/mantissa widths.

    Round-to-nearest-even on the mantissa, overflow to +-inf, underflow of the exponent
    range to +-0 (subnormals of the narrow format are flushed, as XLA's emitter does), NaN
    kept as NaN (XLA:CPU, even with 0 mantissa bits). ``nan_to_inf``: the StableHLO
    reference interpreter's choice instead, NaN becomes +inf when ``mantissa_bits`` is 0
    (a format without mantissa bits has no NaN). The result keeps ``x``'s storage type.
    """
    src = hlo_dtype(x)
    if src.is_complex:
        return make_complex(reduce_precision(x.real, exponent_bits, mantissa_bits, nan_to_inf),
                            reduce_precision(x.imag, exponent_bits, mantissa_bits, nan_to_inf),
                            x.dtype)
    # Work in f64 or f32 bits: both hold every narrower format exactly.
    wide = np.float64 if src.bits > 32 else np.float32
    w = np.asarray(x).astype(wide)
    ubits, src_mant, src_exp = ((np.uint64, 52, 11) if wide is np.float64 else (np.uint32, 23, 8))
    total = 64 if wide is np.float64 else 32
    bits = w.view(ubits).copy()
    one = ubits(1)
    nan_mask = np.isnan(w)
    if mantissa_bits < src_mant:
        shift = src_mant - mantissa_bits
        last_kept = (bits >> ubits(shift)) & one
        bias = (one << ubits(shift - 1)) - one + last_kept
        bits = bits + bias
        bits = bits & ~((one << ubits(shift)) - one)
    if exponent_bits < src_exp:
        sign_mask = one << ubits(total - 1)
        exp_mask = ((one << ubits(src_exp)) - one) << ubits(src_mant)
        src_bias = (1 << (src_exp - 1)) - 1
        dst_bias = (1 << (exponent_bits - 1)) - 1
        max_exp = ubits(src_bias + dst_bias) << ubits(src_mant)  # biased, in place
        min_exp = ubits(src_bias - dst_bias) << ubits(src_mant)
        exp_part = bits & exp_mask
        sign = bits & sign_mask
        inf_bits = sign | exp_mask
        bits = np.where(exp_part > max_exp, inf_bits, bits)
        bits = np.where(exp_part <= min_exp, sign, bits)
    out = bits.view(wide)
    nan_value = np.asarray(np.inf, wide) if nan_to_inf and mantissa_bits == 0 else w
    out = np.where(nan_mask, nan_value, out)
    return out.astype(x.dtype)
