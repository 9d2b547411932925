"""Building a small MLP with the Builder infers the shapes jax.jit gives the same model."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo
from hlo import Builder, ShapeError, array, scalar, tuple_shape


def _add(dtype="f32"):
    b = Builder("add")
    x, y = b.parameter(scalar(dtype)), b.parameter(scalar(dtype))
    return b.build(b.add(x, y))


def build_mlp(batch=8, d_in=16, hidden=32, d_out=4):
    """relu(x @ w1 + b1) @ w2, summed over the output features."""
    add = _add()
    b = Builder("mlp")
    x = b.parameter(array("f32", (batch, d_in)), name="x")
    w1 = b.parameter(array("f32", (d_in, hidden)), name="w1")
    b1 = b.parameter(array("f32", (hidden,)), name="b1")
    w2 = b.parameter(array("f32", (hidden, d_out)), name="w2")
    h = b.dot(x, w1, lhs_contracting_dims=(1,), rhs_contracting_dims=(0,), name="h")
    bias = b.broadcast(b1, dimensions=(1,), shape=array("f32", (batch, hidden)), name="bias")
    hb = b.add(h, bias, name="hb")
    zero = b.constant(np.float32(0), name="zero")
    zeros = b.broadcast(zero, dimensions=(), shape=hb.shape, name="zeros")
    relu = b.maximum(hb, zeros, name="relu")
    y = b.dot(relu, w2, lhs_contracting_dims=(1,), rhs_contracting_dims=(0,), name="y")
    total = b.reduce(y, zero, dimensions=(1,), to_apply=add, name="total")
    return b.module(root=b.tuple(y, total, name="out"), called=(add,), name="mlp")


def test_mlp_shapes_are_inferred():
    m = build_mlp()
    main = m.entry
    assert main.get("h").shape == array("f32", (8, 32))
    assert main.get("hb").shape == array("f32", (8, 32))
    assert main.get("relu").shape == array("f32", (8, 32))
    assert main.get("y").shape == array("f32", (8, 4))
    assert main.get("total").shape == array("f32", (8,))
    assert main.root.shape == tuple_shape(array("f32", (8, 4)), array("f32", (8,)))
    # Inferred shapes carry no layout.
    assert main.get("y").shape.layout is None
    hlo.verify(m)


def test_mlp_matches_jax():
    def mlp(x, w1, b1, w2):
        y = jnp.maximum(x @ w1 + b1, 0.0) @ w2
        return y, y.sum(axis=1)
    specs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in [(8, 16), (16, 32), (32,), (32, 4)]]
    info = jax.jit(mlp).lower(*specs).out_info
    root = build_mlp().entry.root.shape
    assert [e.dims for e in root.elements] == [tuple(o.shape) for o in info]


def test_builder_gte_and_users():
    m = build_mlp()
    main = m.entry
    b = Builder("g")
    t = b.parameter(tuple_shape(array("f32", (2,)), scalar("s32")))
    g = b.get_tuple_element(t, index=1)
    assert g.shape == scalar("s32")
    assert [u.name for u in main.get("relu").users] == ["y"]
    assert [u.name for u in main.get("zero").users] == ["zeros", "total"]


def test_builder_reports_shape_errors_and_needs_shape():
    b = Builder("bad")
    x = b.parameter(array("f32", (8, 16)))
    w = b.parameter(array("f32", (15, 4)))
    with pytest.raises(ShapeError, match="dot: lhs contracting dim 1 has size 16 but rhs "
                                         "contracting dim 0 has size 15"):
        b.dot(x, w, lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    with pytest.raises(ShapeError, match="reshape: .*pass shape="):
        b.reshape(x)
    r = b.reshape(x, shape=array("f32", (128,)))
    assert r.shape == array("f32", (128,))
    with pytest.raises(ShapeError, match="reduce: to_apply computation %add must return"):
        bb = Builder("add")
        p, q = bb.parameter(scalar("f32")), bb.parameter(scalar("f32"))
        bad_add = bb.build(bb.compare(p, q, direction="LT"))
        b.reduce(x, b.constant(np.float32(0)), dimensions=(0,), to_apply=bad_add)
