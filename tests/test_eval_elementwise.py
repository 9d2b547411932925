"""Elementwise rules of the reference interpreter against jax.jit on the CPU (XLA's answer).

Where the expected value is XLA's and differs from numpy's, the test says so.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax

import hlo
from hlo import Builder, array
from hlo import dtypes as dt
from hlo.evaluator.numerics import reduce_precision, wrap_int

BF16 = ml_dtypes.bfloat16


def run_op(opcode: str, *args: np.ndarray, out_dtype=None, out_dims=None,
           numerics: str = "xla_cpu", **attrs):
    """Evaluate one instruction ``opcode(args...)`` with an explicitly given result shape
    (``numerics``: the interpreter's mode, XLA:CPU's or the StableHLO spec's)."""
    b = Builder("t")
    params = [b.parameter(array(dt.from_numpy(np.asarray(a).dtype), np.shape(a))) for a in args]
    dtype = dt.from_numpy(out_dtype) if out_dtype is not None else params[0].shape.dtype
    dims = out_dims if out_dims is not None else np.broadcast_shapes(*[np.shape(a) for a in args])
    root = b.op(opcode, *params, shape=array(dtype, dims), **attrs)
    out = hlo.evaluate(b.module(root=root), [np.asarray(a) for a in args], numerics=numerics)
    # Every rule must return exactly the declared element type and dims (0-d included).
    assert out.shape == tuple(dims) and out.dtype == dtype.np_dtype, (out.shape, out.dtype)
    return out


def xla(fn, *args):
    return np.asarray(jax.jit(fn)(*args))


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values and dtype; NaN equals NaN and -0 differs from +0."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    if dt.from_numpy(got.dtype).kind in ("float", "complex"):
        if got.dtype.kind == "c":
            same_bits(got.real, want.real)
            same_bits(got.imag, want.imag)
            return
        g, w = got.astype(np.float64), want.astype(np.float64)
        assert np.array_equal(np.isnan(g), np.isnan(w)), (got, want)
        ok = np.isnan(g) | ((g == w) & (np.signbit(g) == np.signbit(w)))
        assert ok.all(), (got, want)
    else:
        np.testing.assert_array_equal(got, want)


I32 = np.int32
INT_MIN = np.iinfo(I32).min


# --- integer arithmetic edge cases ----------------------------------------------------------
def test_int_overflow_wraps():
    a = np.array([127, -128, 100], np.int8)
    b = np.array([1, -1, 100], np.int8)
    same_bits(run_op("add", a, b), xla(lax.add, a, b))
    same_bits(run_op("subtract", a, b), xla(lax.sub, a, b))
    same_bits(run_op("multiply", a, b), xla(lax.mul, a, b))
    np.testing.assert_array_equal(run_op("add", a, b), np.array([-128, 127, -56], np.int8))


def test_int_divide_and_remainder_edge_cases():
    a = np.array([7, -7, 5, INT_MIN, 3, -7, 7], I32)
    b = np.array([2, 2, 0, -1, 0, -2, -2], I32)
    q = run_op("divide", a, b)
    r = run_op("remainder", a, b)
    # x/0 = -1, INT_MIN/-1 = INT_MIN, truncation toward zero; x%0 = x, INT_MIN%-1 = 0.
    np.testing.assert_array_equal(q, [3, -3, -1, INT_MIN, -1, 3, -3])
    np.testing.assert_array_equal(r, [1, -1, 5, 0, 3, -1, 1])
    same_bits(q, xla(lax.div, a, b))
    same_bits(r, xla(lax.rem, a, b))


def test_unsigned_divide_by_zero_is_all_ones():
    a = np.array([7, 5, 0], np.uint32)
    b = np.array([2, 0, 0], np.uint32)
    same_bits(run_op("divide", a, b), xla(lax.div, a, b))
    np.testing.assert_array_equal(run_op("divide", a, b), [3, 0xFFFFFFFF, 0xFFFFFFFF])
    np.testing.assert_array_equal(run_op("remainder", a, b), [1, 5, 0])


def test_float_remainder_has_dividends_sign():
    a = np.array([5.5, -5.5, np.inf, 1.0, -0.0], np.float32)
    b = np.array([2, 2, 1, 0, 1], np.float32)
    same_bits(run_op("remainder", a, b), xla(lax.rem, a, b))


def test_subbyte_int_wraps():
    a = np.array([7, -8, 5, -3], ml_dtypes.int4)
    b = np.array([1, -1, 5, 3], ml_dtypes.int4)
    np.testing.assert_array_equal(run_op("add", a, b).astype(int), [-8, 7, -6, 0])
    np.testing.assert_array_equal(run_op("multiply", a, b).astype(int), [7, -8, -7, 7])
    np.testing.assert_array_equal(run_op("negate", a).astype(int), [-7, -8, -5, 3])
    same_bits(run_op("add", a, b), xla(lax.add, a, b))
    same_bits(run_op("multiply", a, b), xla(lax.mul, a, b))
    u = np.array([15, 3, 9], ml_dtypes.uint4)
    v = np.array([1, 14, 9], ml_dtypes.uint4)
    np.testing.assert_array_equal(run_op("add", u, v).astype(int), [0, 1, 2])
    np.testing.assert_array_equal(run_op("subtract", v, u).astype(int), [2, 11, 0])
    s2 = np.array([1, -2], ml_dtypes.int2)
    np.testing.assert_array_equal(run_op("add", s2, s2).astype(int), [-2, 0])


def xla_stablehlo_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Run ``stablehlo.<op>`` on XLA:CPU directly, for ops jax.lax does not expose (integer
    power). Uses jax's internal compile API; skips the test if that API moved."""
    try:
        from jax._src import xla_bridge
        from jax._src.lib import xla_client as xc
        backend = xla_bridge.get_backend("cpu")
        ty = f"tensor<{'x'.join(map(str, a.shape))}x{dt.from_numpy(a.dtype).mlir}>"
        text = (f"module @m {{ func.func public @main(%a: {ty}, %b: {ty}) -> {ty} {{ "
                f"%0 = stablehlo.{op} %a, %b : {ty} return %0 : {ty} }} }}")
        exe = backend.compile_and_load(text, xc.DeviceList(tuple(backend.devices()[:1])),
                                       xc.CompileOptions())
        out = exe.execute_sharded([jax.device_put(a), jax.device_put(b)])
        return np.asarray(out.disassemble_into_single_device_arrays()[0][0])
    except (ImportError, AttributeError, TypeError) as e:   # internal API changed
        pytest.skip(f"cannot compile StableHLO text with this jax: {e}")


def test_integer_power_follows_xla():
    # XLA: square-and-multiply over the exponent's low 6 bits (2**65 == 2 in s8!); a
    # negative exponent gives 0 unless the base is 1 or -1.
    base = np.array([2, 1, -1, -1, 3, 0, -2, 5, 2, 2], np.int8)
    exp = np.array([6, -3, -3, -2, -1, 0, 3, 40, 65, 64], np.int8)
    got = run_op("power", base, exp)
    expect = [64, 1, -1, 1, 0, 1, -8, int(wrap_int(np.array(pow(5, 40, 256)), dt.S8)), 2, 1]
    np.testing.assert_array_equal(got, expect)
    same_bits(got, xla_stablehlo_binary("power", base, exp))
    a = np.array([7, -3, 2**31 - 1], I32)
    k = np.array([3, 5, 2], I32)
    same_bits(run_op("power", a, k), xla_stablehlo_binary("power", a, k))


def test_shifts_saturate_at_bit_width():
    a = np.array([-8, 8, -8, 1, 1, 1], I32)
    s = np.array([40, 40, -1, 31, 32, 3], I32)
    for opcode, fn in [("shift-left", lax.shift_left),
                       ("shift-right-arithmetic", lax.shift_right_arithmetic),
                       ("shift-right-logical", lax.shift_right_logical)]:
        same_bits(run_op(opcode, a, s), xla(fn, a, s))
    np.testing.assert_array_equal(run_op("shift-right-arithmetic", a, s), [-1, 0, -1, 0, 0, 0])
    u = np.array([0x80, 0xFF, 1], np.uint8)
    k = np.array([7, 8, 0], np.uint8)
    same_bits(run_op("shift-right-logical", u, k), xla(lax.shift_right_logical, u, k))
    same_bits(run_op("shift-right-arithmetic", u, k), xla(lax.shift_right_arithmetic, u, k))


def test_popcnt_clz_on_unsigned_view():
    x = np.array([0, 1, -1, INT_MIN, 12345], I32)
    same_bits(run_op("popcnt", x), xla(lax.population_count, x))
    same_bits(run_op("count-leading-zeros", x), xla(lax.clz, x))
    y = np.array([0, 1, 255, 16], np.uint8)
    same_bits(run_op("count-leading-zeros", y), xla(lax.clz, y))
    np.testing.assert_array_equal(run_op("count-leading-zeros", y), [8, 7, 0, 3])


def test_bitwise_and_pred_logic():
    a = np.array([0b1100, -1], I32)
    b = np.array([0b1010, 5], I32)
    for opcode, fn in [("and", lax.bitwise_and), ("or", lax.bitwise_or),
                       ("xor", lax.bitwise_xor)]:
        same_bits(run_op(opcode, a, b), xla(fn, a, b))
    same_bits(run_op("not", a), xla(lax.bitwise_not, a))
    p = np.array([True, True, False, False])
    q = np.array([True, False, True, False])
    np.testing.assert_array_equal(run_op("and", p, q), [True, False, False, False])
    np.testing.assert_array_equal(run_op("xor", p, q), [False, True, True, False])
    np.testing.assert_array_equal(run_op("not", p), [False, False, True, True])
    np.testing.assert_array_equal(run_op("add", p, q), [True, True, True, False])


# --- float semantics ---------------------------------------------------------------------------
def test_max_min_propagate_nan_and_order_zeros():
    a = np.array([np.nan, 1, 0.0, -0.0, 2], np.float32)
    b = np.array([1, np.nan, -0.0, 0.0, -3], np.float32)
    same_bits(run_op("maximum", a, b), xla(lax.max, a, b))
    same_bits(run_op("minimum", a, b), xla(lax.min, a, b))
    lo = np.array([0.0, 0, 0], np.float32)
    hi = np.array([1.0, 1, 1], np.float32)
    x = np.array([-2, np.nan, 0.5], np.float32)
    same_bits(run_op("clamp", lo, x, hi), xla(lax.clamp, lo, x, hi))


def test_sign_round_and_zeros():
    x = np.array([-0.0, np.nan, -3, 0.0, 2.5, -2.5, 0.49999997, 1.5], np.float32)
    same_bits(run_op("sign", x), xla(lax.sign, x))
    same_bits(run_op("round-nearest-afz", x),
              xla(lambda v: lax.round(v, lax.RoundingMethod.AWAY_FROM_ZERO), x))
    same_bits(run_op("round-nearest-even", x),
              xla(lambda v: lax.round(v, lax.RoundingMethod.TO_NEAREST_EVEN), x))
    same_bits(run_op("floor", x), xla(lax.floor, x))
    same_bits(run_op("ceil", x), xla(lax.ceil, x))
    i = np.array([-5, 0, 7, INT_MIN], I32)
    same_bits(run_op("sign", i), xla(lax.sign, i))
    same_bits(run_op("abs", i), xla(lax.abs, i))   # |INT_MIN| wraps to INT_MIN


def test_bf16_rounds_after_every_op():
    # 255 + 1 = 256 exactly; 256 + 1 = 257 rounds to 256 in bf16 (8 significant bits).
    a = np.array([255, 256, 1.0], BF16)
    b = np.array([1, 1, 1e-3], BF16)
    got = run_op("add", a, b)
    same_bits(got, xla(lax.add, a, b))
    np.testing.assert_array_equal(got.astype(np.float32), [256, 256, 1.0])
    # (a*b)*c with a rounding between the two multiplies.
    x = np.array([1.1, 3.3, 7.7], BF16)
    same_bits(run_op("multiply", run_op("multiply", x, x), x), xla(lambda v: v * v * v, x))
    same_bits(run_op("divide", x, a), xla(lax.div, x, a))
    same_bits(run_op("sqrt", x), xla(lax.sqrt, x))
    h = np.array([1000.5, 2049, 65504], np.float16)
    same_bits(run_op("add", h, h), xla(lax.add, h, h))


def test_is_finite_real_imag_complex():
    x = np.array([1, np.inf, -np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(run_op("is-finite", x, out_dtype=np.bool_),
                                  [True, False, False, False])
    re = np.array([1, 2], np.float32)
    im = np.array([3, -4], np.float32)
    c = run_op("complex", re, im, out_dtype=np.complex64)
    same_bits(c, xla(lax.complex, re, im))
    same_bits(run_op("real", c, out_dtype=np.float32), re)
    same_bits(run_op("imag", c, out_dtype=np.float32), im)
    same_bits(run_op("abs", c, out_dtype=np.float32), xla(lax.abs, c))


@pytest.mark.parametrize("opcode,fn", [
    ("exponential", lax.exp), ("exponential-minus-one", lax.expm1), ("log", lax.log),
    ("log-plus-one", lax.log1p), ("sine", lax.sin), ("cosine", lax.cos), ("tan", lax.tan),
    ("tanh", lax.tanh), ("sqrt", lax.sqrt), ("rsqrt", lax.rsqrt), ("cbrt", lax.cbrt),
    ("logistic", lax.logistic), ("erf", lax.erf)])
def test_transcendentals_close_to_xla(opcode, fn):
    x = np.array([1e-8, -1e-6, 0.3, 1.7, 5.0, -2.5, 0.0, 30.0], np.float32)
    if opcode in ("log", "sqrt", "rsqrt"):
        x = np.abs(x)
    got = run_op(opcode, x)
    want = xla(fn, x)
    assert got.dtype == want.dtype
    # XLA's polynomial approximations and numpy/libm differ by a few ulps at most.
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_narrow_float_transcendentals_match_xla_exactly(dtype):
    # Computed in f32 and rounded once -- except logistic, which XLA expands into
    # 1 / (1 + exp(-x)) with a rounding after each step.
    x = np.linspace(-5, 5, 401).astype(dtype)
    for opcode, fn in [("exponential", lax.exp), ("tanh", lax.tanh), ("logistic", lax.logistic),
                       ("sine", lax.sin), ("erf", lax.erf), ("cbrt", lax.cbrt)]:
        same_bits(run_op(opcode, x), xla(fn, x))
    pos = np.linspace(0.01, 50, 401).astype(dtype)
    for opcode, fn in [("log", lax.log), ("sqrt", lax.sqrt), ("rsqrt", lax.rsqrt),
                       ("log-plus-one", lax.log1p)]:
        same_bits(run_op(opcode, pos), xla(fn, pos))


def test_log1p_expm1_accurate_for_small_x():
    x = np.array([1e-10, -3e-9], np.float32)
    np.testing.assert_allclose(run_op("log-plus-one", x), x, rtol=1e-6)
    np.testing.assert_allclose(run_op("exponential-minus-one", x), x, rtol=1e-6)


def test_erf_is_correctly_rounded_f32():
    import math
    x = np.linspace(-4, 4, 101).astype(np.float32)
    want = np.array([math.erf(float(v)) for v in x]).astype(np.float32)
    same_bits(run_op("erf", x), want)


def test_atan2_power_float():
    y = np.array([1, -1, 0, -0.0, 3], np.float32)
    x = np.array([1, -1, -1, -1, 0], np.float32)
    np.testing.assert_allclose(run_op("atan2", y, x), xla(lax.atan2, y, x), rtol=2e-7)
    a = np.array([2, 0, np.nan, -8, 4], np.float32)
    p = np.array([0.5, 0, 0, 1 / 3, -1], np.float32)
    same_bits(run_op("power", a, p), xla(lax.pow, a, p))


# --- compare / select ---------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare_float_ieee(direction):
    a = np.array([1, np.nan, -0.0, 2, np.nan], np.float32)
    b = np.array([1, 1, 0.0, 1, np.nan], np.float32)
    fn = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}
    same_bits(run_op("compare", a, b, out_dtype=np.bool_, direction=direction),
              xla(fn[direction], a, b))


def test_compare_total_order():
    vals = np.array([-np.nan, -np.inf, -1, -0.0, 0.0, 1e-45, 1, np.inf, np.nan], np.float32)
    vals[0] = -np.abs(vals[0]) if not np.signbit(vals[0]) else vals[0]
    vals[0] = np.frombuffer(np.uint32(0xFFC00000).tobytes(), np.float32)[0]  # -NaN
    a = np.repeat(vals, len(vals))
    b = np.tile(vals, len(vals))
    got = run_op("compare", a, b, out_dtype=np.bool_, direction="LT", type="TOTALORDER")
    # The list is already in total order, so a < b iff its position is smaller.
    pos = np.arange(len(vals))
    np.testing.assert_array_equal(got, np.repeat(pos, len(pos)) < np.tile(pos, len(pos)))
    eq = run_op("compare", a, b, out_dtype=np.bool_, direction="EQ", type="TOTALORDER")
    np.testing.assert_array_equal(eq, np.repeat(pos, len(pos)) == np.tile(pos, len(pos)))


def test_compare_unsigned_and_select():
    a = np.array([0, 200, 255], np.uint8)
    b = np.array([1, 100, 0], np.uint8)
    np.testing.assert_array_equal(run_op("compare", a, b, out_dtype=np.bool_, direction="GT"),
                                  [False, True, True])
    pred = np.array([True, False, True])
    np.testing.assert_array_equal(run_op("select", pred, a, b, out_dtype=np.uint8), [0, 100, 255])


# --- conversions ------------------------------------------------------------------------------
def test_float_to_int_saturates_and_nan_is_zero():
    x = np.array([np.nan, 1e10, -1e10, 2.7, -2.7, np.inf, -np.inf, 2147483520.0], np.float32)
    for to in (np.int32, np.uint8, np.int8, np.uint32, np.int16):
        same_bits(run_op("convert", x, out_dtype=to),
                  xla(lambda v: lax.convert_element_type(v, to), x))
    same_bits(run_op("convert", x, out_dtype=ml_dtypes.int4),
              xla(lambda v: lax.convert_element_type(v, jnp.int4), x))
    np.testing.assert_array_equal(run_op("convert", x, out_dtype=np.int32)[:3],
                                  [0, 2147483647, -2147483648])


def test_int_conversions_wrap_and_bool():
    x = np.array([9, -9, 100, -1, 0], I32)
    same_bits(run_op("convert", x, out_dtype=ml_dtypes.int4),
              xla(lambda v: lax.convert_element_type(v, jnp.int4), x))
    same_bits(run_op("convert", x, out_dtype=np.uint32),
              xla(lambda v: lax.convert_element_type(v, jnp.uint32), x))
    same_bits(run_op("convert", x, out_dtype=np.bool_),
              xla(lambda v: lax.convert_element_type(v, jnp.bool_), x))
    f = np.array([0, 0.5, np.nan, -0.0], np.float32)
    same_bits(run_op("convert", f, out_dtype=np.bool_),
              xla(lambda v: lax.convert_element_type(v, jnp.bool_), f))
    p = np.array([True, False])
    same_bits(run_op("convert", p, out_dtype=np.float32), np.array([1, 0], np.float32))
    big = np.array([16777217, 2**31 - 1], I32)   # not representable in f32: round to nearest
    same_bits(run_op("convert", big, out_dtype=np.float32),
              xla(lambda v: lax.convert_element_type(v, jnp.float32), big))
    same_bits(run_op("convert", big, out_dtype=BF16),
              xla(lambda v: lax.convert_element_type(v, jnp.bfloat16), big))


def test_float_narrowing_and_complex_to_real():
    x = np.array([1000., np.inf, np.nan, 1e-9, 3.14159], np.float32)
    for to in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, BF16, np.float16):
        same_bits(run_op("convert", x, out_dtype=to),
                  xla(lambda v: lax.convert_element_type(v, to), x))
    c = np.array([1 + 2j, -3 - 4j], np.complex64)
    same_bits(run_op("convert", c, out_dtype=np.float32), np.array([1, -3], np.float32))


def test_bitcast_convert_equal_and_different_widths():
    x = np.array([1.0, -2.5], np.float32)
    same_bits(run_op("bitcast-convert", x, out_dtype=np.int32),
              xla(lambda v: lax.bitcast_convert_type(v, jnp.int32), x))
    same_bits(run_op("bitcast-convert", x, out_dtype=np.uint8, out_dims=(2, 4)),
              xla(lambda v: lax.bitcast_convert_type(v, jnp.uint8), x))
    b = np.array([[0, 0, 128, 63], [0, 0, 32, 192]], np.uint8)
    same_bits(run_op("bitcast-convert", b, out_dtype=np.float32, out_dims=(2,)),
              xla(lambda v: lax.bitcast_convert_type(v, jnp.float32), b))
    h = np.array([[1.0, 2.0]], np.float16)
    same_bits(run_op("bitcast-convert", h, out_dtype=np.float32, out_dims=(1,)),
              xla(lambda v: lax.bitcast_convert_type(v, jnp.float32), h))


def test_reduce_precision_matches_xla():
    x = np.array([1.3, 1e6, 1e-7, np.nan, 3.5, -65520, 65519, 6e-5, -0.0], np.float32)
    x = np.concatenate([x, [np.inf, -np.inf, 1.5, 2.5, 3e38, 1e-30, -7.75]]).astype(np.float32)
    for e, m in [(5, 10), (8, 7), (5, 2), (4, 3), (8, 23), (11, 52), (5, 0), (2, 1), (1, 0)]:
        same_bits(run_op("reduce-precision", x, exponent_bits=e, mantissa_bits=m),
                  xla(lambda v: lax.reduce_precision(v, e, m), x))
    xb = x.astype(BF16)
    for e, m in [(5, 2), (4, 3), (8, 7)]:
        same_bits(run_op("reduce-precision", xb, exponent_bits=e, mantissa_bits=m),
                  xla(lambda v: lax.reduce_precision(v, e, m), xb))
    # f32 -> (5, 10) equals a round trip through f16 for normal values.
    y = np.array([1.0009765625 + 2**-12, 3.14159, 1000.7], np.float32)
    same_bits(reduce_precision(y, 5, 10), y.astype(np.float16).astype(np.float32))


def test_map_applies_computation_elementwise():
    sub = Builder("mul_add")
    p0 = sub.parameter(array("f32", ()))
    p1 = sub.parameter(array("f32", ()))
    sub_root = sub.op("add", sub.op("multiply", p0, p1, shape=array("f32", ())), p0,
                      shape=array("f32", ()))
    comp = sub.build(sub_root)
    b = Builder("t")
    x = b.parameter(array("f32", (2, 3)))
    y = b.parameter(array("f32", (2, 3)))
    root = b.op("map", x, y, shape=array("f32", (2, 3)), dimensions=(0, 1), to_apply=comp)
    m = b.module(root=root, called=(comp,))
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    yv = np.full((2, 3), 2, np.float32)
    np.testing.assert_array_equal(hlo.evaluate(m, [xv, yv]), xv * yv + xv)


def test_stochastic_convert_rounds_by_random_bits():
    x = np.array([1.25, 1.25, -1.75, 1e9], np.float32)
    r = np.array([0, 0xFFFFFFFF, 0, 0], np.uint32)
    # frac .25: random 0 < .25*2^32 -> round up; all ones -> down; -1.75 -> -2; saturate.
    np.testing.assert_array_equal(run_op("stochastic-convert", x, r, out_dtype=np.int8),
                                  [2, 1, -2, 127])


# --- property tests against XLA ---------------------------------------------------------------
_BINARY = [("add", lax.add), ("subtract", lax.sub), ("multiply", lax.mul),
           ("maximum", lax.max), ("minimum", lax.min), ("divide", lax.div),
           ("remainder", lax.rem)]


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(_BINARY), st.sampled_from([np.int8, np.int32, np.uint16]),
       st.data())
def test_integer_binary_ops_match_xla(op, dtype, data):
    opcode, fn = op
    shape = (5,)
    a = data.draw(hnp.arrays(dtype, shape))
    b = data.draw(hnp.arrays(dtype, shape))
    same_bits(run_op(opcode, a, b), xla(fn, a, b))


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(_BINARY), st.sampled_from([np.float32, BF16, np.float16]),
       st.data())
def test_float_binary_ops_match_xla(op, dtype, data):
    opcode, fn = op
    floats = st.floats(width=32, allow_nan=True, allow_infinity=True)
    with np.errstate(over="ignore"):   # f32 values beyond f16's range become inf
        a = np.array(data.draw(st.lists(floats, min_size=4, max_size=4)), np.float32).astype(dtype)
        b = np.array(data.draw(st.lists(floats, min_size=4, max_size=4)), np.float32).astype(dtype)
    same_bits(run_op(opcode, a, b), xla(fn, a, b))


def test_subnormals_flush_like_xla_cpu():
    # XLA:CPU computes with DAZ/FTZ: subnormal operands read as zero, subnormal results
    # become zero; negate/abs (sign-bit ops) and widening converts keep subnormals.
    d = np.array([1e-45, -1e-45, 1e-39, 1e-20], np.float32)
    z = np.array([0, 0, 0, 1e-20], np.float32)
    for opcode, fn in [("add", lax.add), ("multiply", lax.mul), ("maximum", lax.max)]:
        same_bits(run_op(opcode, d, z), xla(fn, d, z))
    same_bits(run_op("negate", d), xla(lax.neg, d))
    same_bits(run_op("abs", d), xla(lax.abs, d))
    same_bits(run_op("floor", d), xla(lax.floor, d))
    same_bits(run_op("sign", d), xla(lax.sign, d))
    same_bits(run_op("compare", d, z, out_dtype=np.bool_, direction="EQ"), xla(lax.eq, d, z))
    for to in (np.float16, BF16, np.bool_):   # bf16 keeps 1e-39: narrowing is integer ops
        same_bits(run_op("convert", d, out_dtype=to),
                  xla(lambda v: lax.convert_element_type(v, to), d))
    # f32 -> f64 reads the subnormals as zero (seen with jax_enable_x64 on XLA:CPU).
    same_bits(run_op("convert", d, out_dtype=np.float64),
              np.array([0.0, -0.0, 0.0, np.float32(1e-20)], np.float64))
    h = np.array([1e-7, 6e-8], np.float16)   # f16 subnormals are normal f32: kept
    same_bits(run_op("convert", h, out_dtype=np.float32),
              xla(lambda v: lax.convert_element_type(v, jnp.float32), h))
    b = np.array([1e-39], BF16)
    same_bits(run_op("add", b, np.zeros(1, BF16)), xla(lax.add, b, np.zeros(1, BF16)))


_INT_EXTRA = [("and", lax.bitwise_and), ("or", lax.bitwise_or), ("xor", lax.bitwise_xor),
              ("shift-left", lax.shift_left),
              ("shift-right-arithmetic", lax.shift_right_arithmetic),
              ("shift-right-logical", lax.shift_right_logical)]


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(_INT_EXTRA), st.sampled_from([np.int8, np.int32, np.uint16]), st.data())
def test_integer_bit_ops_match_xla(op, dtype, data):
    opcode, fn = op
    a = data.draw(hnp.arrays(dtype, (6,)))
    b = data.draw(hnp.arrays(dtype, (6,), elements=st.integers(0, 40).map(dtype)))
    same_bits(run_op(opcode, a, b), xla(fn, a, b))


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([np.int8, np.uint8, np.int32, np.uint32, ml_dtypes.int4, BF16,
                        np.float16]),
       st.lists(st.floats(width=32), min_size=6, max_size=6))
def test_convert_from_f32_matches_xla(to, values):
    x = np.array(values, np.float32)
    same_bits(run_op("convert", x, out_dtype=to),
              xla(lambda v: lax.convert_element_type(v, to), x))


def test_64_bit_integer_edge_cases():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        lo = np.iinfo(np.int64).min
        a = np.array([lo, lo, 7, -7, 2**62], np.int64)
        b = np.array([-1, 0, 0, 2, 4], np.int64)
        same_bits(run_op("divide", a, b), xla(lax.div, a, b))
        same_bits(run_op("remainder", a, b), xla(lax.rem, a, b))
        same_bits(run_op("multiply", a, b), xla(lax.mul, a, b))
        s = np.array([63, 64, 1, 70, 2], np.int64)
        same_bits(run_op("shift-left", a, s), xla(lax.shift_left, a, s))
        same_bits(run_op("shift-right-arithmetic", a, s), xla(lax.shift_right_arithmetic, a, s))
        u = np.array([2**64 - 1, 5, 0], np.uint64)
        v = np.array([0, 0, 3], np.uint64)
        same_bits(run_op("divide", u, v), xla(lax.div, u, v))
        same_bits(run_op("count-leading-zeros", u), xla(lax.clz, u))
        f = np.array([9.3e18, -9.3e18, 1.8e19, np.nan, -1.0], np.float64)
        for to in (np.int64, np.uint64):
            same_bits(run_op("convert", f, out_dtype=to),
                      xla(lambda x: lax.convert_element_type(x, to), f))
    finally:
        jax.config.update("jax_enable_x64", old)


def test_scalar_operands_stay_scalars():
    s = np.uint32(0x80000000)
    for opcode in ("shift-right-logical", "shift-left", "shift-right-arithmetic", "xor",
                   "add", "divide", "remainder", "power", "maximum"):
        assert run_op(opcode, s, np.uint32(3)).shape == ()
    f = np.float32(-2.5)
    for opcode in ("abs", "sign", "floor", "round-nearest-afz", "exponential", "erf",
                   "logistic", "negate", "cbrt", "rsqrt", "is-finite"):
        out_dtype = np.bool_ if opcode == "is-finite" else None
        assert run_op(opcode, f, out_dtype=out_dtype).shape == ()
    assert run_op("bitcast-convert", f, out_dtype=np.int32).shape == ()
    assert run_op("popcnt", np.int8(-1)) == 8


# --- the two numerics modes (XLA:CPU vs the StableHLO spec) and conformance-suite fixes ----
def _subnormal(dtype) -> np.ndarray:
    s = ml_dtypes.finfo(dtype).smallest_subnormal
    return np.array([s, -s], dtype)


@pytest.mark.parametrize("dtype", [BF16, np.float32, np.float64])
def test_ceil_floor_of_subnormals_by_mode(dtype):
    x = _subnormal(dtype)
    # XLA:CPU (DAZ): a subnormal reads as a signed zero, so ceil/floor give +-0 (jax.jit's).
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        same_bits(run_op("ceil", x), xla(jnp.ceil, x))
        same_bits(run_op("floor", x), xla(jnp.floor, x))
    finally:
        jax.config.update("jax_enable_x64", old)
    same_bits(run_op("ceil", x), np.array([0.0, -0.0], dtype))
    # Spec (IEEE roundToIntegral, StableHLO's ceil/floor tests): ceil(+tiny) = 1,
    # floor(-tiny) = -1.
    same_bits(run_op("ceil", x, numerics="spec"), np.array([1.0, -0.0], dtype))
    same_bits(run_op("floor", x, numerics="spec"), np.array([0.0, -1.0], dtype))


def test_spec_mode_keeps_subnormal_results_and_inputs():
    tiny = np.float32(ml_dtypes.finfo(np.float32).smallest_subnormal)
    a = np.array([tiny, 2 * tiny], np.float32)
    b = np.array([tiny, -tiny], np.float32)
    same_bits(run_op("add", a, b, numerics="spec"), np.array([2 * tiny, tiny], np.float32))
    same_bits(run_op("add", a, b), np.array([0.0, 0.0], np.float32))
    assert run_op("compare", a, np.zeros(2, np.float32), out_dtype=np.bool_, direction="GT",
                  numerics="spec").tolist() == [True, True]
    assert run_op("compare", a, np.zeros(2, np.float32), out_dtype=np.bool_, direction="GT"
                  ).tolist() == [False, False]
    # f64 -> f32 of a value that is subnormal in f32: kept in spec mode, flushed by XLA:CPU.
    d = np.array([float(tiny) * 3], np.float64)
    same_bits(run_op("convert", d, out_dtype=np.float32, numerics="spec"),
              np.array([3 * tiny], np.float32))
    same_bits(run_op("convert", d, out_dtype=np.float32), np.array([0.0], np.float32))


def test_unknown_numerics_mode_is_an_evaluation_error():
    with pytest.raises(hlo.EvaluationError, match="numerics mode"):
        run_op("add", np.float32(1), np.float32(2), numerics="fast")


def test_complex_flush_keeps_infinite_parts():
    # Building complex values as re + 1j*im would turn (inf, 1) into (nan, ...).
    x = np.array([complex(np.inf, 1.0), complex(2.0, -np.inf)], np.complex64)
    zero = np.zeros(2, np.complex64)
    same_bits(run_op("add", x, zero), xla(lax.add, x, zero))
    same_bits(run_op("add", x, zero), x)


def test_reduce_precision_nan_to_zero_mantissa_format_by_mode():
    # StableHLO's reduce_precision test: NaN (all mantissa bits set) to e5m0 is +inf in the
    # spec's reference interpreter (a format with no mantissa bits has no NaN); XLA:CPU
    # keeps the NaN bits unchanged (checked with jax.jit).
    bits = np.array([0x7FFFFFFFFFFFFFFF, 0xFFF8000000000000], np.uint64)
    x = bits.view(np.float64)
    spec = run_op("reduce-precision", x, exponent_bits=5, mantissa_bits=0, numerics="spec")
    assert spec.view(np.uint64).tolist() == [0x7FF0000000000000] * 2
    cpu = run_op("reduce-precision", x, exponent_bits=5, mantissa_bits=0)
    assert cpu.view(np.uint64).tolist() == bits.tolist()
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        want = xla(lambda v: lax.reduce_precision(v, 5, 0), x)
    finally:
        jax.config.update("jax_enable_x64", old)
    assert cpu.view(np.uint64).tolist() == want.view(np.uint64).tolist()
    # With mantissa bits left, NaN stays NaN in both modes.
    assert np.isnan(run_op("reduce-precision", x, exponent_bits=5, mantissa_bits=2,
                           numerics="spec")).all()


def _bits_lsb_first(value: int, n: int) -> np.ndarray:
    return np.array([(value >> i) & 1 for i in range(n)], np.bool_)


def test_bitcast_convert_pred_is_one_bit_in_stablehlo():
    v = 0x0123456789ABCDEF
    bits = _bits_lsb_first(v, 64)            # element i is bit i (StableHLO's test)
    assert run_op("bitcast-convert", bits, out_dtype=np.int64, out_dims=()) == v
    f = np.array(v, np.int64).view(np.float64)
    got = run_op("bitcast-convert", f, out_dtype=np.bool_, out_dims=(64,))
    np.testing.assert_array_equal(got, bits)
    # A byte-wide pred (XLA's width): 8 x pred <-> s64, one byte per element.
    bytes_ = np.array([1, 0, 0, 0, 0, 0, 0, 1], np.bool_)
    assert run_op("bitcast-convert", bytes_, out_dtype=np.int64, out_dims=()) == \
        (1 | (1 << 56))


def test_bitcast_convert_joins_and_splits_little_endian():
    v = 0x0123456789ABCDEF
    x = np.array(v, np.int64)
    got = run_op("bitcast-convert", x, out_dtype=np.float64, out_dims=())
    assert got.shape == () and got.view(np.int64) == v
    halves = run_op("bitcast-convert", x, out_dtype=np.uint32, out_dims=(2,))
    assert halves.tolist() == [0x89ABCDEF, 0x01234567]
    back = run_op("bitcast-convert", halves, out_dtype=np.int64, out_dims=())
    assert back == v
    # Sub-byte elements pack low bits first: u4 [1, 2] is the byte 0x21.
    nibbles = np.array([1, 2], ml_dtypes.uint4)
    assert run_op("bitcast-convert", nibbles, out_dtype=np.uint8, out_dims=()) == 0x21
    assert run_op("bitcast-convert", np.uint8(0x21), out_dtype=ml_dtypes.uint4,
                  out_dims=(2,)).tolist() == [1, 2]
    with pytest.raises(hlo.EvaluationError, match="minor dimension"):
        run_op("bitcast-convert", np.zeros(3, np.uint32), out_dtype=np.int64, out_dims=())


def test_cbrt_complex_is_the_principal_root():
    # StableHLO's cbrt test: cbrt(3+4i) = 5**(1/3) * e^(i*atan2(4,3)/3).
    z = np.array([3 + 4j, -8 + 0j, 8j], np.complex128)
    got = run_op("cbrt", z)
    want = np.array([1.6289371459221759 + 0.5201745023045458j,
                     1 + np.sqrt(3) * 1j,             # not the real root -2
                     np.sqrt(3) + 1j], np.complex128)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    np.testing.assert_allclose(got ** 3, z, atol=1e-12)
    assert run_op("cbrt", z.astype(np.complex64)).dtype == np.complex64
