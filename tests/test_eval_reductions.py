"""reduce, reduce-window, select-and-scatter, sort, topk, batch-norm vs jax.jit on the CPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hlo
from hlo import Builder, Window, WindowDim
from hlo.evaluator import evaluate
from hlo.shape import array, scalar, tuple_shape

RNG = np.random.default_rng(0)


def binary_comp(opcode: str, dtype: str) -> hlo.Computation:
    b = Builder(f"{opcode}_{dtype}")
    p0 = b.parameter(scalar(dtype))
    p1 = b.parameter(scalar(dtype))
    b.op(opcode, p0, p1, shape=scalar(dtype))
    return b.build()


def run_reduce(x: np.ndarray, init, opcode: str, dims, dtype: str) -> np.ndarray:
    comp = binary_comp(opcode, dtype)
    b = Builder("main")
    p = b.parameter(array(dtype, x.shape))
    i = b.parameter(scalar(dtype))
    out_dims = [s for d, s in enumerate(x.shape) if d not in dims]
    b.reduce(p, i, dimensions=tuple(dims), to_apply=comp, shape=array(dtype, out_dims))
    return evaluate(b.module(called=(comp,)), [x, np.asarray(init)])


# --- reduce -----------------------------------------------------------------------------
@pytest.mark.parametrize("dims", [(0,), (1,), (2,), (0, 2), (0, 1, 2)])
def test_reduce_sum_f32_several_axes(dims):
    x = RNG.standard_normal((5, 6, 7)).astype(np.float32)
    got = run_reduce(x, 0.0, "add", dims, "f32")
    want = jax.jit(lambda a: lax.reduce(a, np.float32(0), lax.add, dims))(x)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_reduce_row_and_column_max_with_nan_and_init():
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    x[2, 3] = np.nan
    rows = run_reduce(x, -np.inf, "maximum", (1,), "f32")
    cols = run_reduce(x, 5.0, "maximum", (0,), "f32")
    np.testing.assert_array_equal(rows, jax.jit(lambda a: jnp.max(a, axis=1))(x))
    assert np.isnan(rows[2]) and np.isnan(cols[3])
    assert (np.delete(cols, 3) == 5.0).all()        # init value participates


def test_reduce_int_sum_wraps_and_u8_product():
    x = np.full((3, 1000), 3_000_000, np.int32)
    # init 0: XLA:CPU folds a non-identity init into each vector lane (it assumes init is
    # the reducer's identity), so only an identity init has one well-defined answer.
    got = run_reduce(x, 0, "add", (1,), "s32")
    want = jax.jit(lambda a: lax.reduce(a, np.int32(0), lax.add, (1,)))(x)
    np.testing.assert_array_equal(got, want)       # wrapped modulo 2**32
    assert got[0] == np.int32(np.int64(3_000_000 * 1000).astype(np.int32))
    assert run_reduce(x, 7, "add", (1,), "s32")[0] == got[0] + 7   # the spec's init semantics
    u = np.arange(1, 13, dtype=np.uint8).reshape(3, 4)
    np.testing.assert_array_equal(run_reduce(u, 1, "multiply", (1,), "u8"),
                                  jax.jit(lambda a: lax.reduce(a, np.uint8(1), lax.mul, (1,)))(u))


def test_reduce_bf16_sum_accumulates_wide():
    x = (RNG.random((64, 256)) + 1).astype(ml_dtypes.bfloat16)
    got = run_reduce(x, 0, "add", (1,), "bf16")
    want = jax.jit(lambda a: lax.reduce(a, np.array(0, a.dtype), lax.add, (1,)))(x)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), np.asarray(want, np.float32), rtol=2e-2)


def test_reduce_pred_and_or():
    x = RNG.random((4, 5)) > 0.3
    np.testing.assert_array_equal(run_reduce(x, True, "and", (1,), "pred"), x.all(1))
    np.testing.assert_array_equal(run_reduce(x, False, "or", (0,), "pred"), x.any(0))


def test_reduce_empty_gives_init():
    x = np.zeros((3, 0), np.float32)
    np.testing.assert_array_equal(run_reduce(x, 2.5, "add", (1,), "f32"), [2.5, 2.5, 2.5])


def argmax_comp() -> hlo.Computation:
    """jax's argmax reducer: (value, index) pairs, NaN wins, ties to the lower index."""
    b = Builder("argmax")
    v0, i0 = b.parameter(scalar("f32")), b.parameter(scalar("s32"))
    v1, i1 = b.parameter(scalar("f32")), b.parameter(scalar("s32"))
    pred = scalar("pred")
    gt = b.compare(v0, v1, direction="GT", shape=pred)
    nan = b.compare(v0, v0, direction="NE", shape=pred)
    take0 = b.op("or", gt, nan, shape=pred)
    v = b.select(take0, v0, v1, shape=scalar("f32"))
    eq = b.compare(v0, v1, direction="EQ", shape=pred)
    lt = b.compare(i0, i1, direction="LT", shape=pred)
    tie = b.op("and", eq, lt, shape=pred)
    take0i = b.op("or", take0, tie, shape=pred)
    i = b.select(take0i, i0, i1, shape=scalar("s32"))
    b.tuple(v, i, shape=tuple_shape(scalar("f32"), scalar("s32")))
    return b.build()


@pytest.mark.parametrize("axis", [0, 1])
def test_variadic_argmax_reduce(axis):
    x = RNG.integers(0, 5, (7, 13)).astype(np.float32)      # many ties
    x[3, 4] = np.nan
    comp = argmax_comp()
    b = Builder("main")
    p = b.parameter(array("f32", x.shape))
    iota = b.parameter(array("s32", x.shape))
    vi, ii = b.parameter(scalar("f32")), b.parameter(scalar("s32"))
    n = x.shape[1 - axis]
    r = b.reduce(p, iota, vi, ii, dimensions=(axis,), to_apply=comp,
                 shape=tuple_shape(array("f32", (n,)), array("s32", (n,))))
    idx = np.broadcast_to(np.arange(x.shape[axis]).reshape([-1, 1] if axis == 0 else [1, -1]),
                          x.shape).astype(np.int32)
    vals, inds = evaluate(b.module(root=r, called=(comp,)), [x, idx, -np.inf, 0])
    want = jax.jit(lambda a: jnp.argmax(a, axis=axis))(x)
    np.testing.assert_array_equal(inds, want)
    np.testing.assert_array_equal(vals, jax.jit(lambda a: jnp.max(a, axis=axis))(x))


# --- reduce-window ----------------------------------------------------------------------
def run_reduce_window(x, init, opcode, wdims, dtype="f32"):
    comp = binary_comp(opcode, dtype)
    b = Builder("main")
    p = b.parameter(array(dtype, x.shape))
    i = b.parameter(scalar(dtype))
    window = Window(tuple(wdims))
    out = []
    for s, d in zip(x.shape, wdims):
        padded = (s - 1) * d.base_dilation + 1 + d.padding_low + d.padding_high
        span = (d.size - 1) * d.window_dilation + 1
        out.append((padded - span) // d.stride + 1)
    b.reduce_window(p, i, window=window, to_apply=comp, shape=array(dtype, out))
    return evaluate(b.module(called=(comp,)), [x, np.asarray(init)])


def test_max_pool_with_padding_nhwc():
    x = RNG.standard_normal((2, 9, 9, 3)).astype(np.float32)
    w = [WindowDim(1), WindowDim(3, 2, 1, 1), WindowDim(3, 2, 1, 1), WindowDim(1)]
    got = run_reduce_window(x, -np.inf, "maximum", w)
    want = jax.jit(lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                                               [(0, 0), (1, 1), (1, 1), (0, 0)]))(x)
    np.testing.assert_array_equal(got, want)


def test_avg_pool_sum_with_base_and_window_dilation():
    x = RNG.standard_normal((1, 2, 8, 7)).astype(np.float32)
    w = [WindowDim(1), WindowDim(1), WindowDim(2, 1, 2, 1, window_dilation=2, base_dilation=2),
         WindowDim(3, 2, 0, 2, window_dilation=1, base_dilation=1)]
    got = run_reduce_window(x, 0.0, "add", w)
    want = jax.jit(lambda a: lax.reduce_window(
        a, 0.0, lax.add, (1, 1, 2, 3), (1, 1, 1, 2), [(0, 0), (0, 0), (2, 1), (0, 2)],
        base_dilation=(1, 1, 2, 1), window_dilation=(1, 1, 2, 1)))(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_reduce_window_general_reducer_matches_fast_path():
    # A reducer wrapped in a tuple-free but non-trivial body goes through the array path.
    b = Builder("max_via_select")
    p0, p1 = b.parameter(scalar("f32")), b.parameter(scalar("f32"))
    gt = b.compare(p0, p1, direction="GT", shape=scalar("pred"))
    b.select(gt, p0, p1, shape=scalar("f32"))
    comp = b.build()
    x = RNG.standard_normal((6, 7)).astype(np.float32)
    mb = Builder("main")
    p = mb.parameter(array("f32", x.shape))
    i = mb.parameter(scalar("f32"))
    w = Window((WindowDim(2, 1, 0, 1), WindowDim(3, 2, 1, 1)))
    mb.reduce_window(p, i, window=w, to_apply=comp, shape=array("f32", (6, 4)))
    got = evaluate(mb.module(called=(comp,)), [x, np.float32(-np.inf)])
    want = jax.jit(lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (2, 3), (1, 2),
                                               [(0, 1), (1, 1)]))(x)
    np.testing.assert_array_equal(got, want)


# --- select-and-scatter: the gradient of max-pool ----------------------------------------
def test_select_and_scatter_is_maxpool_gradient():
    x = RNG.integers(0, 4, (2, 6, 6, 2)).astype(np.float32)   # ties: first max is chosen
    dims = (1, 3, 3, 1)
    strides = (1, 2, 2, 1)
    pads = [(0, 0), (1, 1), (1, 1), (0, 0)]

    def pool(a):
        return lax.reduce_window(a, -jnp.inf, lax.max, dims, strides, pads)
    y, vjp = jax.vjp(pool, x)
    g = RNG.standard_normal(y.shape).astype(np.float32)
    want = jax.jit(lambda g: vjp(g)[0])(g)

    ge = Builder("ge")
    a0, a1 = ge.parameter(scalar("f32")), ge.parameter(scalar("f32"))
    ge.compare(a0, a1, direction="GE", shape=scalar("pred"))
    sel = ge.build()
    add = binary_comp("add", "f32")
    b = Builder("main")
    px = b.parameter(array("f32", x.shape))
    pg = b.parameter(array("f32", y.shape))
    zero = b.parameter(scalar("f32"))
    w = Window(tuple(WindowDim(d, s, lo, hi) for d, s, (lo, hi) in zip(dims, strides, pads)))
    b.select_and_scatter(px, pg, zero, window=w, select=sel, scatter=add,
                         shape=array("f32", x.shape))
    got = evaluate(b.module(called=(sel, add)), [x, g, np.float32(0)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# --- sort and topk ------------------------------------------------------------------------
def lt_comp(dtypes, direction="LT", ctype="TOTALORDER", key=0):
    b = Builder("cmp")
    ps = []
    for d in dtypes:
        ps += [b.parameter(scalar(d)), b.parameter(scalar(d))]
    kw = {"type": ctype} if ctype else {}
    b.compare(ps[2 * key], ps[2 * key + 1], direction=direction, shape=scalar("pred"), **kw)
    return b.build()


def run_sort(arrays, dtypes, dim, comp, is_stable=True):
    b = Builder("main")
    ps = [b.parameter(array(d, a.shape)) for a, d in zip(arrays, dtypes)]
    shape = (tuple_shape(*[array(d, a.shape) for a, d in zip(arrays, dtypes)])
             if len(arrays) > 1 else array(dtypes[0], arrays[0].shape))
    b.sort(*ps, dimensions=(dim,), is_stable=is_stable, to_apply=comp, shape=shape)
    return evaluate(b.module(called=(comp,)), list(arrays))


def jnp_sort_comp() -> hlo.Computation:
    """The comparator jnp.sort emits: -0 -> +0 and any NaN -> +NaN, then TOTALORDER LT."""
    b = Builder("jnp_lt")
    nan = b.constant(np.float32(np.nan))
    zero = b.constant(np.float32(0))
    canon = []
    for _ in range(2):
        p = b.parameter(scalar("f32"))
        ne = b.compare(p, p, direction="NE", shape=scalar("pred"))
        eq = b.compare(p, zero, direction="EQ", shape=scalar("pred"))
        s = b.select(eq, zero, p, shape=scalar("f32"))
        canon.append(b.select(ne, nan, s, shape=scalar("f32")))
    b.compare(*canon, direction="LT", type="TOTALORDER", shape=scalar("pred"))
    return b.build()


def test_sort_floats_with_nans_and_signed_zeros_like_jnp_sort():
    x = np.array([[3, np.nan, -0.0, 0.0, -np.inf, 1, -np.nan, 2, np.inf, -1]] * 2, np.float32)
    got = run_sort([x], ["f32"], 1, jnp_sort_comp())
    want = jax.jit(lambda a: jnp.sort(a, axis=1))(x)
    np.testing.assert_array_equal(got, want)        # NaNs last, as jax canonicalises
    assert np.isnan(got[0, -2:]).all()


def test_sort_total_order_places_negative_nan_first():
    x = np.array([1.0, -np.nan, 0.0, -0.0, np.nan], np.float32)
    x[1] = -np.abs(np.float32(np.nan))
    got = run_sort([x], ["f32"], 0, lt_comp(["f32"]))
    assert np.isnan(got[0]) and np.signbit(got[0])
    assert np.signbit(got[1]) and got[1] == 0 and not np.signbit(got[2])
    assert got[3] == 1.0 and np.isnan(got[4])


def test_multi_operand_stable_sort_descending_along_axis0():
    keys = RNG.integers(0, 3, (12, 4)).astype(np.int32)
    vals = np.arange(48, dtype=np.float32).reshape(12, 4)
    k, v = run_sort([keys, vals], ["s32", "f32"], 0, lt_comp(["s32", "f32"], "GT", None))
    wk, wv = jax.jit(lambda a, b: lax.sort((-a, b), dimension=0, num_keys=1))(keys, vals)
    np.testing.assert_array_equal(k, -wk)
    np.testing.assert_array_equal(v, wv)            # ties keep the original order


def test_sort_general_comparator_two_keys_bitonic():
    # Lexicographic comparator on (a, b): goes through the vectorised sorting network.
    b = Builder("lex")
    a0, a1, b0, b1 = [b.parameter(scalar("s32")) for _ in range(4)]
    pred = scalar("pred")
    lt_a = b.compare(a0, a1, direction="LT", shape=pred)
    eq_a = b.compare(a0, a1, direction="EQ", shape=pred)
    lt_b = b.compare(b0, b1, direction="LT", shape=pred)
    b.op("or", lt_a, b.op("and", eq_a, lt_b, shape=pred), shape=pred)
    comp = b.build()
    x = RNG.integers(0, 3, (3, 11)).astype(np.int32)
    y = RNG.integers(0, 3, (3, 11)).astype(np.int32)
    gx, gy = run_sort([x, y], ["s32", "s32"], 1, comp)
    wx, wy = jax.jit(lambda a, c: lax.sort((a, c), dimension=1, num_keys=2))(x, y)
    np.testing.assert_array_equal(gx, wx)
    np.testing.assert_array_equal(gy, wy)


def test_topk_ties_and_nan():
    x = np.array([[1, 3, 3, np.nan, 2, 3], [0, -1, 5, 5, -np.inf, 4]], np.float32)
    b = Builder("main")
    p = b.parameter(array("f32", x.shape))
    b.topk(p, k=4, largest=True, shape=tuple_shape(array("f32", (2, 4)), array("s32", (2, 4))))
    vals, idx = evaluate(b.module(), [x])
    wv, wi = jax.jit(lambda a: lax.top_k(a, 4))(x)
    np.testing.assert_array_equal(idx, wi)
    np.testing.assert_array_equal(vals, wv)
    assert idx.dtype == np.int32


# --- batch norm ---------------------------------------------------------------------------
def test_batch_norm_training_inference_grad():
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    scale = RNG.standard_normal(3).astype(np.float32)
    offset = RNG.standard_normal(3).astype(np.float32)
    eps = 1e-3
    v3 = array("f32", (3,))
    b = Builder("main")
    px, ps, po = b.parameter(array("f32", x.shape)), b.parameter(v3), b.parameter(v3)
    b.batch_norm_training(px, ps, po, epsilon=eps, feature_index=1,
                          shape=tuple_shape(array("f32", x.shape), v3, v3))
    y, mean, var = evaluate(b.module(), [x, scale, offset])
    m = x.mean(axis=(0, 2))
    v = x.var(axis=(0, 2))
    np.testing.assert_allclose(mean, m, rtol=1e-5)
    np.testing.assert_allclose(var, v, rtol=1e-5)
    ref = (x - m[None, :, None]) / np.sqrt(v[None, :, None] + eps) * scale[None, :, None] \
        + offset[None, :, None]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)

    b = Builder("inf")
    ins = [b.parameter(array("f32", x.shape))] + [b.parameter(v3) for _ in range(4)]
    b.batch_norm_inference(*ins, epsilon=eps, feature_index=1, shape=array("f32", x.shape))
    y2 = evaluate(b.module(), [x, scale, offset, m, v])
    np.testing.assert_allclose(y2, ref, rtol=1e-5, atol=1e-5)

    # grad: compare with jax autodiff of the training-mode formula.
    def f(x, s, o):
        mu = x.mean(axis=(0, 2), keepdims=True)
        var = ((x - mu) ** 2).mean(axis=(0, 2), keepdims=True)
        return (x - mu) / jnp.sqrt(var + eps) * s[None, :, None] + o[None, :, None]
    dy = RNG.standard_normal(x.shape).astype(np.float32)
    _, vjp = jax.vjp(f, x, scale, offset)
    wx, ws, wo = vjp(dy)
    b = Builder("grad")
    ins = [b.parameter(array("f32", x.shape)), b.parameter(v3), b.parameter(v3), b.parameter(v3),
           b.parameter(array("f32", x.shape))]
    b.batch_norm_grad(*ins, epsilon=eps, feature_index=1,
                      shape=tuple_shape(array("f32", x.shape), v3, v3))
    gx, gs, go = evaluate(b.module(), [x, scale, m, v, dy])
    np.testing.assert_allclose(gx, wx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gs, ws, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(go, wo, rtol=1e-4, atol=1e-4)


def test_reduce_s4_sum_wraps_in_four_bits():
    x = np.array([[7, 7], [-8, -1]], ml_dtypes.int4)
    got = run_reduce(x, 0, "add", (1,), "s4")
    assert got.dtype == ml_dtypes.int4
    assert got.astype(np.int8).tolist() == [-2, 7]      # 14 -> -2, -9 -> 7 modulo 16


def test_reduce_window_skips_padding_as_xla_does():
    # An init value that is not the reducer's identity shows whether padding is reduced in:
    # XLA visits only window elements on the operand (jax.jit gives 4 = 1 + 1 + 2 for the
    # first window [pad, 1, 2]); the StableHLO spec pads with the init value (5).
    x = np.arange(1, 7, dtype=np.float32)
    f = lambda v: lax.reduce_window(v, 1.0, lax.add, (3,), (1,), ((1, 1),))  # noqa: E731
    m = hlo.from_jax(f, x)
    np.testing.assert_array_equal(hlo.evaluate(m, [x]), [4, 7, 10, 13, 16, 12])
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), [4, 7, 10, 13, 16, 12])
    np.testing.assert_array_equal(hlo.evaluate(m, [x], numerics="spec"), [5, 7, 10, 13, 16, 13])
    # Base-dilation holes are skipped too.
    g = lambda v: lax.reduce_window(v, 1.0, lax.add, (3,), (1,), ((0, 0),),  # noqa: E731
                                    base_dilation=(2,))
    mg = hlo.from_jax(g, x)
    np.testing.assert_array_equal(hlo.evaluate(mg, [x]), np.asarray(jax.jit(g)(x)))
