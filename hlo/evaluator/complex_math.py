"""exp and log1p on complex numbers, accurate over the whole plane, infinities and NaNs
included (numpy's complex exp/log1p lose the real part of log1p near ``x = -y^2/2``,
overflow ``exp`` where a part should stay finite, and give C99's special values where
StableHLO's (mpmath's) differ).

Both compute in f64 and round once to the result type: c64 inputs are exact in f64, so
they get (nearly) correctly rounded results; c128 uses the same f64 algorithms, which are
written not to cancel or overflow (the ones StableHLO's complex math expander documents).
"""
from __future__ import annotations

import numpy as np

from .numerics import make_complex


def _parts(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(z)
    return z.real.astype(np.float64), z.imag.astype(np.float64)


def complex_exp(z: np.ndarray) -> np.ndarray:
    """exp(x + iy) = e^x (cos y + i sin y); the imaginary part is 0 for y == 0 (else an
    infinite e^x times 0 is NaN), and where e^x overflows but e^x cos y need not, the
    factor is split as e^(x/2) (cos y) e^(x/2)."""
    x, y = _parts(z)
    with np.errstate(all="ignore"):
        e = np.exp(x)
        half = np.exp(x * 0.5)
        cs, sn = np.cos(y), np.sin(y)
        overflow = e == np.inf
        re = np.where(overflow, half * cs * half, e * cs)
        im = np.where(y == 0, 0.0, np.where(overflow, half * sn * half, e * sn))
    return make_complex(re, im, np.asarray(z).dtype)


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s + err == a + b exactly (Knuth's 2Sum)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _square_dekker(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """hi + lo == a * a exactly (Veltkamp split, Dekker product); |a| < 1e150."""
    c = 134217729.0 * a                  # 2^27 + 1 splits a double into two 26-bit halves
    ah = c - (c - a)
    al = a - ah
    hi = a * a
    return hi, ((ah * ah - hi) + 2.0 * ah * al) + al * al


def _compensated_sum(terms: list[np.ndarray]) -> np.ndarray:
    """The sum of ``terms`` as if accumulated in twice the precision (Neumaier)."""
    s = np.zeros_like(terms[0])
    comp = np.zeros_like(terms[0])
    for t in terms:
        s, err = _two_sum(s, t)
        comp = comp + err
    return s + comp


def complex_log1p(z: np.ndarray) -> np.ndarray:
    """log1p(x + iy) = log|1 + z| + i atan2(y, 1 + x), the real part by region:

    * far field (|x| or |y| beyond sqrt(max)/4): log(mx) + log1p((mn/mx)^2) / 2 with
      mx, mn = max, min(|1+x|, |y|) (1 is negligible there; mn/mx := 1 when both are inf);
    * |1 + z|^2 < 1/2: log(hypot(1 + x, y)), no cancellation as 1 + x is exact near -1;
    * elsewhere: log1p(2x + x^2 + y^2) / 2, the sum from exact (Dekker) squares added with
      compensation, so x close to -y^2/2 keeps its digits."""
    x, y = _parts(z)
    with np.errstate(all="ignore"):
        xp1 = x + 1.0
        ax, ay = np.abs(xp1), np.abs(y)
        mx, mn = np.maximum(ax, ay), np.minimum(ax, ay)
        ratio = np.where(mx == mn, 1.0, mn / mx)
        far_re = np.log(mx) + 0.5 * np.log1p(ratio * ratio)
        far = (np.abs(x) > 3e153) | (ay > 3e153) | np.isinf(x) | np.isinf(y)
        xs, ys = np.where(far, 0.0, x), np.where(far, 0.0, y)
        xxh, xxl = _square_dekker(xs)
        yyh, yyl = _square_dekker(ys)
        s = _compensated_sum([xs + xs, yyh, xxh, yyl, xxl])
        near_minus_one = s < -0.5
        re = np.where(far, far_re,
                      np.where(near_minus_one, np.log(np.hypot(xp1, y)), 0.5 * np.log1p(s)))
        re = np.where(np.isnan(x) | np.isnan(y),
                      np.where(np.isinf(x) | np.isinf(y), np.inf, np.nan), re)
        im = np.arctan2(y, xp1)
    return make_complex(re, im, np.asarray(z).dtype)
