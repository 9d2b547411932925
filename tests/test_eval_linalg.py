"""dot, ragged-dot, convolution, fft, cholesky, triangular-solve vs jax.jit on the CPU."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from hlo import Builder, ConvDimLabels, Window, WindowDim
from hlo.evaluator import evaluate
from hlo.shape import array

RNG = np.random.default_rng(1)


def run_dot(x, y, xdt, ydt, out_dt, out_dims, **dims):
    b = Builder("main")
    p, q = b.parameter(array(xdt, x.shape)), b.parameter(array(ydt, y.shape))
    b.dot(p, q, shape=array(out_dt, out_dims), **dims)
    return evaluate(b.module(), [x, y])


def test_batched_dot_f32():
    x = RNG.standard_normal((3, 4, 5, 6)).astype(np.float32)   # b, m, k1, ...
    y = RNG.standard_normal((3, 6, 7)).astype(np.float32)
    got = run_dot(x, y, "f32", "f32", "f32", (3, 4, 5, 7), lhs_batch_dims=(0,),
                  rhs_batch_dims=(0,), lhs_contracting_dims=(3,), rhs_contracting_dims=(1,))
    want = jax.jit(lambda a, c: lax.dot_general(a, c, (((3,), (1,)), ((0,), (0,)))))(x, y)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dot_two_contracting_dims_and_rhs_free_first():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    y = RNG.standard_normal((5, 4, 2)).astype(np.float32)
    got = run_dot(x, y, "f32", "f32", "f32", (3, 5), lhs_contracting_dims=(0, 2),
                  rhs_contracting_dims=(2, 1))
    want = jax.jit(lambda a, c: lax.dot_general(a, c, (((0, 2), (2, 1)), ((), ()))))(x, y)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int8_dot_to_s32_is_exact():
    x = RNG.integers(-128, 128, (16, 64)).astype(np.int8)
    y = RNG.integers(-128, 128, (64, 8)).astype(np.int8)
    got = run_dot(x, y, "s8", "s8", "s32", (16, 8), lhs_contracting_dims=(1,),
                  rhs_contracting_dims=(0,))
    want = jax.jit(lambda a, c: lax.dot(a, c, preferred_element_type=jnp.int32))(x, y)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, x.astype(np.int64) @ y.astype(np.int64))


def test_int8_dot_to_s8_wraps():
    x = np.full((2, 4), 100, np.int8)
    got = run_dot(x, x.T.copy(), "s8", "s8", "s8", (2, 2), lhs_contracting_dims=(1,),
                  rhs_contracting_dims=(0,))
    want = jax.jit(lambda a, c: a @ c)(x, x.T)
    np.testing.assert_array_equal(got, want)        # 40000 mod 256 as s8


def test_bf16_dot_accumulates_in_f32():
    x = RNG.standard_normal((8, 512)).astype(ml_dtypes.bfloat16)
    y = RNG.standard_normal((512, 4)).astype(ml_dtypes.bfloat16)
    got = run_dot(x, y, "bf16", "bf16", "bf16", (8, 4), lhs_contracting_dims=(1,),
                  rhs_contracting_dims=(0,))
    want = jax.jit(lambda a, c: a @ c)(x, y)
    exact = (x.astype(np.float64) @ y.astype(np.float64)).astype(ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, exact)       # f32 accumulation rounds like f64 here
    np.testing.assert_allclose(got.astype(np.float32), np.asarray(want, np.float32),
                               rtol=2e-2, atol=2e-2)


def test_ragged_dot_groups_rows():
    lhs = RNG.standard_normal((10, 4)).astype(np.float32)
    rhs = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    sizes = np.array([3, 0, 6], np.int32)            # the last row is in no group -> zeros
    b = Builder("main")
    ps = [b.parameter(array("f32", lhs.shape)), b.parameter(array("f32", rhs.shape)),
          b.parameter(array("s32", (3,)))]
    b.ragged_dot(*ps, lhs_contracting_dims=(1,), rhs_contracting_dims=(1,),
                 lhs_ragged_dims=(0,), rhs_group_dims=(0,), shape=array("f32", (10, 5)))
    got = evaluate(b.module(), [lhs, rhs, sizes])
    want = jax.jit(lax.ragged_dot)(lhs, rhs, sizes)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got[9] == 0).all()


# --- convolution --------------------------------------------------------------------------
def run_conv(x, k, lhs_spec, rhs_spec, out_spec, strides, padding, lhs_dil, rhs_dil,
             fgc=1, bgc=1, dtype="f32", out_dtype=None):
    dn = lax.conv_dimension_numbers(x.shape, k.shape, (lhs_spec, rhs_spec, out_spec))
    fn = jax.jit(lambda a, c: lax.conv_general_dilated(
        a, c, strides, padding, lhs_dil, rhs_dil, dn, feature_group_count=fgc,
        batch_group_count=bgc, preferred_element_type=out_dtype))
    want = np.asarray(fn(x, k))

    # jax's spec letters -> XLA dim_labels: N/C/O/I + spatial letters in order.
    def to_labels(spec, a, b):
        sp = [c for c in spec if c not in (a, b)]
        return "".join({a: "x", b: "y"}.get(c, str(sp.index(c)) if c in sp else c) for c in spec)
    lhs_l = to_labels(lhs_spec, "N", "C").replace("x", "b").replace("y", "f")
    rhs_l = to_labels(rhs_spec, "O", "I").replace("x", "o").replace("y", "i")
    out_l = to_labels(out_spec, "N", "C").replace("x", "b").replace("y", "f")
    labels = ConvDimLabels.parse(f"{lhs_l}_{rhs_l}->{out_l}")
    nsp = len(strides)
    wd = tuple(WindowDim(k.shape[labels.kernel_spatial[i]], strides[i], padding[i][0],
                         padding[i][1], rhs_dil[i], lhs_dil[i]) for i in range(nsp))
    b = Builder("main")
    p, q = b.parameter(array(dtype, x.shape)), b.parameter(array(dtype, k.shape))
    from hlo import dtypes as dt
    b.convolution(p, q, window=Window(wd), dim_labels=labels, feature_group_count=fgc,
                  batch_group_count=bgc,
                  shape=array(dt.from_numpy(want.dtype), want.shape))
    got = evaluate(b.module(), [x, k])
    return got, want


def test_conv_nhwc_stride_padding():
    x = RNG.standard_normal((2, 9, 8, 3)).astype(np.float32)
    k = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)
    got, want = run_conv(x, k, "NHWC", "HWIO", "NHWC", (2, 1), [(1, 1), (0, 2)], (1, 1), (1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_nchw_groups_and_dilations():
    x = RNG.standard_normal((2, 6, 10, 9)).astype(np.float32)
    k = RNG.standard_normal((9, 2, 3, 2)).astype(np.float32)     # OIHW, 3 groups of 2 in
    got, want = run_conv(x, k, "NCHW", "OIHW", "NCHW", (1, 2), [(2, 0), (1, -1)], (2, 1),
                         (1, 3), fgc=3)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_batch_group_count_and_mixed_layout_output():
    x = RNG.standard_normal((4, 5, 7, 3)).astype(np.float32)     # N H W C
    k = RNG.standard_normal((2, 2, 3, 6)).astype(np.float32)     # H W I O, O = 2 groups x 3
    got, want = run_conv(x, k, "NHWC", "HWIO", "NCHW", (1, 1), [(0, 0), (1, 0)], (1, 1),
                         (1, 2), bgc=2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_1d_int8_to_s32_exact():
    x = RNG.integers(-100, 100, (2, 3, 11)).astype(np.int8)
    k = RNG.integers(-100, 100, (4, 3, 3)).astype(np.int8)
    got, want = run_conv(x, k, "NCH", "OIH", "NCH", (2,), [(1, 1)], (1,), (1,), dtype="s8",
                         out_dtype=jnp.int32)
    np.testing.assert_array_equal(got, want)


def test_conv_small_cnn_is_fast():
    x = RNG.standard_normal((8, 32, 32, 16)).astype(np.float32)
    k = RNG.standard_normal((3, 3, 16, 32)).astype(np.float32)
    t = time.perf_counter()
    got, want = run_conv(x, k, "NHWC", "HWIO", "NHWC", (1, 1), [(1, 1), (1, 1)], (1, 1), (1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    assert time.perf_counter() - t < 3.0            # includes jax's own compile and run


def test_conv_window_reversal_is_flipped_kernel():
    x = RNG.standard_normal((1, 1, 6)).astype(np.float32)
    k = RNG.standard_normal((1, 1, 3)).astype(np.float32)
    b = Builder("main")
    p, q = b.parameter(array("f32", x.shape)), b.parameter(array("f32", k.shape))
    b.convolution(p, q, window=Window((WindowDim(3, window_reversal=True),)),
                  dim_labels=ConvDimLabels.parse("bf0_oi0->bf0"), shape=array("f32", (1, 1, 4)))
    got = evaluate(b.module(), [x, k])
    want = np.convolve(x[0, 0], k[0, 0], mode="valid")  # true convolution flips the kernel
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-5)


# --- fft ----------------------------------------------------------------------------------
def run_fft(x, kind, lengths, in_dt, out_dt, out_dims):
    b = Builder("main")
    p = b.parameter(array(in_dt, x.shape))
    b.fft(p, fft_type=kind, fft_length=tuple(lengths), shape=array(out_dt, out_dims))
    return evaluate(b.module(), [x])


def test_fft_round_trips_and_matches_jax():
    x = (RNG.standard_normal((3, 8, 6)) + 1j * RNG.standard_normal((3, 8, 6))).astype(np.complex64)
    f = run_fft(x, "FFT", (8, 6), "c64", "c64", x.shape)
    np.testing.assert_allclose(f, jax.jit(lambda a: jnp.fft.fft2(a))(x), rtol=1e-4, atol=1e-4)
    back = run_fft(f, "IFFT", (8, 6), "c64", "c64", x.shape)
    assert back.dtype == np.complex64
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)

    r = RNG.standard_normal((4, 10)).astype(np.float32)
    rf = run_fft(r, "RFFT", (10,), "f32", "c64", (4, 6))
    np.testing.assert_allclose(rf, jax.jit(jnp.fft.rfft)(r), rtol=1e-4, atol=1e-4)
    rb = run_fft(rf, "IRFFT", (10,), "c64", "f32", (4, 10))
    assert rb.dtype == np.float32
    np.testing.assert_allclose(rb, r, rtol=1e-5, atol=1e-5)


# --- cholesky, triangular solve ----------------------------------------------------------
def spd(n, batch=()):
    a = RNG.standard_normal(batch + (n, n))
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(np.float32)


@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_op(lower):
    a = spd(5, (2,))
    b = Builder("main")
    p = b.parameter(array("f32", a.shape))
    b.cholesky(p, lower=lower, shape=array("f32", a.shape))
    got = evaluate(b.module(), [a])
    want = jax.jit(lambda m: lax.linalg.cholesky(m, symmetrize_input=False))(a)
    if not lower:
        want = np.swapaxes(want, -1, -2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    tri = np.tril if lower else np.triu
    np.testing.assert_array_equal(got, tri(got))     # the other triangle is zero, as jax


def test_cholesky_not_positive_definite_is_nan():
    a = -np.eye(3, dtype=np.float32)
    b = Builder("main")
    p = b.parameter(array("f32", a.shape))
    b.cholesky(p, lower=True, shape=array("f32", a.shape))
    assert np.isnan(evaluate(b.module(), [a])).all()


@pytest.mark.parametrize("left_side,lower,unit,trans", [
    (True, True, False, "NO_TRANSPOSE"), (True, False, True, "TRANSPOSE"),
    (False, True, False, "TRANSPOSE"), (False, False, False, "NO_TRANSPOSE")])
def test_triangular_solve(left_side, lower, unit, trans):
    a = (RNG.standard_normal((2, 4, 4)) + 4 * np.eye(4)).astype(np.float32)
    bm = RNG.standard_normal((2, 4, 3) if left_side else (2, 3, 4)).astype(np.float32)
    b = Builder("main")
    p, q = b.parameter(array("f32", a.shape)), b.parameter(array("f32", bm.shape))
    b.triangular_solve(p, q, left_side=left_side, lower=lower, unit_diagonal=unit,
                       transpose_a=trans, shape=array("f32", bm.shape))
    got = evaluate(b.module(), [a, bm])
    want = jax.jit(lambda m, r: lax.linalg.triangular_solve(
        m, r, left_side=left_side, lower=lower, unit_diagonal=unit,
        transpose_a=(trans == "TRANSPOSE")))(a, bm)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# StableHLO's complex triangular_solve tests (a is lower triangular, b is 3x1).
_CA = np.array([[1 + 1j, 0, 0], [2 - 2j, 3 + 4j, 0], [4 - 3j, 5 + 5j, 6 - 8j]], np.complex64)
_CB = np.array([[7 - 2j], [8 + 4j], [9 - 5j]], np.complex64)


@pytest.mark.parametrize("trans,want", [
    ("NO_TRANSPOSE", [[2.5 - 4.5j], [4.32 + 0.24j], [-0.29 - 0.77j]]),
    ("ADJOINT", [[7.18 + 2.68j], [-0.08 + 3.16j], [0.14 - 1.02j]]),
    ("TRANSPOSE", None)])
def test_triangular_solve_complex(trans, want):
    b = Builder("main")
    p, q = b.parameter(array("c64", _CA.shape)), b.parameter(array("c64", _CB.shape))
    b.triangular_solve(p, q, left_side=True, lower=True, unit_diagonal=False,
                       transpose_a=trans, shape=array("c64", _CB.shape))
    got = evaluate(b.module(), [_CA, _CB])
    assert got.dtype == np.complex64
    op_a = {"NO_TRANSPOSE": _CA, "TRANSPOSE": _CA.T, "ADJOINT": _CA.conj().T}[trans]
    np.testing.assert_allclose(op_a @ got, _CB, rtol=1e-5, atol=1e-5)   # it solves op(a) x = b
    if want is not None:   # the spec test's values, rounded to 2 digits there
        np.testing.assert_allclose(got, np.array(want, np.complex64), atol=1e-4)
    jax_x = jax.jit(lambda m, r: lax.linalg.triangular_solve(
        m, r, left_side=True, lower=True, transpose_a=trans != "NO_TRANSPOSE",
        conjugate_a=trans == "ADJOINT"))(_CA, _CB)
    np.testing.assert_allclose(got, jax_x, rtol=1e-5, atol=1e-5)
