"""Shape inference: every family checked against a shape worked out by hand and, where
JAX can express the op, against what ``jax.jit(f).lower(...)`` reports."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hlo import (Builder, ConvDimLabels, IotaReplicaGroups, Module, PaddingConfig, PadDim,
                 ReplicaGroups, ShapeError, SliceDim, SliceSpec, Window, WindowDim, array,
                 dtypes, scalar, shape_inference as si, token, tuple_shape)
from hlo.ops import OPS

jax.config.update("jax_enable_x64", False)


def jax_out(f, *specs) -> object:
    """Result shape(s) of ``f`` as lowered by jax.jit, converted to hlotk shapes."""
    info = jax.jit(f).lower(*[jax.ShapeDtypeStruct(s.dims, s.dtype.np_dtype)
                             for s in specs]).out_info

    def conv(o):
        return array(dtypes.from_numpy(o.dtype), o.shape)
    if isinstance(info, (tuple, list)):
        return tuple_shape(*[conv(o) for o in info])
    return conv(info)


def infer(op, *shapes, **attrs):
    return si.infer(op, list(shapes), attrs)


def scalar_comp(name, dtype, op="add", n=1, result=None):
    """A reducer/comparator over ``n`` operands: (acc.., x..) -> acc or pred."""
    b = Builder(name)
    ps = [b.parameter(scalar(dtype)) for _ in range(2 * n)]
    if result == "pred":
        out = b.compare(ps[0], ps[1], direction="LT")
    elif n == 1:
        out = b.op(op, ps[0], ps[1])
    else:
        out = b.tuple(*[b.op(op, ps[i], ps[n + i]) for i in range(n)])
    return b.build(out)


F32_2x3 = array("f32", (2, 3))


def test_every_opcode_has_an_infer_rule():
    assert si.missing_rules() == []
    assert all(OPS[name].infer is not None for name in OPS)


# --- elementwise ------------------------------------------------------------------------
def test_binary_and_compare():
    assert infer("add", F32_2x3, F32_2x3) == F32_2x3
    assert infer("compare", F32_2x3, F32_2x3, direction="LT") == array("pred", (2, 3))
    assert jax_out(lambda a, b: a < b, F32_2x3, F32_2x3) == array("pred", (2, 3))
    with pytest.raises(ShapeError, match=r"add: operands must have the same dimensions.*f32\[2,3\].*f32\[3,2\]"):
        infer("add", F32_2x3, array("f32", (3, 2)))
    with pytest.raises(ShapeError, match="add: .*element type"):
        infer("add", F32_2x3, array("s32", (2, 3)))
    with pytest.raises(ShapeError, match="shift-left: .*integer"):
        infer("shift-left", F32_2x3, F32_2x3)


def test_complex_real_imag_abs_is_finite():
    c = infer("complex", F32_2x3, F32_2x3)
    assert c == array("c64", (2, 3))
    assert jax_out(lax.complex, F32_2x3, F32_2x3) == c
    assert infer("complex", array("f64", (4,)), array("f64", (4,))) == array("c128", (4,))
    assert infer("real", c) == F32_2x3 and infer("imag", c) == F32_2x3
    assert infer("abs", c) == F32_2x3
    assert jax_out(jnp.abs, c) == F32_2x3
    assert infer("is-finite", F32_2x3) == array("pred", (2, 3))
    assert jax_out(lax.is_finite, F32_2x3) == array("pred", (2, 3))
    with pytest.raises(ShapeError, match="complex: operands must be f32 or f64"):
        infer("complex", array("s32", (2,)), array("s32", (2,)))


def test_select_clamp_map():
    p = array("pred", (2, 3))
    assert infer("select", p, F32_2x3, F32_2x3) == F32_2x3
    assert infer("select", scalar("pred"), F32_2x3, F32_2x3) == F32_2x3
    with pytest.raises(ShapeError, match="select: predicate"):
        infer("select", array("pred", (3,)), F32_2x3, F32_2x3)
    assert infer("clamp", scalar("f32"), F32_2x3, scalar("f32")) == F32_2x3
    assert jax_out(lax.clamp, scalar("f32"), F32_2x3, scalar("f32")) == F32_2x3
    to_s32 = Builder("m")
    a, b = to_s32.parameter(scalar("f32")), to_s32.parameter(scalar("f32"))
    cmp = to_s32.build(to_s32.compare(a, b, direction="GT"))
    assert infer("map", F32_2x3, F32_2x3, dimensions=(0, 1), to_apply=cmp) == \
        array("pred", (2, 3))


def test_convert_family_needs_shape_and_checks_result():
    with pytest.raises(si.ShapeRequired, match="convert: .*pass shape="):
        infer("convert", F32_2x3)
    si.check_result("convert", [F32_2x3], {}, array("s8", (2, 3)))
    with pytest.raises(ShapeError, match="convert: result"):
        si.check_result("convert", [F32_2x3], {}, array("s8", (3, 2)))
    # bitcast-convert: f32 -> u8 appends a minor dim of 4; u8[...,4] -> f32 removes it.
    want = jax_out(lambda x: lax.bitcast_convert_type(x, jnp.uint8), F32_2x3)
    assert want == array("u8", (2, 3, 4))
    si.check_result("bitcast-convert", [F32_2x3], {}, want)
    back = jax_out(lambda x: lax.bitcast_convert_type(x, jnp.float32), want)
    assert back == F32_2x3
    si.check_result("bitcast-convert", [want], {}, back)
    si.check_result("bitcast-convert", [F32_2x3], {}, array("s32", (2, 3)))
    with pytest.raises(ShapeError, match=r"result dimensions \[2, 3\] should be \[2, 3, 2\]"):
        si.check_result("bitcast-convert", [F32_2x3], {}, array("bf16", (2, 3)))
    with pytest.raises(ShapeError, match="minor dimension to be 4"):
        si.check_result("bitcast-convert", [array("u8", (2, 3))], {}, array("f32", (2,)))
    assert infer("reduce-precision", F32_2x3, exponent_bits=5, mantissa_bits=10) == F32_2x3
    with pytest.raises(si.ShapeRequired):
        infer("stochastic-convert", F32_2x3, array("u32", (2, 3)))
    with pytest.raises(ShapeError, match="random must be an unsigned integer of 32 bits"):
        infer("stochastic-convert", F32_2x3, array("u16", (2, 3)))


# --- data movement ----------------------------------------------------------------------
def test_broadcast_and_reshape_checks():
    with pytest.raises(si.ShapeRequired, match="broadcast"):
        infer("broadcast", array("f32", (3,)), dimensions=(1,))
    si.check_result("broadcast", [array("f32", (3,))], {"dimensions": (1,)},
                    array("f32", (2, 3)))
    with pytest.raises(ShapeError, match="operand dimension 0 has size 3 but output dimension 0"):
        si.check_result("broadcast", [array("f32", (3,))], {"dimensions": (0,)},
                        array("f32", (2, 3)))
    si.check_result("reshape", [F32_2x3], {}, array("f32", (3, 2)))
    with pytest.raises(ShapeError, match="reshape: operand f32\\[2,3\\] has 6 elements but"):
        si.check_result("reshape", [F32_2x3], {}, array("f32", (7,)))


def test_transpose_reverse_slice():
    x = array("f32", (2, 3, 5))
    t = infer("transpose", x, dimensions=(2, 0, 1))
    assert t == array("f32", (5, 2, 3))
    assert jax_out(lambda a: lax.transpose(a, (2, 0, 1)), x) == t
    with pytest.raises(ShapeError, match="not a permutation"):
        infer("transpose", x, dimensions=(0, 0, 1))
    assert infer("reverse", x, dimensions=(0, 2)) == x
    # ceil((5-1)/2) = 2, ceil((3-0)/1) = 3, ceil((2-0)/3) = 1
    spec = SliceSpec((SliceDim(0, 2, 3), SliceDim(0, 3), SliceDim(1, 5, 2)))
    s = infer("slice", x, slice=spec)
    assert s == array("f32", (1, 3, 2))
    assert jax_out(lambda a: lax.slice(a, (0, 0, 1), (2, 3, 5), (3, 1, 2)), x) == s
    with pytest.raises(ShapeError, match="slice: range \\[0:6\\] in dimension 2"):
        infer("slice", x, slice=SliceSpec((SliceDim(0, 2), SliceDim(0, 3), SliceDim(0, 6))))


def test_dynamic_slice_and_update():
    x = array("f32", (8, 6))
    i = scalar("s32")
    ds = infer("dynamic-slice", x, i, i, dynamic_slice_sizes=(2, 6))
    assert ds == array("f32", (2, 6))
    assert jax_out(lambda a, j: lax.dynamic_slice(a, (j, j), (2, 6)), x, i) == ds
    with pytest.raises(ShapeError, match="expects 2 start indices"):
        infer("dynamic-slice", x, i, dynamic_slice_sizes=(2, 6))
    with pytest.raises(ShapeError, match="slice size 7 in dimension 1"):
        infer("dynamic-slice", x, i, i, dynamic_slice_sizes=(2, 7))
    upd = infer("dynamic-update-slice", x, array("f32", (2, 6)), i, i)
    assert upd == x
    assert jax_out(lambda a, u, j: lax.dynamic_update_slice(a, u, (j, j)), x,
                   array("f32", (2, 6)), i) == upd


def test_concatenate_and_pad():
    c = infer("concatenate", F32_2x3, array("f32", (2, 4)), dimensions=(1,))
    assert c == array("f32", (2, 7))
    assert jax_out(lambda a, b: lax.concatenate([a, b], 1), F32_2x3, array("f32", (2, 4))) == c
    with pytest.raises(ShapeError, match="operand 1 f32\\[3,4\\] does not match"):
        infer("concatenate", F32_2x3, array("f32", (3, 4)), dimensions=(1,))
    # dim0: 1 + 2 + 2 + 1*1 = 6; dim1: -1 + 0 + 3 + 2*2 = 6 (negative low padding).
    cfg = PaddingConfig((PadDim(1, 2, 1), PadDim(-1, 0, 2)))
    p = infer("pad", F32_2x3, scalar("f32"), padding=cfg)
    assert p == array("f32", (6, 6))
    assert jax_out(lambda a, v: lax.pad(a, v, [(1, 2, 1), (-1, 0, 2)]), F32_2x3,
                   scalar("f32")) == p
    with pytest.raises(ShapeError, match="negative size"):
        infer("pad", F32_2x3, scalar("f32"), padding=PaddingConfig((PadDim(-5, 0), PadDim(0, 0))))


def test_gather():
    # x[idx] on f32[5,7] with s32[4,1] indices -> f32[4,7], worked out by hand.
    x, idx = array("f32", (5, 7)), array("s32", (4, 1))
    attrs = dict(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,),
                 index_vector_dim=1, slice_sizes=(1, 7))
    g = infer("gather", x, idx, **attrs)
    assert g == array("f32", (4, 7))
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                    start_index_map=(0,))
    assert jax_out(lambda a, i: lax.gather(a, i, dn, (1, 7)), x, idx) == g
    # Offset dim in the middle, window 3 kept, implicit index vector dim (= rank).
    x3, idx2 = array("f32", (6, 4, 9)), array("s32", (2, 5))
    attrs2 = dict(offset_dims=(1, 2), collapsed_slice_dims=(0,), start_index_map=(0,),
                  index_vector_dim=2, slice_sizes=(1, 4, 3))
    g2 = infer("gather", x3, idx2, **attrs2)
    assert g2 == array("f32", (2, 4, 3, 5))
    dn2 = lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(0,),
                                     start_index_map=(0,))
    # jax always puts the index vector last; an explicit trailing 1 is the same thing.
    assert jax_out(lambda a, i: lax.gather(a, i[..., None], dn2, (1, 4, 3)), x3, idx2) == g2
    # Batching dims: operand dim 0 pairs with indices dim 0.
    xb, ib = array("f32", (3, 10, 4)), array("s32", (3, 2, 1))
    attrs3 = dict(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1,),
                  operand_batching_dims=(0,), start_indices_batching_dims=(0,),
                  index_vector_dim=2, slice_sizes=(1, 1, 4))
    g3 = infer("gather", xb, ib, **attrs3)
    assert g3 == array("f32", (3, 2, 4))
    dn3 = lax.GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(1,),
                                     start_index_map=(1,), operand_batching_dims=(0,),
                                     start_indices_batching_dims=(0,))
    assert jax_out(lambda a, i: lax.gather(a, i, dn3, (1, 1, 4)), xb, ib) == g3
    with pytest.raises(ShapeError, match="gather: collapsed_slice_dims entry 0 needs slice size 1"):
        infer("gather", x, idx, **dict(attrs, slice_sizes=(2, 7)))


def test_scatter():
    add = scalar_comp("add", "f32")
    x, idx, upd = array("f32", (5, 7)), array("s32", (4, 1)), array("f32", (4, 7))
    attrs = dict(update_window_dims=(1,), inserted_window_dims=(0,),
                 scatter_dims_to_operand_dims=(0,), index_vector_dim=1, to_apply=add)
    assert infer("scatter", x, idx, upd, **attrs) == x
    dn = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                     scatter_dims_to_operand_dims=(0,))
    assert jax_out(lambda a, i, u: lax.scatter_add(a, i, u, dn), x, idx, upd) == x
    with pytest.raises(ShapeError, match="update 0 scatter dims \\[3\\] must equal"):
        infer("scatter", x, idx, array("f32", (3, 7)), **attrs)
    with pytest.raises(ShapeError, match="window dim 1 has size 8"):
        infer("scatter", x, idx, array("f32", (4, 8)), **attrs)
    # Variadic: two inputs -> tuple; reducer over pairs.
    add2 = scalar_comp("add2", "f32", n=2)
    t = infer("scatter", x, x, idx, upd, upd, **dict(attrs, to_apply=add2))
    assert t == tuple_shape(x, x)
    with pytest.raises(ShapeError, match="to_apply computation %add must take 4 parameters"):
        infer("scatter", x, x, idx, upd, upd, **attrs)


def test_tuple_gte_and_misc():
    t = infer("tuple", F32_2x3, scalar("s32"))
    assert t == tuple_shape(F32_2x3, scalar("s32"))
    assert infer("get-tuple-element", t, index=1) == scalar("s32")
    with pytest.raises(ShapeError, match="index 2 is out of range for a tuple of 2"):
        infer("get-tuple-element", t, index=2)
    assert infer("get-dimension-size", F32_2x3, dimensions=(1,)) == scalar("s32")
    assert infer("replica-id") == scalar("u32") and infer("partition-id") == scalar("u32")
    assert infer("after-all", token(), token()) == token()
    assert infer("after-all") == token()
    with pytest.raises(si.ShapeRequired):
        infer("rng", scalar("f32"), scalar("f32"), distribution="rng_uniform")
    assert infer("copy-start", F32_2x3) == tuple_shape(F32_2x3, F32_2x3, scalar("u32"))
    assert infer("send", F32_2x3, token(), channel_id=1) == \
        tuple_shape(F32_2x3, scalar("u32"), token())
    with pytest.raises(si.ShapeRequired):
        infer("custom-call", F32_2x3, custom_call_target="foo")


# --- dot / conv / linear algebra ---------------------------------------------------------
def test_dot_batch_then_free_dims():
    lhs, rhs = array("f32", (7, 2, 3, 4)), array("f32", (7, 4, 5))
    d = infer("dot", lhs, rhs, lhs_batch_dims=(0,), rhs_batch_dims=(0,),
              lhs_contracting_dims=(3,), rhs_contracting_dims=(1,))
    assert d == array("f32", (7, 2, 3, 5))
    dn = (((3,), (1,)), ((0,), (0,)))
    assert jax_out(lambda a, b: lax.dot_general(a, b, dn), lhs, rhs) == d
    with pytest.raises(ShapeError, match="dot: lhs contracting dim 1 has size 4 but rhs "
                                         "contracting dim 0 has size 5"):
        infer("dot", array("f32", (3, 4)), array("f32", (5, 6)),
              lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))


def test_ragged_dot():
    lhs, rhs, gs = array("f32", (11, 5)), array("f32", (3, 5, 6)), array("s32", (3,))
    r = infer("ragged-dot", lhs, rhs, gs, lhs_contracting_dims=(1,), rhs_contracting_dims=(1,),
              lhs_ragged_dims=(0,), rhs_group_dims=(0,))
    assert r == array("f32", (11, 6))
    assert jax_out(lax.ragged_dot, lhs, rhs, gs) == r
    # Ragged contracting dim: a leading group dimension appears.
    r2 = infer("ragged-dot", array("f32", (11, 5)), array("f32", (5, 6)), gs,
               lhs_contracting_dims=(1,), rhs_contracting_dims=(0,), lhs_ragged_dims=(1,))
    assert r2 == array("f32", (3, 11, 6))


def _conv_dn(lhs="b01f", rhs="01io", out="b01f"):
    return ConvDimLabels.parse(f"{lhs}_{rhs}->{out}")


def test_convolution_padding_stride_dilation():
    # NHWC input 2x10x9x6, HWIO kernel 3x2x3x8, feature_group_count 2.
    lhs, rhs = array("f32", (2, 10, 9, 6)), array("f32", (3, 2, 3, 8))
    win = Window((WindowDim(3, stride=2, padding_low=1, padding_high=1, base_dilation=1,
                            window_dilation=2),
                  WindowDim(2, stride=1, padding_low=0, padding_high=1, base_dilation=2)))
    out = infer("convolution", lhs, rhs, window=win, dim_labels=_conv_dn(),
                feature_group_count=2)
    # H: 10+2 = 12 padded, dilated window 5 -> (12-5)//2+1 = 4
    # W: dilated base 17, +1 pad = 18, window 2 -> 17
    assert out == array("f32", (2, 4, 17, 8))
    f = lambda a, b: lax.conv_general_dilated(  # noqa: E731
        a, b, window_strides=(2, 1), padding=[(1, 1), (0, 1)], lhs_dilation=(1, 2),
        rhs_dilation=(2, 1), dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=2)
    assert jax_out(f, lhs, rhs) == out
    with pytest.raises(ShapeError, match="input feature dimension \\(6\\) divided by "
                                         "feature_group_count \\(1\\)"):
        infer("convolution", lhs, rhs, window=win, dim_labels=_conv_dn())


def test_convolution_batch_group_count_and_nchw():
    lhs, rhs = array("f32", (4, 3, 8, 8)), array("f32", (6, 3, 3, 3))
    win = Window((WindowDim(3), WindowDim(3)))
    out = infer("convolution", lhs, rhs, window=win, dim_labels=_conv_dn("bf01", "oi01", "bf01"),
                batch_group_count=2)
    assert out == array("f32", (2, 6, 6, 6))
    f = lambda a, b: lax.conv_general_dilated(  # noqa: E731
        a, b, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"), batch_group_count=2)
    assert jax_out(f, lhs, rhs) == out


def test_fft_family():
    x = array("f32", (3, 4, 8))
    r = infer("fft", x, fft_type="RFFT", fft_length=(4, 8))
    assert r == array("c64", (3, 4, 5))
    assert jax_out(lambda a: jnp.fft.rfftn(a, axes=(1, 2)), x) == r
    ir = infer("fft", r, fft_type="IRFFT", fft_length=(4, 8))
    assert ir == x
    assert jax_out(lambda a: jnp.fft.irfftn(a, s=(4, 8), axes=(1, 2)), r) == ir
    c = array("c64", (3, 16))
    assert infer("fft", c, fft_type="FFT", fft_length=(16,)) == c
    with pytest.raises(ShapeError, match="IRFFT operand's last dims \\[4, 8\\] must be \\[4, 5\\]"):
        infer("fft", array("c64", (3, 4, 8)), fft_type="IRFFT", fft_length=(4, 8))


def test_cholesky_and_triangular_solve():
    a, b = array("f32", (2, 4, 4)), array("f32", (2, 4, 3))
    assert infer("cholesky", a, lower=True) == a
    assert jax_out(lax.linalg.cholesky, a) == a
    ts = infer("triangular-solve", a, b, left_side=True, lower=True, transpose_a="NO_TRANSPOSE")
    assert ts == b
    assert jax_out(lambda x, y: lax.linalg.triangular_solve(x, y, left_side=True, lower=True),
                   a, b) == ts
    with pytest.raises(ShapeError, match="b's columns \\(3\\) must equal a's size \\(4\\)"):
        infer("triangular-solve", a, b, left_side=False)


# --- reductions ---------------------------------------------------------------------------
def test_reduce_single_and_variadic():
    add = scalar_comp("add", "f32")
    x = array("f32", (4, 5, 6))
    r = infer("reduce", x, scalar("f32"), dimensions=(0, 2), to_apply=add)
    assert r == array("f32", (5,))
    assert jax_out(lambda a: jnp.sum(a, axis=(0, 2)), x) == r
    b = Builder("argmax")
    p = [b.parameter(scalar(t)) for t in ("f32", "s32", "f32", "s32")]
    argmax = b.build(b.tuple(b.maximum(p[0], p[2]), b.maximum(p[1], p[3])))
    v = infer("reduce", x, array("s32", (4, 5, 6)), scalar("f32"), scalar("s32"),
              dimensions=(1,), to_apply=argmax)
    assert v == tuple_shape(array("f32", (4, 6)), array("s32", (4, 6)))
    with pytest.raises(ShapeError, match="reduce: to_apply parameter 0 must be s32\\[\\]"):
        infer("reduce", array("s32", (3,)), scalar("s32"), dimensions=(0,), to_apply=add)


def test_reduce_window_and_select_and_scatter():
    mx = scalar_comp("max", "f32", "maximum")
    x = array("f32", (2, 9, 7))
    win = Window((WindowDim(1), WindowDim(3, stride=2, padding_low=1, padding_high=1),
                  WindowDim(2, stride=2, base_dilation=2)))
    r = infer("reduce-window", x, scalar("f32"), window=win, to_apply=mx)
    # dim1: 9+2=11, (11-3)//2+1 = 5; dim2: dilated 13, (13-2)//2+1 = 6
    assert r == array("f32", (2, 5, 6))
    f = lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 3, 2), (1, 2, 2),  # noqa: E731
                                    [(0, 0), (1, 1), (0, 0)], base_dilation=(1, 1, 2))
    assert jax_out(f, x) == r
    ge = scalar_comp("ge", "f32", result="pred")
    add = scalar_comp("add", "f32")
    win2 = Window((WindowDim(1), WindowDim(3, stride=2, padding_low=1, padding_high=1),
                   WindowDim(1)))
    s = infer("select-and-scatter", x, array("f32", (2, 5, 7)), scalar("f32"), window=win2,
              select=ge, scatter=add)
    assert s == x
    with pytest.raises(ShapeError, match="source f32\\[2,4,7\\] must have the windowed"):
        infer("select-and-scatter", x, array("f32", (2, 4, 7)), scalar("f32"), window=win2,
              select=ge, scatter=add)


def test_sort_and_topk():
    lt2 = scalar_comp("lt", "f32", result="pred")
    b = Builder("lt2")
    p = [b.parameter(scalar(t)) for t in ("f32", "f32", "s32", "s32")]
    cmp2 = b.build(b.compare(p[0], p[1], direction="LT"))
    x, i = array("f32", (3, 8)), array("s32", (3, 8))
    assert infer("sort", x, dimensions=(1,), to_apply=lt2) == x
    t = infer("sort", x, i, dimensions=(1,), is_stable=True, to_apply=cmp2)
    assert t == tuple_shape(x, i)
    assert jax_out(lambda a, b: lax.sort((a, b), dimension=1, num_keys=1), x, i) == t
    with pytest.raises(ShapeError, match="comparator %lt must take 4 parameters"):
        infer("sort", x, i, dimensions=(1,), to_apply=lt2)
    k = infer("topk", x, k=3, largest=True)
    assert k == tuple_shape(array("f32", (3, 3)), array("s32", (3, 3)))
    assert jax_out(lambda a: lax.top_k(a, 3), x) == k


def test_batch_norm():
    x, f = array("f32", (2, 5, 4)), array("f32", (5,))
    assert infer("batch-norm-training", x, f, f, epsilon=1e-3, feature_index=1) == \
        tuple_shape(x, f, f)
    assert infer("batch-norm-inference", x, f, f, f, f, epsilon=1e-3, feature_index=1) == x
    assert infer("batch-norm-grad", x, f, f, f, x, epsilon=1e-3, feature_index=1) == \
        tuple_shape(x, f, f)
    with pytest.raises(ShapeError, match="scale must be f32\\[5\\]"):
        infer("batch-norm-training", x, array("f32", (4,)), f, feature_index=1)


# --- control flow -------------------------------------------------------------------------
def _loop():
    state = tuple_shape(scalar("s32"), F32_2x3)
    c = Builder("cond")
    p = c.parameter(state)
    i = c.get_tuple_element(p, index=0)
    cond = c.build(c.compare(i, c.constant(np.int32(10)), direction="LT"))
    b = Builder("body")
    p = b.parameter(state)
    i = b.get_tuple_element(p, index=0)
    v = b.get_tuple_element(p, index=1)
    body = b.build(b.tuple(b.add(i, b.constant(np.int32(1))), b.negate(v)))
    return state, cond, body


def test_while_conditional_call_fusion():
    state, cond, body = _loop()
    assert infer("while", state, condition=cond, body=body) == state
    with pytest.raises(ShapeError, match="while: condition computation %cond parameter 0"):
        infer("while", F32_2x3, condition=cond, body=body)
    neg = Builder("neg")
    p = neg.parameter(F32_2x3)
    neg = neg.build(neg.negate(p))
    ex = Builder("ex")
    p = ex.parameter(F32_2x3)
    ex = ex.build(ex.exponential(p))
    assert infer("conditional", scalar("pred"), F32_2x3, F32_2x3, true_computation=neg,
                 false_computation=ex) == F32_2x3
    assert infer("conditional", scalar("s32"), F32_2x3, F32_2x3,
                 branch_computations=(neg, ex)) == F32_2x3
    assert infer("call", F32_2x3, to_apply=neg) == F32_2x3
    assert infer("fusion", F32_2x3, calls=ex, kind="kLoop") == F32_2x3
    with pytest.raises(ShapeError, match="call: to_apply computation %neg takes 1 parameters"):
        infer("call", F32_2x3, F32_2x3, to_apply=neg)
    assert jax_out(lambda x: lax.cond(x.sum() > 0, jnp.negative, jnp.exp, x), F32_2x3) == F32_2x3


# --- collectives --------------------------------------------------------------------------
def test_collectives_group_sizes():
    add = scalar_comp("add", "f32")
    x = array("f32", (4, 6))
    groups = ReplicaGroups(((0, 1, 2), (3, 4, 5)))
    assert infer("all-gather", x, dimensions=(1,), replica_groups=groups) == array("f32", (4, 18))
    assert infer("all-gather", x, dimensions=(0,), replica_groups=IotaReplicaGroups((2, 4), (8,)),
                 channel_id=1, use_global_device_ids=True) == array("f32", (16, 6))
    assert infer("reduce-scatter", x, dimensions=(1,), replica_groups=groups, to_apply=add) == \
        array("f32", (4, 2))
    with pytest.raises(ShapeError, match="dimension 0 of f32\\[4,6\\] \\(4\\) is not divisible"):
        infer("reduce-scatter", x, dimensions=(0,), replica_groups=groups, to_apply=add)
    # Empty groups: the module's replica count decides; no module -> ask for shape=.
    empty = ReplicaGroups(())
    with pytest.raises(ShapeError, match="all-gather: .*replica/partition counts.*shape="):
        infer("all-gather", x, dimensions=(0,), replica_groups=empty)
    m = Module("m")
    m.config["replica_count"] = 4
    m.config["num_partitions"] = 2
    assert si.infer("all-gather", [x], dict(dimensions=(0,), replica_groups=empty), m) == \
        array("f32", (16, 6))
    # channel_id without global ids: every partition of each listed replica takes part.
    assert si.infer("all-gather", [x], dict(dimensions=(0,), replica_groups=groups,
                                            channel_id=3), m) == array("f32", (24, 6))
    assert infer("all-reduce", x, x, to_apply=add, replica_groups=groups) == tuple_shape(x, x)
    assert infer("all-reduce", x, to_apply=add) == x
    assert infer("all-to-all", x, dimensions=(1,), replica_groups=groups) == x
    assert infer("collective-permute", x, source_target_pairs=((0, 1), (1, 0))) == x
    start = infer("all-gather-start", x, dimensions=(1,), replica_groups=groups)
    assert start == tuple_shape(x, array("f32", (4, 18)))
    assert infer("all-gather-done", start) == array("f32", (4, 18))


def _collective_types(f, in_spec, out_spec, arg, op):
    """(operand dims, result dims) of the one ``op`` in a shard_map lowered on an abstract
    4-device mesh (no devices needed to lower)."""
    import re
    from jax.sharding import AbstractMesh, PartitionSpec as P
    mesh = AbstractMesh((4,), ("x",))
    g = jax.shard_map(f, mesh=mesh, in_specs=P(*in_spec), out_specs=P(*out_spec),
                      check_vma=False)
    text = jax.jit(g).lower(jax.ShapeDtypeStruct(arg, jnp.float32)).as_text()
    lines = text.splitlines()
    start = next(k for k, ln in enumerate(lines) if f"stablehlo.{op}" in ln)
    # The op's type signature ends its line, or the line closing its reducer region.
    line = next(ln for ln in lines[start:] if ") -> tensor<" in ln)
    types = re.findall(r"tensor<([0-9x]+)xf32>", line.rsplit(" : ", 1)[-1])
    return [tuple(int(d) for d in t.split("x")) for t in types]


def test_all_gather_and_reduce_scatter_match_jax_shard_map():
    (src, dst) = _collective_types(lambda a: lax.all_gather(a, "x", axis=1, tiled=True),
                                   (None, "x"), (None, None), (4, 24), "all_gather")
    assert src == (4, 6)
    got = infer("all-gather", array("f32", src), dimensions=(1,), channel_id=1,
                use_global_device_ids=True, replica_groups=ReplicaGroups(((0, 1, 2, 3),)))
    assert got == array("f32", dst) == array("f32", (4, 24))
    add = scalar_comp("add", "f32")
    (src, dst) = _collective_types(
        lambda a: lax.psum_scatter(a, "x", scatter_dimension=0, tiled=True),
        ("x",), ("x",), (32, 3), "reduce_scatter")
    got = infer("reduce-scatter", array("f32", src), dimensions=(0,), channel_id=1,
                use_global_device_ids=True, replica_groups=ReplicaGroups(((0, 1, 2, 3),)),
                to_apply=add)
    assert got == array("f32", dst) == array("f32", (2, 3))
