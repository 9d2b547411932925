"""Numerics that StableHLO's goldens pin down beyond "accurate": the order and precision in
which the reference interpreter rounds (hlo/evaluator/linalg.py, reductions.py), and the
double-precision erf_inv graph (hlo/stablehlo/chlo.py).

Expected values are worked out here one scalar at a time (Python floats, np.float32
scalars, hand-rounded bf16 sums, mpmath), never by the vector code under test. Every case
runs on the interpreter and the CPU backend, which must agree bitwise.
"""
from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import hlo
import runtime

from .test_chlo_math import _bits_distance, run_op


def _run_both(text: str, args: list[np.ndarray]) -> np.ndarray:
    module = hlo.from_stablehlo(text)
    got = np.asarray(hlo.evaluate(module, args, numerics="xla_cpu"))
    client = runtime.client("cpu")
    (buf,) = client.compile(module).execute([client.buffer_from_pyval(a) for a in args])
    cpu = buf.to_numpy()
    assert cpu.tobytes() == got.tobytes(), f"CPU backend {cpu} != interpreter {got}"
    return got


def _dot_program(m: int, k: int, n: int, ctype: str) -> str:
    t = f"complex<{ctype}>"
    return (f"func.func @main(%a: tensor<{m}x{k}x{t}>, %b: tensor<{k}x{n}x{t}>) -> "
            f"tensor<{m}x{n}x{t}> {{\n"
            f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : "
            f"(tensor<{m}x{k}x{t}>, tensor<{k}x{n}x{t}>) -> tensor<{m}x{n}x{t}>\n"
            f"  return %0 : tensor<{m}x{n}x{t}>\n}}")


def _dot_by_hand(a: np.ndarray, b: np.ndarray, real) -> np.ndarray:
    """Reference order, one scalar at a time in ``real`` (float or np.float32): each
    product (ar*br - ai*bi) + (ar*bi + ai*br)i, every operation rounded, added left to
    right starting from zero."""
    out = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            re, im = real(0), real(0)
            for p in range(a.shape[1]):
                ar, ai = real(a[i, p].real), real(a[i, p].imag)
                br, bi = real(b[p, j].real), real(b[p, j].imag)
                re = re + (ar * br - ai * bi)
                im = im + (ar * bi + ai * br)
            out[i, j] = complex(re, im)
    return out


def test_complex128_dot_rounds_each_product_and_sums_in_order():
    # A real row (f32 values widened) times a complex column: the real part cancels to
    # 0.0489 from terms of size ~12. From StableHLO's dot_general_float32_4_3_complex128
    # golden: BLAS (fused multiply-adds) gives ...80722, 92 ULP away.
    a = np.array([[-2.88248158, -0.482540667, -2.66761327]], np.float32).astype(np.complex128)
    b = np.array([[-4.0790969821696059 - 2.7514021321086082j],
                  [3.0242442481728569 + 2.8853021012792994j],
                  [3.8422643529046963 - 3.9406242510143805j]])
    got = _run_both(_dot_program(1, 3, 1, "f64"), [a, b])
    want = _dot_by_hand(a, b, float)
    assert got.tobytes() == want.tobytes()
    assert got[0, 0].real == 0.04892569035280658
    # Not the exactly rounded value either: the golden is this order, not more precision.
    exact = sum(Fraction(float(x.real)) * Fraction(float(y.real)) for x, y in zip(a[0], b[:, 0]))
    assert float(exact) != got[0, 0].real


@pytest.mark.parametrize("m,k,n", [(6, 5, 7), (16, 9, 20)])   # few outputs / >= 256 of them
def test_complex64_dot_rounds_in_f32_not_wider(m, k, n):
    rng = np.random.RandomState(7)
    a = rng.uniform(-8, 8, (m, k)).astype(np.float32).astype(np.complex64)  # real lhs
    b = (rng.uniform(-5, 5, (k, n)) + 1j * rng.uniform(-5, 5, (k, n))).astype(np.complex64)
    got = _run_both(_dot_program(m, k, n, "f32"), [a, b])
    want = _dot_by_hand(a, b, np.float32)
    assert got.tobytes() == want.tobytes()
    wide = (a.astype(np.complex128) @ b.astype(np.complex128)).astype(np.complex64)
    assert got.tobytes() != wide.tobytes()      # c128 and round once is a different answer


def test_complex_convolution_sums_in_order():
    # 1-D complex convolution, one batch, one feature: out[o] = sum_w x[o + w] * k[w].
    x = np.array([[[1.5 + 0j, -2.25 + 0j, 3.0 + 0j, 0.7 + 0j]]], np.complex64)
    k = np.array([[[0.3 - 1.1j, -0.9 + 0.4j, 1.7 + 0.2j]]], np.complex64)
    text = ("func.func @main(%x: tensor<1x1x4xcomplex<f32>>, %k: tensor<1x1x3xcomplex<f32>>) "
            "-> tensor<1x1x2xcomplex<f32>> {\n"
            "  %0 = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0]x[o, i, 0]->[b, f, 0],"
            " window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : "
            "(tensor<1x1x4xcomplex<f32>>, tensor<1x1x3xcomplex<f32>>) -> "
            "tensor<1x1x2xcomplex<f32>>\n  return %0 : tensor<1x1x2xcomplex<f32>>\n}")
    got = _run_both(text, [x, k])
    windows = np.stack([x[0, 0, o:o + 3] for o in range(2)])        # [2, 3]
    want = _dot_by_hand(windows, k[0, 0][:, None], np.float32)      # [2, 1]
    assert got.reshape(2).tobytes() == want.reshape(2).tobytes()


def test_bf16_cumsum_is_a_running_bf16_sum():
    # Column 4 of StableHLO's cumsum_bfloat16_8_9. By hand: -1.171875 - 3.28125 = -4.453125
    # = -100.011101b, a tie at 8 significant bits, to even: -4.4375. Summing in f32 and
    # rounding once would carry -4.453125 on and end at 0.1171875 where bf16 gives 0.1328125.
    x = np.array([-2.4375, 1.265625, -3.28125, 2.28125, 3.21875, -0.9296875, -0.137695, 1.0859375])
    xb = x.astype(ml_dtypes.bfloat16)
    text = ("func.func @main(%x: tensor<8xbf16>) -> tensor<8xbf16> {\n"
            "  %z = stablehlo.constant dense<0.0> : tensor<bf16>\n"
            "  %0 = \"stablehlo.reduce_window\"(%x, %z) <{padding = dense<[[7, 0]]> : "
            "tensor<1x2xi64>, window_dimensions = array<i64: 8>}> ({\n"
            "  ^bb0(%a: tensor<bf16>, %b: tensor<bf16>):\n"
            "    %s = stablehlo.add %a, %b : tensor<bf16>\n"
            "    stablehlo.return %s : tensor<bf16>\n"
            "  }) : (tensor<8xbf16>, tensor<bf16>) -> tensor<8xbf16>\n"
            "  return %0 : tensor<8xbf16>\n}")
    got = _run_both(text, [xb]).astype(np.float64)
    want = [-2.4375, -1.171875, -4.4375, -2.15625, 1.0625, 0.1328125, -0.0048828125, 1.078125]
    assert got.tolist() == want


def test_erf_inv_f64_is_double_accurate():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 120
    xs = np.array([-0.9999999999999999, -0.999999, -0.5, -1e-300, 0.0, 1e-10, 0.1, 0.3, 0.7,
                   0.9, 0.99, 0.999999999, 1 - 2.0**-40, 1 - 2.0**-52], np.float64)
    got = run_op("chlo.erf_inv", xs, backends=("interpreter", "cpu"))
    want = np.array([float(mpmath.erfinv(mpmath.mpf(float(x)))) for x in xs])
    assert max(_bits_distance(got, want)) <= 2, (got, want)
    edges = run_op("chlo.erf_inv", np.array([1.0, -1.0, np.nan, 1.5, -2.0]),
                   backends=("interpreter", "cpu"))
    assert edges[0] == np.inf and edges[1] == -np.inf and np.isnan(edges[2:]).all()
