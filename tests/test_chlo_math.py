"""CHLO math functions (hlo/stablehlo/chlo_math.py, chlo_special.py) and the complex
exp/log1p kernels (hlo/evaluator/complex_math.py) against mpmath, rounded once.

Points cover the whole complex plane (tiny, unit-sized, huge, on both sides of every branch
cut), signed zeros, infinities and NaNs; special values are the C99 Annex G / StableHLO ones
worked out by hand. The numpy CPU backend must agree bitwise with the interpreter.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import hlo
import runtime

mpmath = pytest.importorskip("mpmath")

_MLIR = {np.float16: "f16", np.float32: "f32", np.float64: "f64",
         np.complex64: "complex<f32>", np.complex128: "complex<f64>"}


def _program(op: str, dtype, n: int, out_dtype=None) -> str:
    t = f"tensor<{n}x{_MLIR[dtype]}>"
    to = f"tensor<{n}x{_MLIR[out_dtype or dtype]}>"
    types = f"{t} -> {to}" if op.startswith("chlo.") else t
    return (f"func.func @main(%x: {t}) -> {to} {{\n"
            f"  %0 = {op} %x : {types}\n  return %0 : {to}\n}}")


def run_op(op: str, x: np.ndarray, out_dtype=None, backends=("interpreter",)) -> np.ndarray:
    """``op`` on ``x`` by the interpreter and the CPU backend; they must agree bitwise.

    Interpreter-only runs use the StableHLO spec's numerics (gradual underflow, as mpmath);
    with the CPU backend both use XLA:CPU's (subnormals flushed)."""
    module = hlo.from_stablehlo(_program(op, x.dtype.type, x.size, out_dtype))
    numerics = "xla_cpu" if "cpu" in backends else "spec"
    got = np.asarray(hlo.evaluate(module, [x], numerics=numerics))
    if "cpu" in backends:
        client = runtime.client("cpu")
        (buf,) = client.compile(module).execute([client.buffer_from_pyval(x)])
        cpu = buf.to_numpy()
        assert cpu.tobytes() == got.tobytes(), f"{op}: CPU backend {cpu} != interpreter {got}"
    return got


def _bits_distance(a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """ULP distance per element of two real float arrays (NaN == NaN; inf vs finite huge)."""
    ui = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
    ai, ei = a.view(ui).astype(object), e.view(ui).astype(object)
    sign = 1 << (8 * a.dtype.itemsize - 1)

    def ordered(v):     # sign-magnitude -> a monotonic integer line
        return v if v >= 0 else -(v + sign)
    out = []
    for x, y, xa, ya in zip(ai.ravel(), ei.ravel(), a.ravel(), e.ravel()):
        if np.isnan(xa) and np.isnan(ya):
            out.append(0)
        elif np.isnan(xa) or np.isnan(ya):
            out.append(10**30)
        else:
            out.append(abs(ordered(x) - ordered(y)))
    return np.array(out, dtype=object).reshape(a.shape)


def ulp_error(got: np.ndarray, want: np.ndarray) -> int:
    if np.iscomplexobj(got):
        return max(ulp_error(got.real, want.real), ulp_error(got.imag, want.imag))
    return int(_bits_distance(np.asarray(got), np.asarray(want).astype(got.dtype)).max())


def mp_reference(fn, x: np.ndarray) -> np.ndarray:
    """``fn`` in mpmath, rounded once to x's type (complex parts separately). The working
    precision spans the whole exponent range, as mpmath's precision is relative to the
    larger part: a part 1e-300 times the other keeps its digits."""
    digits = 700 if x.dtype in (np.float64, np.complex128) else 120
    with mpmath.workdps(digits):
        return _mp_reference(fn, x)


def _mp_reference(fn, x: np.ndarray) -> np.ndarray:
    out = []
    for v in x.ravel():
        if np.iscomplexobj(x):
            r = fn(mpmath.mpc(float(v.real), float(v.imag)))
            r = mpmath.mpc(r)
            out.append(complex(float(r.real), float(r.imag)))
        else:
            out.append(float(fn(mpmath.mpf(float(v)))))
    return np.array(out).astype(x.dtype)


# --- sample points ----------------------------------------------------------------------
def complex_grid(dtype) -> np.ndarray:
    """Real and imaginary parts from -huge..huge (no zeros, no infinities: mpmath has no
    signed zeros, those are tested by hand below)."""
    fi = np.finfo(np.dtype(dtype).type(0).real.dtype)
    mags = [float(fi.tiny) * 4, 1e-20, 1e-5, 0.3, 0.999, 1.0, 1.001, 2.5, 1e5,
            float(fi.max) ** 0.5 * 0.7, float(fi.max) / 4]
    parts = sorted({s * m for m in mags for s in (-1, 1)})
    re, im = np.meshgrid(parts, parts)
    return (re + 1j * im).ravel().astype(dtype)


COMPLEX_FUNCS = [("chlo.asin", mpmath.asin), ("chlo.acos", mpmath.acos),
                 ("chlo.asinh", mpmath.asinh), ("chlo.acosh", mpmath.acosh),
                 ("chlo.atan", mpmath.atan), ("chlo.atanh", mpmath.atanh)]


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("op,ref", COMPLEX_FUNCS, ids=[c[0] for c in COMPLEX_FUNCS])
def test_complex_inverse_functions_match_mpmath(op, ref, dtype):
    z = complex_grid(dtype)
    got = run_op(op, z, backends=("interpreter",))
    want = mp_reference(ref, z)
    # StableHLO's math suite accepts up to 3 ULP for these (functional_algorithms' bounds).
    assert ulp_error(got, want) <= 3, op


def _many_ops_program(ops: list[str], dtype, n: int) -> str:
    t = f"tensor<{n}x{_MLIR[dtype]}>"
    lines = [f"  %r{i} = {op} %x : " + (f"{t} -> {t}" if op.startswith("chlo.") else t)
             for i, op in enumerate(ops)]
    results = ", ".join(f"%r{i}" for i in range(len(ops)))
    return (f"func.func @main(%x: {t}) -> ({', '.join([t] * len(ops))}) {{\n"
            + "\n".join(lines) + f"\n  return {results} : {', '.join([t] * len(ops))}\n}}")


@pytest.mark.parametrize("dtype,ops", [
    (np.complex64, [c[0] for c in COMPLEX_FUNCS] + ["chlo.sinh", "chlo.cosh", "chlo.square",
                                                    "stablehlo.exponential",
                                                    "stablehlo.log_plus_one"]),
    # (erfc and bessel_i1e unroll 60-term series: slow to compile, left to the interpreter.)
    (np.float32, ["chlo.lgamma", "chlo.digamma", "chlo.asin", "chlo.acosh", "chlo.atanh",
                  "chlo.sinh"])], ids=["c64", "f32"])
def test_cpu_backend_agrees_with_interpreter(dtype, ops):
    """The numpy CPU kernels (default pipeline, fused) give the interpreter's bits."""
    if dtype == np.complex64:
        x = complex_grid(dtype)[::5]
    else:
        x = np.concatenate([np.linspace(-12, 30, 57), [0.0, -0.0, np.inf, -np.inf, np.nan,
                                                       1.0, -3.0, 0.999]]).astype(dtype)
    module = hlo.from_stablehlo(_many_ops_program(ops, dtype, x.size))
    want = hlo.evaluate(module, [x])
    client = runtime.client("cpu")
    got = client.compile(module).execute([client.buffer_from_pyval(x)])
    for op, g, w in zip(ops, got, want):
        assert g.to_numpy().tobytes() == np.asarray(w).tobytes(), op


def test_complex_branch_cuts_and_signed_zeros():
    acosh2 = math.log(2 + math.sqrt(3))          # |imag| of asin(2 +- 0i)
    z = np.array([complex(2, 0.0), complex(2, -0.0), complex(-2, 0.0), complex(-2, -0.0)],
                 np.complex128)
    got = run_op("chlo.asin", z)
    # On the cut (|x| > 1) a zero imaginary part counts as +0 whatever its sign: StableHLO's
    # algorithm (and jax.jit) choose the side by ``im < 0``; C99's casin would follow -0.
    want = [complex(math.pi / 2, acosh2), complex(math.pi / 2, acosh2),
            complex(-math.pi / 2, acosh2), complex(-math.pi / 2, acosh2)]
    np.testing.assert_allclose(got, want, rtol=1e-15)
    got = run_op("chlo.acos", z)
    want = [complex(0, -acosh2), complex(0, -acosh2), complex(math.pi, -acosh2),
            complex(math.pi, -acosh2)]
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-300)
    # asinh's cut is on the imaginary axis: asinh(+-0 + 2i) = acosh(2) + i pi/2 (again the
    # sign of a zero real part is not looked at, as in jax.jit).
    got = run_op("chlo.asinh", np.array([complex(0.0, 2), complex(-0.0, 2)], np.complex128))
    np.testing.assert_allclose(got, [complex(acosh2, math.pi / 2),
                                     complex(acosh2, math.pi / 2)], rtol=1e-15)
    # atanh(x +- 0i), x > 1: real part log((x+1)/(x-1))/2, imaginary +-pi/2 (atan2 sees the
    # zero's sign here, as in jax.jit).
    got = run_op("chlo.atanh", np.array([complex(3, 0.0), complex(3, -0.0)], np.complex128))
    np.testing.assert_allclose(got, [complex(math.log(2) / 2, math.pi / 2),
                                     complex(math.log(2) / 2, -math.pi / 2)], rtol=1e-15)
    # Zeros keep their signs.
    zeros = np.array([complex(0.0, 0.0), complex(-0.0, -0.0)], np.complex64)
    for op in ("chlo.asin", "chlo.asinh", "chlo.atan", "chlo.atanh"):
        got = run_op(op, zeros)
        assert np.all(got == 0), op
        if op in ("chlo.asin", "chlo.atan"):    # atan2(-0, w) keeps the real part's sign
            assert np.signbit(got[1].real), op


def test_complex_special_values():
    inf, nan = math.inf, math.nan
    z = np.array([complex(inf, inf), complex(-inf, 1.0), complex(1.0, inf),
                  complex(nan, 1.0), complex(1.0, -inf)], np.complex128)
    q = math.pi / 4
    h = math.pi / 2
    cases = {
        "chlo.asin": [complex(q, inf), complex(-h, inf), complex(0, inf), None, complex(0, -inf)],
        "chlo.acos": [complex(q, -inf), complex(math.pi, -inf), complex(h, -inf), None,
                      complex(h, inf)],
        "chlo.asinh": [complex(inf, q), complex(-inf, 0), complex(inf, h), None,
                       complex(inf, -h)],
        "chlo.atanh": [complex(0, h), complex(-0.0, h), complex(0, h), None, complex(0, -h)],
    }
    for op, want in cases.items():
        got = run_op(op, z)
        for g, w, zz in zip(got, want, z):
            if w is None:
                assert np.isnan(g.real) and np.isnan(g.imag), (op, zz, g)
            else:
                np.testing.assert_allclose([g.real, g.imag], [w.real, w.imag], rtol=1e-15,
                                           err_msg=f"{op}({zz})")


def test_square():
    z = np.array([complex(1, 2), complex(3, 3), complex(1e20, -1e20), complex(2.5, -0.5)],
                 np.complex64)
    got = run_op("chlo.square", z)
    np.testing.assert_array_equal(got, np.array([complex(-3, 4), complex(0, 18),
                                                 complex(0, -2e40), complex(6, -2.5)],
                                                np.complex64))
    # |re| == |im|: exactly 0, not the rounding residue of (x - y)(x + y).
    assert got[2].real == 0 and np.isinf(got[2].imag)
    x = np.array([-3.0, 0.5, np.inf], np.float32)
    np.testing.assert_array_equal(run_op("chlo.square", x), [9.0, 0.25, np.inf])


def test_complex_sinh_cosh():
    z = np.array([complex(0.5, 0.25), complex(-3, 2), complex(1e-8, 1e-8), complex(40, 1)],
                 np.complex128)
    for op, ref in (("chlo.sinh", mpmath.sinh), ("chlo.cosh", mpmath.cosh)):
        got = run_op(op, z)
        want = mp_reference(ref, z)
        np.testing.assert_allclose(got, want, rtol=1e-14, err_msg=op)


# --- real functions ---------------------------------------------------------------------
REAL_FUNCS = [("chlo.asin", mpmath.asin, 1), ("chlo.acos", mpmath.acos, 1),
              ("chlo.asinh", mpmath.asinh, 1), ("chlo.acosh", mpmath.acosh, 1),
              ("chlo.atanh", mpmath.atanh, 1), ("chlo.atan", mpmath.atan, 1)]


@pytest.mark.parametrize("op,ref,lo", REAL_FUNCS, ids=[c[0] for c in REAL_FUNCS])
def test_real_inverse_functions_f32(op, ref, lo):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-lo, lo, 150), [0.999999, -0.999999, 1e-30, 0.5]])
    if op == "chlo.acosh":
        x = np.concatenate([1 + rng.exponential(2.0, 150), [1.0000001, 3e38]])
    if op == "chlo.asinh":
        x = np.concatenate([x, rng.normal(0, 1e4, 50), [3e38, -3e38]])
    x = x.astype(np.float32)
    got = run_op(op, x, backends=("interpreter",))
    assert ulp_error(got, mp_reference(ref, x)) <= 2, op


SPECIAL = [("chlo.lgamma", mpmath.loggamma), ("chlo.digamma", mpmath.digamma),
           ("chlo.erfc", mpmath.erfc), ("chlo.bessel_i1e", lambda v: mpmath.besseli(1, v) *
                                         mpmath.exp(-abs(v)))]


def _lgamma_real(v):
    return mpmath.log(abs(mpmath.gamma(v)))


@pytest.mark.parametrize("dtype,max_ulp", [(np.float32, 1), (np.float64, 64)])
@pytest.mark.parametrize("op,ref", SPECIAL, ids=[c[0] for c in SPECIAL])
def test_special_functions_match_mpmath(op, ref, dtype, max_ulp):
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(-10, 10, 60), rng.uniform(0, 60, 30),
                        [0.5, 1e-6, -1e-6, 25.5, 3.7, 150.0, -40.25, 1e10]])
    if op == "chlo.erfc":
        x = np.concatenate([rng.uniform(-3, 26, 90), [1.999, 2.0, 2.001, 9.0]])
    x = x.astype(dtype)
    if op == "chlo.lgamma":
        ref = _lgamma_real
    got = run_op(op, x, backends=("interpreter",))
    want = mp_reference(ref, x)
    # Near the zeros of lgamma (x = 1, 2) and digamma (x ~ 1.46) the relative error grows
    # while the absolute one stays ~eps: an element passes on either bound.
    ulps = np.array([ulp_error(got[i:i + 1], want[i:i + 1]) for i in range(x.size)])
    abs_err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    ok = (ulps <= max_ulp) | (abs_err <= 16 * np.finfo(dtype).eps)
    # f64 is evaluated by the same f64 graph: a few dozen ULP from the Lanczos sum, far
    # inside the 1e-3 the StableHLO suite allows.
    assert ok.all(), (op, x[~ok], got[~ok], want[~ok])


def test_special_function_poles_and_infinities():
    inf, nan = np.inf, np.nan
    x = np.array([0.0, -1.0, -2.0, -1e30, inf, -inf, nan], np.float32)
    # XLA's conventions (checked with jax.scipy.special on the CPU).
    np.testing.assert_array_equal(run_op("chlo.lgamma", x), [inf, inf, inf, inf, inf, inf, nan])
    np.testing.assert_array_equal(run_op("chlo.digamma", x), [nan, nan, nan, nan, inf, nan, nan])
    np.testing.assert_array_equal(run_op("chlo.erfc", np.array([inf, -inf, 0.0, 30.0], np.float32)),
                                  [0.0, 2.0, 1.0, 0.0])
    got = run_op("chlo.bessel_i1e", np.array([0.0, -0.0, inf, -inf, nan], np.float32))
    np.testing.assert_array_equal(got, [0.0, -0.0, 0.0, -0.0, nan])
    assert np.signbit(got[1]) and np.signbit(got[3])
    # erfc keeps relative accuracy far in the tail (1 - erf would give 0 here).
    tail = run_op("chlo.erfc", np.array([10.0, 26.0], np.float64))
    np.testing.assert_allclose(tail, [float(mpmath.erfc(10)), float(mpmath.erfc(26))], rtol=1e-14)
    for narrow in (np.float16,):
        got = run_op("chlo.lgamma", np.array([0.5, 3.0, -2.5], narrow))
        np.testing.assert_allclose(got.astype(np.float64), [0.5723649, 0.6931472, -0.0562437],
                                   atol=2e-3)


# --- complex exp and log1p (stablehlo ops, evaluator kernels) ------------------------------
def test_complex_exp_special_values_and_overflow():
    inf, nan = math.inf, math.nan
    z = np.array([complex(-inf, inf), complex(inf, 0.0), complex(709.9, 1.2), complex(0.0, nan),
                  complex(-inf, 0.5), complex(88.9, 1.2)], np.complex128)
    got = run_op("stablehlo.exponential", z)
    assert np.isnan(got[0].real) and np.isnan(got[0].imag)     # exp(-inf) * cos(inf)
    assert got[1] == complex(inf, 0)                           # imaginary part 0, not NaN
    want = mpmath.exp(mpmath.mpc(709.9, 1.2))                  # e^x overflows, e^x cos y not
    np.testing.assert_allclose([got[2].real, got[2].imag], [float(want.real),
                                                            float(want.imag)], rtol=1e-14)
    assert np.isnan(got[3].real) and np.isnan(got[3].imag)
    assert got[4] == 0
    got64 = run_op("stablehlo.exponential", z[5:].astype(np.complex64))
    want = mpmath.exp(mpmath.mpc(float(np.float32(88.9)), float(np.float32(1.2))))
    # e^88.9 overflows f32, e^88.9 cos(1.2) does not: rounded once from f64.
    assert np.isfinite(got64[0].real)
    assert ulp_error(got64, np.array([complex(want)], np.complex64)) <= 1


def test_complex_log1p_accuracy():
    # x close to -y^2/2 (the real part cancels to ~1e-20), x close to -1, huge, infinite.
    y = 1e-4
    z = np.array([complex(-y * y / 2 + 1e-20, y), complex(-1 + 1e-9, 1e-9),
                  complex(1e300, 1e300), complex(-2.0, 1e-9), complex(0.5, 0.5),
                  complex(-0.9999999, 3e-5)], np.complex128)
    got = run_op("stablehlo.log_plus_one", z)
    assert ulp_error(got, mp_reference(mpmath.log1p, z)) <= 2
    z32 = z[[1, 3, 4, 5]].astype(np.complex64)
    got32 = run_op("stablehlo.log_plus_one", z32)
    assert ulp_error(got32, mp_reference(mpmath.log1p, z32)) <= 1
    inf, nan = math.inf, math.nan
    sp = run_op("stablehlo.log_plus_one", np.array([complex(inf, nan), complex(-inf, 1.0),
                                                    complex(nan, 2.0)], np.complex128))
    assert sp[0].real == inf and np.isnan(sp[0].imag)
    assert sp[1].real == inf and sp[1].imag == math.pi
    assert np.isnan(sp[2].real) and np.isnan(sp[2].imag)
