"""Data movement rules against jax.jit on the CPU (XLA), with gather/scatter in depth."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import hlo
from hlo import Builder, PadDim, PaddingConfig, SliceDim, SliceSpec, array
from hlo import dtypes as dt
from hlo.evaluator import TOKEN

GDN = lax.GatherDimensionNumbers
SDN = lax.ScatterDimensionNumbers
NATIVE = lax.GatherScatterMode.PROMISE_IN_BOUNDS   # what XLA itself does out of bounds


def _shape_of(a) -> hlo.Shape:
    a = np.asarray(a)
    return array(dt.from_numpy(a.dtype), a.shape)


def run_op(opcode, *args, shape, called=(), **attrs):
    b = Builder("t")
    params = [b.parameter(_shape_of(a)) for a in args]
    root = b.op(opcode, *params, shape=shape, **attrs)
    out = hlo.evaluate(b.module(root=root, called=called), [np.asarray(a) for a in args])
    if not shape.is_tuple:   # rules return exactly the declared element type and dims
        assert out.shape == shape.dims and out.dtype == shape.dtype.np_dtype, (out.shape, out.dtype)
    return out


def xla(fn, *args):
    return np.asarray(jax.jit(fn)(*args))


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def test_broadcast_reshape_transpose_reverse():
    v = np.array([1, 2, 3], np.int32)
    got = run_op("broadcast", v, shape=array("s32", (2, 3, 4)), dimensions=(1,))
    np.testing.assert_array_equal(got, xla(lambda a: lax.broadcast_in_dim(a, (2, 3, 4), (1,)), v))
    m = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = run_op("broadcast", m, shape=array("s32", (3, 4, 2)), dimensions=(2, 0))
    np.testing.assert_array_equal(got, xla(lambda a: lax.broadcast_in_dim(a, (3, 4, 2), (2, 0)), m))
    np.testing.assert_array_equal(run_op("reshape", X, shape=array("f32", (4, 6))), X.reshape(4, 6))
    np.testing.assert_array_equal(run_op("bitcast", X, shape=array("f32", (6, 4))), X.reshape(6, 4))
    np.testing.assert_array_equal(
        run_op("transpose", X, shape=array("f32", (4, 2, 3)), dimensions=(2, 0, 1)),
        xla(lambda a: lax.transpose(a, (2, 0, 1)), X))
    np.testing.assert_array_equal(run_op("reverse", X, shape=_shape_of(X), dimensions=(0, 2)),
                                  xla(lambda a: lax.rev(a, (0, 2)), X))


def test_bitcast_with_layouts_reinterprets_the_buffer():
    # f32[2,3]{0,1} holds its elements column-major; bitcast to f32[3,2]{1,0} reads that
    # buffer row-major, which is the transpose.
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = Builder("t")
    p = b.parameter(array("f32", (2, 3), (0, 1)))
    root = b.op("bitcast", p, shape=array("f32", (3, 2), (1, 0)))
    np.testing.assert_array_equal(hlo.evaluate(b.module(root=root), [m]), m.T)


def test_slice_concatenate_iota():
    spec = SliceSpec((SliceDim(0, 2), SliceDim(1, 3), SliceDim(0, 4, 3)))
    np.testing.assert_array_equal(run_op("slice", X, shape=array("f32", (2, 2, 2)), slice=spec),
                                  xla(lambda a: lax.slice(a, (0, 1, 0), (2, 3, 4), (1, 1, 3)), X))
    a = np.ones((2, 2), np.int8)
    c = np.zeros((2, 3), np.int8)
    np.testing.assert_array_equal(run_op("concatenate", a, c, shape=array("s8", (2, 5)),
                                         dimensions=(1,)), np.concatenate([a, c], 1))
    b = Builder("t")
    root = b.op("iota", shape=array("bf16", (2, 3)), iota_dimension=1)
    got = hlo.evaluate(b.module(root=root), [])
    np.testing.assert_array_equal(got.astype(np.float32), [[0, 1, 2], [0, 1, 2]])
    assert got.dtype == dt.BF16.np_dtype


@pytest.mark.parametrize("cfg", [[(1, 2, 0), (0, 0, 1)], [(-1, 1, 1), (2, -3, 0)],
                                 [(0, 0, 2), (-2, -2, 1)], [(-3, 3, 0), (1, 1, 3)]])
def test_pad_negative_and_interior(cfg):
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    pv = np.float32(-1)
    want = xla(lambda a, v: lax.pad(a, v, cfg), m, pv)
    got = run_op("pad", m, pv, shape=array("f32", want.shape),
                 padding=PaddingConfig(tuple(PadDim(*c) for c in cfg)))
    np.testing.assert_array_equal(got, want)


def test_dynamic_slice_and_update_clamp_start_indices():
    m = np.arange(20, dtype=np.int32).reshape(4, 5)
    # jax.lax.dynamic_slice wraps negative indices Python-style before XLA sees them, so
    # the comparison with XLA uses non-negative starts; negative ones are checked by hand.
    for starts in [(1, 2), (3, 4), (10, 0), (0, 70)]:
        s = [np.int32(i) for i in starts]
        want = xla(lambda a, i, j: lax.dynamic_slice(a, (i, j), (2, 3)), m, *s)
        got = run_op("dynamic-slice", m, *s, shape=array("s32", (2, 3)),
                     dynamic_slice_sizes=(2, 3))
        np.testing.assert_array_equal(got, want)
        u = np.full((2, 2), -1, np.int32)
        want = xla(lambda a, up, i, j: lax.dynamic_update_slice(a, up, (i, j)), m, u, *s)
        got = run_op("dynamic-update-slice", m, u, *s, shape=array("s32", (4, 5)))
        np.testing.assert_array_equal(got, want)
    s = [np.int32(-2), np.int32(-7)]   # spec: clamp into [0, dim - size]
    got = run_op("dynamic-slice", m, *s, shape=array("s32", (2, 3)), dynamic_slice_sizes=(2, 3))
    np.testing.assert_array_equal(got, m[0:2, 0:3])
    got = run_op("dynamic-update-slice", m, np.zeros((1, 2), np.int32), np.int32(9), s[1],
                 shape=array("s32", (4, 5)))
    want = m.copy()
    want[3, 0:2] = 0
    np.testing.assert_array_equal(got, want)


def test_tuple_gte_tokens_and_identities():
    b = Builder("t")
    p = b.parameter(array("f32", (2,)))
    q = b.parameter(array("s32", ()))
    t = b.op("tuple", p, q, shape=hlo.tuple_shape(p.shape, q.shape))
    g = b.op("get-tuple-element", t, shape=q.shape, index=1)
    tok = b.op("after-all", shape=hlo.token())
    dep = b.op("add-dependency", g, tok, shape=q.shape)
    bar = b.op("optimization-barrier", t, shape=t.shape)
    cs = b.op("copy-start", p, shape=hlo.tuple_shape(p.shape, p.shape, array("u32", ())))
    cd = b.op("copy-done", cs, shape=p.shape)
    size = b.op("get-dimension-size", p, shape=array("s32", ()), dimensions=(0,))
    root = b.op("tuple", dep, bar, cd, size, tok,
                shape=hlo.tuple_shape(q.shape, t.shape, p.shape, size.shape, tok.shape))
    out = hlo.evaluate(b.module(root=root), [np.array([1, 2], np.float32), np.int32(7)])
    assert int(out[0]) == 7
    np.testing.assert_array_equal(out[1][0], [1, 2])
    np.testing.assert_array_equal(out[2], [1, 2])
    assert int(out[3]) == 2 and out[3].dtype == np.int32
    assert out[4] is TOKEN


# --- gather ------------------------------------------------------------------------------------
def _gather_attrs(d: GDN, slice_sizes, ivd):
    return dict(offset_dims=d.offset_dims, collapsed_slice_dims=d.collapsed_slice_dims,
                start_index_map=d.start_index_map, operand_batching_dims=d.operand_batching_dims,
                start_indices_batching_dims=d.start_indices_batching_dims,
                index_vector_dim=ivd, slice_sizes=tuple(slice_sizes), indices_are_sorted=False)


def _check_gather(operand, indices, d: GDN, slice_sizes, ivd=None):
    """jax.lax.gather always puts the index vector last; ``ivd`` tests another placement by
    moving that axis in the HLO's indices and back in jax's."""
    want = xla(lambda o, i: lax.gather(o, i, d, tuple(slice_sizes), mode=NATIVE), operand, indices)
    hlo_indices = indices if ivd is None else np.moveaxis(indices, -1, ivd)
    got = run_op("gather", operand, hlo_indices, shape=_shape_of(want),
                 **_gather_attrs(d, slice_sizes, indices.ndim - 1 if ivd is None else ivd))
    np.testing.assert_array_equal(got, want)
    return got


def test_gather_rows_like_take():
    op = np.arange(15, dtype=np.float32).reshape(5, 3)
    idx = np.array([[4], [0], [2], [9]], np.int32)   # 9 clamps to the last row
    got = _check_gather(op, idx, GDN(offset_dims=(1,), collapsed_slice_dims=(0,),
                                     start_index_map=(0,)), (1, 3))
    np.testing.assert_array_equal(got, op[[4, 0, 2, 4]])


def test_gather_2d_windows_with_clamping():
    op = np.arange(42, dtype=np.int32).reshape(6, 7)
    idx = np.array([[[0, 0], [5, 6]], [[-3, 2], [2, 100]]], np.int32)
    _check_gather(op, idx, GDN(offset_dims=(2, 3), collapsed_slice_dims=(), start_index_map=(0, 1)),
                  (2, 3))
    # Reversed start_index_map and one collapsed dim.
    _check_gather(op, idx, GDN(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1, 0)),
                  (3, 1))


def test_gather_index_vector_dim_first():
    op = np.arange(42, dtype=np.int32).reshape(6, 7)
    idx = np.array([[1, 2], [3, 4], [5, 0]], np.int32)
    _check_gather(op, idx, GDN(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0, 1)),
                  (1, 2), ivd=0)


def test_gather_offset_dims_interleaved():
    op = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    idx = np.array([[[1], [2]], [[0], [3]]], np.int32)
    _check_gather(op, idx, GDN(offset_dims=(0, 3), collapsed_slice_dims=(1,), start_index_map=(1,)),
                  (2, 1, 3))


def test_gather_batching_dims():
    op = np.arange(60, dtype=np.float32).reshape(3, 5, 4)
    idx = np.array([[[1], [4]], [[0], [2]], [[3], [3]]], np.int32)   # (3, 2, 1)
    got = _check_gather(op, idx, GDN(offset_dims=(2,), collapsed_slice_dims=(1,),
                                     start_index_map=(1,), operand_batching_dims=(0,),
                                     start_indices_batching_dims=(0,)), (1, 1, 4))
    np.testing.assert_array_equal(got[2, 0], op[2, 3])


def test_gather_scalar_result_batch():
    op = np.arange(5, dtype=np.int32)
    idx = np.array([3, 1], np.int32)   # index_vector_dim == rank: each index is a scalar
    b = Builder("t")
    p = b.parameter(_shape_of(op))
    i = b.parameter(_shape_of(idx))
    root = b.op("gather", p, i, shape=array("s32", (2,)),
                **_gather_attrs(GDN((), (0,), (0,)), (1,), 1))
    np.testing.assert_array_equal(hlo.evaluate(b.module(root=root), [op, idx]), [3, 1])


# --- scatter -------------------------------------------------------------------------------------
def _combiner(opcode: str, dtype: str = "f32"):
    sb = Builder(f"combine_{opcode}")
    a = sb.parameter(array(dtype, ()))
    c = sb.parameter(array(dtype, ()))
    if opcode == "replace":
        return sb.build(c)
    return sb.build(sb.op(opcode, a, c, shape=array(dtype, ())))


def _scatter_attrs(d: SDN, ivd: int, comp):
    return dict(update_window_dims=d.update_window_dims,
                inserted_window_dims=d.inserted_window_dims,
                scatter_dims_to_operand_dims=d.scatter_dims_to_operand_dims,
                input_batching_dims=d.operand_batching_dims,
                scatter_indices_batching_dims=d.scatter_indices_batching_dims,
                index_vector_dim=ivd, indices_are_sorted=False, unique_indices=False,
                to_apply=comp)


def _check_scatter(jax_fn, opcode, operand, indices, updates, d: SDN, dtype="f32"):
    want = xla(lambda o, i, u: jax_fn(o, i, u, d, mode=NATIVE), operand, indices, updates)
    comp = _combiner(opcode, dtype)
    got = run_op("scatter", operand, indices, updates, shape=_shape_of(operand), called=(comp,),
                 **_scatter_attrs(d, indices.ndim - 1, comp))
    np.testing.assert_array_equal(got, want)
    return got


ROWS = SDN(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))


def test_scatter_add_duplicates_accumulate():
    op = np.zeros((5, 3), np.float32)
    idx = np.array([[1], [3], [1], [0]], np.int32)
    upd = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = _check_scatter(lax.scatter_add, "add", op, idx, upd, ROWS)
    np.testing.assert_array_equal(got[1], upd[0] + upd[2])


def test_scatter_general_combiners_in_index_order():
    op = np.full((5, 3), 2, np.float32)
    idx = np.array([[1], [3], [1], [0]], np.int32)
    upd = np.arange(12, dtype=np.float32).reshape(4, 3) - 4
    _check_scatter(lax.scatter_max, "maximum", op, idx, upd, ROWS)
    _check_scatter(lax.scatter_min, "minimum", op, idx, upd, ROWS)
    _check_scatter(lax.scatter_mul, "multiply", op, idx, upd, ROWS)
    # Overwrite with duplicates: the update applied last (in index order) wins.
    got = _check_scatter(lax.scatter, "replace", op, idx, upd, ROWS)
    np.testing.assert_array_equal(got[1], upd[2])


def test_scatter_out_of_bounds_windows_are_dropped():
    op = np.zeros((4, 6), np.int32)
    d = SDN(update_window_dims=(1, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=(0, 1))
    idx = np.array([[0, 0], [2, 5], [-1, 0], [3, 3], [1, 2]], np.int32)   # 2..4 leave the operand
    upd = np.ones((5, 2, 2), np.int32) * np.arange(1, 6, dtype=np.int32)[:, None, None]
    got = _check_scatter(lax.scatter_add, "add", op, idx, upd, d, dtype="s32")
    assert got.sum() == 4 * (1 + 5)


def test_scatter_batching_dims():
    op = np.zeros((3, 5, 2), np.float32)
    idx = np.array([[[1], [4]], [[0], [0]], [[2], [3]]], np.int32)   # (3, 2, 1)
    upd = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    d = SDN(update_window_dims=(2,), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(1,),
            operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))
    got = _check_scatter(lax.scatter_add, "add", op, idx, upd, d)
    np.testing.assert_array_equal(got[1, 0], upd[1, 0] + upd[1, 1])


def test_scatter_index_vector_dim_first_and_bf16_general_path():
    op = np.zeros((4, 3), dt.BF16.np_dtype)
    idx_last = np.array([[0, 1], [3, 2], [0, 1]], np.int32)
    upd = np.array([0.1, 0.2, 0.3], dt.BF16.np_dtype)
    d = SDN(update_window_dims=(), inserted_window_dims=(0, 1), scatter_dims_to_operand_dims=(0, 1))
    want = xla(lambda o, i, u: lax.scatter_add(o, i, u, d, mode=NATIVE), op, idx_last, upd)
    comp = _combiner("add", "bf16")
    idx_first = np.ascontiguousarray(idx_last.T)
    got = run_op("scatter", op, idx_first, upd, shape=_shape_of(op), called=(comp,),
                 **_scatter_attrs(d, 0, comp))
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_variadic_scatter_combines_pairs():
    # Two operands updated together; the combiner keeps the (value, index) pair with the
    # larger value -- an argmax-style scatter.
    sb = Builder("argmax")
    v0, i0 = sb.parameter(array("f32", ())), sb.parameter(array("s32", ()))
    v1, i1 = sb.parameter(array("f32", ())), sb.parameter(array("s32", ()))
    gt = sb.op("compare", v1, v0, shape=array("pred", ()), direction="GT")
    v = sb.op("select", gt, v1, v0, shape=array("f32", ()))
    i = sb.op("select", gt, i1, i0, shape=array("s32", ()))
    comp = sb.build(sb.op("tuple", v, i, shape=hlo.tuple_shape(v.shape, i.shape)))
    ops = [np.full(3, -np.inf, np.float32), np.full(3, -1, np.int32)]
    idx = np.array([[0], [2], [0], [0]], np.int32)
    upd = [np.array([1, 5, 7, 3], np.float32), np.array([10, 11, 12, 13], np.int32)]
    d = SDN((), (0,), (0,))
    b = Builder("t")
    ps = [b.parameter(_shape_of(a)) for a in ops + [idx] + upd]
    root = b.op("scatter", *ps, shape=hlo.tuple_shape(ps[0].shape, ps[1].shape),
                **_scatter_attrs(d, 1, comp))
    vals, where = hlo.evaluate(b.module(root=root, called=(comp,)), ops + [idx] + upd)
    np.testing.assert_array_equal(vals, [7, -np.inf, 5])
    np.testing.assert_array_equal(where, [12, -1, 11])


def test_jax_indexing_programs_match_jax():
    import jax.numpy as jnp

    def f(x, idx, upd):
        g = x[idx]                                   # gather
        s = x.at[idx].add(upd)                       # scatter-add with a duplicate
        t = jnp.pad(x, ((1, 0), (0, 2)))[::2]        # pad + strided slice
        return g, s, t, jnp.flip(x, 1).T

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([3, 0, 3], np.int32)
    upd = np.ones((3, 3), np.float32)
    m = hlo.from_jax(f, x, idx, upd)
    got = hlo.evaluate(m, [x, idx, upd])
    want = jax.jit(f)(x, idx, upd)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, np.asarray(w))
