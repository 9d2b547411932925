"""The Pallas blocked matmul (codegen/library/pallas.py) in Pallas' interpret mode on the CPU,
and target ``tpu`` running a program's dots through it.

Expected values come from numpy in float64 / int64 and from jax.jit (XLA:CPU). Shapes are
small and blocks 32 (or 16) so that interpret mode stays fast and every case has several
blocks per axis; most shapes are deliberately not multiples of the blocks (padding path).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hlo
import runtime
from codegen.library import LIBRARY_CALLS, lookup, target_kind
from codegen.library import pallas
from codegen.library.pallas import blocked_matmul, pallas_dot, supports
from hlo.errors import InvalidArgumentError, UnimplementedError

RNG = np.random.default_rng(7)
B32 = dict(block_m=32, block_n=32, block_k=32)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _s8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


# --- the kernel ------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["tpu", "gpu"])
def test_f32_matches_float64_reference(style):
    a, b = _f32(64, 96), _f32(96, 80)          # N=80: the last column block is padded
    got = blocked_matmul(a, b, style=style, **B32)
    assert got.shape == (64, 80) and got.dtype == jnp.float32
    assert _rel_err(got, a.astype(np.float64) @ b.astype(np.float64)) < 1e-5


def test_bf16_matches_xla_within_bf16_rounding():
    a = jnp.asarray(_f32(64, 96), jnp.bfloat16)
    b = jnp.asarray(_f32(96, 80), jnp.bfloat16)
    got = blocked_matmul(a, b, **B32)
    want = lax.dot_general(a, b, (((1,), (0,)), ((), ())))      # bf16 result, as XLA rounds
    assert got.dtype == jnp.bfloat16
    assert _rel_err(got, want) < 1e-2
    # With an f32 preferred type the kernel's f32 accumulator comes out unrounded.
    got32 = blocked_matmul(a, b, out_dtype=jnp.float32, **B32)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    assert got32.dtype == jnp.float32 and _rel_err(got32, exact) < 1e-5


def test_int8_accumulates_exactly_in_int32():
    a, b = _s8(40, 200), _s8(200, 24)          # K=200: sums reach ~3e6, beyond int16
    got = blocked_matmul(a, b, **B32)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("style", ["tpu", "gpu"])
def test_shapes_not_divisible_by_blocks(style):
    a, b = _f32(50, 70), _f32(70, 45)
    got = blocked_matmul(a, b, style=style, **B32)
    assert got.shape == (50, 45)
    assert _rel_err(got, a.astype(np.float64) @ b) < 1e-5
    # A dim smaller than its block: one block spanning the dim.
    a, b = _f32(5, 7), _f32(7, 3)
    assert _rel_err(blocked_matmul(a, b, **B32), a.astype(np.float64) @ b) < 1e-5


def test_batched_uses_a_leading_grid_axis():
    a, b = _f32(3, 40, 24), _f32(3, 24, 36)
    got = blocked_matmul(a, b, block_m=16, block_n=16, block_k=16)
    assert got.shape == (3, 40, 36)
    assert _rel_err(got, np.matmul(a.astype(np.float64), b)) < 1e-5


def test_empty_contraction_gives_zeros():
    got = blocked_matmul(np.zeros((4, 0), np.float32), np.zeros((0, 5), np.float32))
    np.testing.assert_array_equal(np.asarray(got), np.zeros((4, 5), np.float32))


def test_kernel_errors_name_the_problem():
    with pytest.raises(InvalidArgumentError, match="do not multiply"):
        blocked_matmul(_f32(4, 5), _f32(6, 3))
    with pytest.raises(UnimplementedError, match="float64"):
        blocked_matmul(np.ones((4, 4)), np.ones((4, 4)))
    with pytest.raises(InvalidArgumentError, match="block_k"):
        blocked_matmul(_f32(4, 4), _f32(4, 4), block_k=0)


# --- HLO dot -> kernel -----------------------------------------------------------------------
def _dot_of(fn, *args) -> hlo.Instruction:
    module = hlo.from_jax(fn, *args)
    dots = [i for i in module.entry.instructions if i.opcode == "dot"]
    assert len(dots) == 1
    return dots[0]


def test_hlo_dot_with_transposed_lhs():
    # Contracting dim 0 of the lhs: a^T @ b without a transpose instruction.
    a, b = _f32(48, 40), _f32(48, 36)
    fn = lambda x, y: lax.dot_general(x, y, (((0,), (0,)), ((), ())))  # noqa: E731
    dot = _dot_of(fn, a, b)
    assert dot.attrs["lhs_contracting_dims"] == (0,)
    got = pallas_dot(dot, [a, b], blocks=(16, 16, 16))
    assert got.shape == (40, 36) and got.dtype == np.float32
    assert _rel_err(got, np.asarray(jax.jit(fn)(a, b))) < 1e-5


def test_hlo_dot_with_batch_dims_in_the_middle():
    # lhs [M, B, K], rhs [K, B, N]: batch dim 1 on both sides, contracting 2 and 0.
    a, b = _f32(20, 3, 24), _f32(24, 3, 18)
    fn = lambda x, y: lax.dot_general(x, y, (((2,), (0,)), ((1,), (1,))))  # noqa: E731
    got = pallas_dot(_dot_of(fn, a, b), [a, b], blocks=(16, 16, 16))
    want = np.asarray(jax.jit(fn)(a, b))
    assert got.shape == want.shape == (3, 20, 18)
    assert _rel_err(got, want) < 1e-5


def test_hlo_dot_int8_to_s32_and_unsupported_types():
    a, b = _s8(30, 50), _s8(50, 20)
    fn = lambda x, y: lax.dot(x, y, preferred_element_type=jnp.int32)  # noqa: E731
    dot = _dot_of(fn, a, b)
    got = pallas_dot(dot, [a, b], blocks=(16, 16, 16))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.asarray(jax.jit(fn)(a, b)))

    with jax.enable_x64(True):
        d64 = _dot_of(lambda x, y: x @ y, np.ones((4, 4)), np.ones((4, 4)))
    assert not supports(d64) and lookup("tpu", d64) is None
    with pytest.raises(UnimplementedError, match="f64"):
        pallas_dot(d64, [np.ones((4, 4)), np.ones((4, 4))])


def test_registry_and_target_spec():
    assert LIBRARY_CALLS[("tpu", "dot")] is pallas_dot
    assert target_kind("v5e") == target_kind("TPU-v5e") == "tpu"
    from passes.fusion.cost_model import get_device
    spec = get_device("tpu")
    assert (spec.hbm_bandwidth_gbps, spec.tensor_tflops["bf16"], spec.tensor_tflops["int8"]) \
        == (819, 197, 393)


# --- end to end: runtime.jit(f, target="tpu") -----------------------------------------------
def _mlp(x, w1, b1, w2, b2):
    h = jax.nn.relu(x @ w1 + b1)
    return jnp.tanh(h @ w2 + b2) @ w2.T


def _thunks(compiled) -> str:
    return compiled.executable._body.executable.describe()


def test_mlp_on_target_tpu_runs_its_dots_through_pallas():
    args = [_f32(16, 24), _f32(24, 40), _f32(40), _f32(40, 40), _f32(40)]
    want = np.asarray(jax.jit(_mlp)(*args))
    compiled = runtime.jit(_mlp, target="tpu").lower(*args).compile()
    n_dots = _thunks(compiled).count("pallas_dot")
    assert n_dots == 3          # all three dots, fused (GEMM fusion) or not
    before = pallas.CALLS["dot"]
    got = np.asarray(compiled(*args))
    assert pallas.CALLS["dot"] - before == n_dots
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.max(np.abs(want)))


def test_int8_matmul_on_target_tpu_is_exact():
    f = lambda a, b: lax.dot(a, b, preferred_element_type=jnp.int32) * 2  # noqa: E731
    a, b = _s8(24, 72), _s8(72, 40)
    compiled = runtime.jit(f, target="tpu").lower(a, b).compile()
    assert "pallas_dot" in _thunks(compiled)
    np.testing.assert_array_equal(np.asarray(compiled(a, b)), np.asarray(jax.jit(f)(a, b)))


def test_without_target_tpu_dots_stay_numpy():
    args = [_f32(16, 24), _f32(24, 40), _f32(40), _f32(40, 40), _f32(40)]
    compiled = runtime.jit(_mlp).lower(*args).compile()
    before = pallas.CALLS["dot"]
    got = np.asarray(compiled(*args))
    assert pallas.CALLS["dot"] == before and "pallas_dot" not in _thunks(compiled)
    want = np.asarray(jax.jit(_mlp)(*args))
    # f32 sums of terms up to ~20: an element that cancels to ~0.03 keeps the terms'
    # rounding (1.3e-5 seen with the module's RNG at another test order), so the
    # tolerance is relative to the output's scale.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.max(np.abs(want)))


def test_bf16_dot_on_target_tpu():
    f = lambda a, b: a @ b  # noqa: E731
    a = _f32(32, 48).astype(ml_dtypes.bfloat16)
    b = _f32(48, 40).astype(ml_dtypes.bfloat16)
    compiled = runtime.jit(f, target="tpu").lower(a, b).compile()
    got = np.asarray(compiled(a, b))
    assert got.dtype == ml_dtypes.bfloat16 and "pallas_dot" in _thunks(compiled)
    assert _rel_err(got, np.asarray(jax.jit(f)(a, b))) < 1e-2
