"""``split-reductions``: a reduction to a few values runs as a row reduction + a small one
(passes/split_reductions.py). HLO shapes after the pass, results equal to jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo
import runtime
from passes import run_pipeline
from passes.pipelines import PIPELINES

SMALL = "inline,fixpoint(simplify,cse,dce),split-reductions{min_reduced=1024,row=64}"


def _reduces(m: hlo.Module) -> list:
    return [(tuple(i.operands[0].shape.dims), tuple(i.attrs["dimensions"]))
            for i in m.entry.instructions if i.opcode == "reduce"]


def _run(fn, *args, spec=SMALL):
    m = hlo.from_jax(fn, *args)
    run_pipeline(m, spec, verify=True)
    got = hlo.evaluate(m, list(args))
    return m, got[0] if isinstance(got, (list, tuple)) else got


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_full_sum_becomes_rows_then_partials():
    x = _x(4, 32, 128)
    m, got = _run(lambda x: jnp.sum(x * x), x)
    assert _reduces(m) == [((4, 32, 128), (2,)), ((4, 32), (0, 1))]
    np.testing.assert_allclose(got, jax.jit(lambda x: jnp.sum(x * x))(x), rtol=1e-5)


def test_one_dim_sum_is_cut_by_a_reshape():
    x = _x(8192)
    m, got = _run(jnp.sum, x)
    # rows of 4 x row (256) elements, 32 of them
    assert _reduces(m) == [((32, 256), (1,)), ((32,), (0,))]
    np.testing.assert_allclose(got, np.sum(x.astype(np.float64)), rtol=1e-5)


def test_max_with_minus_infinity_init_and_a_kept_dim():
    x = _x(2, 64, 64, seed=1)
    f = lambda x: jnp.max(x, axis=(1, 2))  # noqa: E731
    m, got = _run(f, x)
    assert _reduces(m) == [((2, 64, 64), (2,)), ((2, 64), (1,))]
    np.testing.assert_array_equal(got, f(x))


@pytest.mark.parametrize("name", ["column", "non_neutral_init", "few_elements"])
def test_left_alone(name):
    x = _x(4096, 8) if name == "column" else _x(64, 64) if name != "few_elements" else _x(16, 16)
    if name == "column":          # the minor dim is kept: a column reduction
        f = lambda x: jnp.sum(x, axis=0)  # noqa: E731
    elif name == "non_neutral_init":   # init 1.0 added once, not twice
        f = lambda x: jax.lax.reduce(x, np.float32(1.0), jax.lax.add, (0, 1))  # noqa: E731
    else:                         # 256 elements: below min_reduced
        f = jnp.sum
    m, got = _run(f, x)
    assert len(_reduces(m)) == 1
    np.testing.assert_allclose(got, f(x), rtol=1e-5)


def test_mse_loss_and_gradient_through_the_cuda_pipeline():
    """The training step's loss (mean of squared differences over 131072 elements, with its
    gradient) through the CUDA pipeline deviceless: split, fused, equal to jax.jit."""
    def f(out, y):
        loss, g = jax.value_and_grad(lambda o: jnp.mean((o.astype(jnp.float32) - y) ** 2))(out)
        return loss, g
    out = _x(4, 128, 256).astype(jnp.bfloat16)
    y = _x(4, 128, 256, seed=3)
    jf = runtime.jit(f, target="h200", pipeline=PIPELINES["default"]["cuda"])
    c = jf.lower(out, y).compile()
    text = c.as_text()
    assert "reduce_rows" in text and "reduce_partials" in text, text
    got = jf(out, y)
    want = jax.jit(f)(out, y)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32),
                               rtol=1e-2, atol=1e-6)
