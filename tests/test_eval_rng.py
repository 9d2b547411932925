"""rng-bit-generator bit-exact with XLA:CPU (values and new state); rng determinism."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import hlo
from hlo import Builder, array, tuple_shape

KEY = np.array([0x12345678, 0x9ABCDEF0, 0x0FEDCBA9, 0x87654321], np.uint32)
ALGORITHMS = {"rng_three_fry": lax.RandomAlgorithm.RNG_THREE_FRY,
              "rng_philox": lax.RandomAlgorithm.RNG_PHILOX,
              "rng_default": lax.RandomAlgorithm.RNG_DEFAULT}


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def _run_rbg(algorithm: str, state: np.ndarray, dtype: str, dims):
    b = Builder("t")
    p = b.parameter(array("u64", state.shape))
    out = tuple_shape(array("u64", state.shape), array(dtype, dims))
    root = b.op("rng-bit-generator", p, shape=out, algorithm=algorithm)
    return hlo.evaluate(b.module(root=root), [state])


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("dtype", ["u32", "u64", "u8", "u16"])
@pytest.mark.parametrize("dims", [(), (5,), (3, 4), (3, 5), (2, 3, 7)])
def test_rng_bit_generator_matches_xla(x64, algorithm, dtype, dims):
    np_dtype = hlo.dtypes.by_name(dtype).np_dtype
    new_key, values = jax.jit(lambda k: lax.rng_bit_generator(
        k, dims, dtype=np_dtype, algorithm=ALGORITHMS[algorithm]))(KEY)
    # jax passes its u32[4] key to XLA as u64[2] (little-endian pairs).
    state = KEY.view(np.uint64)
    got_state, got_values = _run_rbg(algorithm, state, dtype, dims)
    np.testing.assert_array_equal(got_values, np.asarray(values))
    assert got_values.dtype == np_dtype and got_values.shape == dims
    np.testing.assert_array_equal(got_state, np.asarray(new_key).view(np.uint64))


def test_philox_three_word_state_advances_the_128_bit_counter():
    # Counter (low, high) = (2**64 - 1, 7): two blocks carry into the high word.
    state = np.array([42, 2**64 - 1, 7], np.uint64)
    new_state, values = _run_rbg("rng_philox", state, "u32", (8,))
    np.testing.assert_array_equal(new_state, np.array([42, 1, 8], np.uint64))
    assert values.shape == (8,) and len(set(values.tolist())) == 8


def test_signed_and_float_outputs_are_the_same_bits():
    state = np.array([1, 2], np.uint64)
    _, u = _run_rbg("rng_three_fry", state, "u32", (4,))
    _, s = _run_rbg("rng_three_fry", state, "s32", (4,))
    np.testing.assert_array_equal(u.view(np.int32), s)


def test_rng_uniform_and_normal_are_deterministic_and_in_range():
    b = Builder("t")
    lo = b.constant(np.float32(2.0))
    hi = b.constant(np.float32(3.0))
    u = b.op("rng", lo, hi, shape=array("f32", (1000,)), distribution="rng_uniform")
    ilo = b.constant(np.int32(-3))
    ihi = b.constant(np.int32(4))
    i = b.op("rng", ilo, ihi, shape=array("s32", (1000,)), distribution="rng_uniform")
    mu = b.constant(np.float32(10.0))
    sd = b.constant(np.float32(0.5))
    n = b.op("rng", mu, sd, shape=array("f32", (4000,)), distribution="rng_normal")
    m = b.module(root=b.op("tuple", u, i, n, shape=tuple_shape(u.shape, i.shape, n.shape)))
    uv, iv, nv = hlo.evaluate(m, [], rng_state=7)
    assert uv.dtype == np.float32 and (uv >= 2).all() and (uv < 3).all()
    assert iv.min() == -3 and iv.max() == 3
    assert abs(nv.mean() - 10) < 0.05 and abs(nv.std() - 0.5) < 0.05
    again = hlo.evaluate(m, [], rng_state=7)
    np.testing.assert_array_equal(again[0], uv)
    other = hlo.evaluate(m, [], rng_state=8)
    assert not np.array_equal(other[0], uv)
