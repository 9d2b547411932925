"""Regression tests for bugs the differential fuzzer (tests/test_fuzz_programs.py) found.

Each test is the shrunk program, its inputs, and the value ``jax.jit`` gives for them,
checked on every backend/pipeline combination the fuzzer runs.
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402

import hlo  # noqa: E402
from tests.test_fuzz_programs import COMBOS, compare, run_combo  # noqa: E402


def check_everywhere(fn, args, expected) -> None:
    module = hlo.from_jax(fn, *args)
    for name in COMBOS:
        got = run_combo(module, name, args)
        assert len(got) == len(expected), name
        for g, e in zip(got, expected):
            msg = compare(g, np.asarray(e))
            assert msg is None, f"{name}: {msg}"


def test_dead_loop_does_not_update_the_entry_root_in_place():
    """A while loop nobody reads (kept by pipeline="none") whose init is the entry's root:
    copy insertion let the loop take the root's buffer, so the loop's abs() overwrote the
    output. jax.jit returns the input reshaped: -1 ... -9."""
    def program(p0):
        v1 = p0.reshape((1, 1, 1, 9))
        lax.fori_loop(0, 1, lambda i, c: jnp.abs(c) + i.astype(jnp.float32), v1)
        return (v1.reshape((1, 1, 1, 9)),)
    x = -np.arange(1, 10, dtype=np.float32).reshape(3, 3)
    check_everywhere(program, [x], [-np.arange(1, 10, dtype=np.float32).reshape(1, 1, 1, 9)])


@pytest.mark.parametrize("axes", [(), (1,)])
def test_reduce_combining_nothing_is_the_input(axes):
    """jnp.prod over no axes (or a size-1 one) of complex infinities: XLA returns the input
    (a reduce that combines nothing is a reshape); (1+0j) * (-inf+infj) is nan+nanj.
    jax.jit: [-inf+infj, 3.184-infj]."""
    x = np.array([[-np.inf + np.inf * 1j], [3.1840317 - np.inf * 1j]], np.complex64)
    expected = x if axes == () else x[:, 0]
    check_everywhere(lambda a: jnp.prod(a, axis=axes), [x], [expected])


def test_complex_dot_with_infinity_multiplies_textbook_style():
    """matmul of complex vectors with an infinity: XLA multiplies each pair as
    (ar*br - ai*bi) + (ar*bi + ai*br)j and sums; BLAS's complex GEMM gave nan+nanj.
    jax.jit: inf+nanj."""
    x = np.array([np.inf - 0j, -2.7672675 - 3.1219122j], np.complex64)
    check_everywhere(jnp.matmul, [x, x], [np.complex64(complex(np.inf, np.nan))])


def test_complex_matmul_recovers_infinities_as_std_complex():
    """XLA's CPU dot multiplies with std::complex (C99 Annex G): (1.807-0j) * (inf-infj)
    is inf-infj there (textbook parts are both NaN, the infinity is recovered), and
    (0.188-inf j) * (-0-0j) stays nan+nanj. numpy's GEMM gave nan+nanj for row 1.
    jax.jit: [[-inf+nanj], [inf-infj], [nan+nanj]]."""
    a = np.array([[2.7329268 - 0.41835114j, -1.3303894 - 0.31845003j],
                  [0.70302016 + 1.0816911j, 1.8069403 - 0j],
                  [0.1880246 - np.inf * 1j, -1.4869986 - 1.3076572j]], np.complex64)
    b = np.array([[-0.0 - 0j], [complex(np.inf, -np.inf)]], np.complex64)
    b[0, 0] = complex(-0.0, -0.0)
    expected = np.array([[complex(-np.inf, np.nan)], [complex(np.inf, -np.inf)],
                         [complex(np.nan, np.nan)]], np.complex64)
    check_everywhere(jnp.matmul, [a, b], [expected])


def test_variadic_reduce_with_an_empty_kept_dimension():
    """argmin over axis 1 of an s32[0,1] (a variadic reduce): reshaping the reduced
    columns with -1 failed when a kept dimension is 0 ("cannot reshape array of size 0").
    jax.jit: an empty s32[0]."""
    x = np.zeros((0, 1), np.int32)
    check_everywhere(lambda a: jnp.argmin(a, axis=1), [x], [np.zeros((0,), np.int32)])


def test_complex_divide_corner_cases_as_xla():
    """Complex division where Smith's step gives (nan, nan): XLA applies C99's corner
    cases, numpy does not. jax.jit values: (inf+nanj)/(1+0j) = inf+nanj;
    (1+0j)/(0+0j) = inf+nanj; (1+1j)/(inf+0j) = 0+0j; (inf+1j)/(1+3e38j) = nan-infj."""
    x = np.array([complex(np.inf, np.nan), 1 + 0j, 1 + 1j, complex(np.inf, 1)], np.complex64)
    y = np.array([1 + 0j, 0j, complex(np.inf, 0), complex(1, 3e38)], np.complex64)
    expected = np.array([complex(np.inf, np.nan), complex(np.inf, np.nan), 0j,
                         complex(np.nan, -np.inf)], np.complex64)
    check_everywhere(lambda a, b: a / b, [x, y], [expected])


def test_complex_dot_contracting_one_element_is_a_multiply():
    """A dot whose contraction has one element is a multiply in XLA (its simplifier), so
    no Annex G recovery: (1.2808453+0j) * (-inf-infj) with textbook parts is
    (-inf - 0*-inf) + (-inf + 0*-inf)j = nan+nanj; jax.jit gives nan+nanj (with the
    recovery it would be -inf-infj)."""
    a = np.array([[1.2808453 + 0j]], np.complex64)
    b = np.array([complex(-np.inf, -np.inf)], np.complex64)
    check_everywhere(jnp.matmul, [a, b], [np.array([complex(np.nan, np.nan)], np.complex64)])


def test_cpu_none_loop_state_through_a_call():
    """jax.random.bits in a while loop whose body calls the round function.
    jax.jit: [2098992034, 2919706841, 2646866425]."""
    import jax
    k = np.array([0, 42], np.uint32)
    fn = lambda k: jax.random.bits(jax.random.wrap_key_data(k), (3,))  # noqa: E731
    module = hlo.from_jax(fn, k)
    got = run_combo(module, "cpu/none", [k])
    np.testing.assert_array_equal(got[0], np.array([2098992034, 2919706841, 2646866425],
                                                   np.uint32))
