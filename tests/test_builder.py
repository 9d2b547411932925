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


REMOVE = """HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  a = f32[4] negate(p)
  b = f32[4] exponential(a)
  c = f32[4] add(p, p)
  d = f32[4] sine(c)
  ROOT r = f32[4] abs(p), control-predecessors={b, d}
}
"""


def test_remove_instructions_is_remove_instruction_for_each():
    """The batch removal (fusion's materialize, issue 13) leaves the computation as one
    remove_instruction per instruction in the same order does: operands' users, control
    predecessors, the names the module holds, the instruction order."""
    one, many = hlo.parse_hlo(REMOVE), hlo.parse_hlo(REMOVE)
    for name in ("d", "b", "c", "a"):
        one.entry.remove_instruction(one.entry.get(name))
    gone = [many.entry.get(n) for n in ("d", "b", "c", "a")]
    many.entry.remove_instructions(gone)
    assert many.to_text() == one.to_text()
    assert [i.name for i in many.entry.instructions] == ["p", "r"]
    assert many.entry.get("p").users == [many.entry.root]
    assert all(i.parent is None for i in gone)
    assert many.unique_name("b") == "b"            # the name is free again
    hlo.verify(many)


def test_unique_name_takes_the_first_free_number_after_removals():
    """``unique_name`` starts its search where the last one for the base ended, and a
    removed name is the first free one again (the fusion pass names thousands of
    "fusion"s; issue 13)."""
    m = hlo.parse_hlo(REMOVE)
    assert [m.unique_name("x") for _ in range(4)] == ["x", "x.1", "x.2", "x.3"]
    m._names.add("x.5")                               # taken some other way
    assert [m.unique_name("x") for _ in range(2)] == ["x.4", "x.6"]
    m._discard_name("x.2")
    assert m.unique_name("x") == "x.2"
    assert m.unique_name("x") == "x.7"
    c = m.entry.add_instruction(hlo.Instruction("sine", [m.entry.get("c")],
                                                m.entry.get("c").shape, name="c"))
    assert c.name == "c.1"
    m.entry.remove_instruction(c)
    assert m.unique_name("c") == "c.1"                # freed by the removal
    fresh = hlo.parse_hlo(REMOVE)                     # a module of its own
    assert fresh.unique_name("x") == "x"


def test_replace_operands_is_replace_operand_with_for_each():
    """The batch replacement (fusion's materialize) leaves operands and users lists as one
    ``replace_operand_with`` per replaced operand, in operand order, does."""
    text = """HloModule m

ENTRY e {
  p = f32[4] parameter(0)
  a = f32[4] exponential(p)
  b = f32[4] sine(p)
  c = f32[4] cosine(p)
  ROOT t = (f32[4], f32[4], f32[4], f32[4], f32[4]) tuple(a, b, a, c, p)
}
"""
    def run(batch: bool) -> list:
        m = hlo.parse_hlo(text)
        e = m.entry
        a, b, c, p, t = (e.get(n) for n in ("a", "b", "c", "p", "t"))
        na = e.add_instruction(hlo.Instruction("negate", [p], p.shape, name="na"))
        nb = e.add_instruction(hlo.Instruction("abs", [p], p.shape, name="nb"))
        new_for = {id(a): na, id(b): nb, id(p): p}        # p "replaced" by itself: kept
        if batch:
            t.replace_operands(new_for)
        else:
            for o in list(t.operands):
                if id(o) in new_for:
                    t.replace_operand_with(o, new_for[id(o)])
        return [[o.name for o in t.operands]] + [[u.name for u in i.users]
                                                  for i in (a, b, c, p, na, nb)]
    assert run(True) == run(False)
    assert run(True)[0] == ["na", "nb", "na", "c", "p"]


def test_remove_instructions_refuses_as_remove_instruction_does():
    m = hlo.parse_hlo(REMOVE)
    d, a = m.entry.get("d"), m.entry.get("a")
    with pytest.raises(hlo.ir.IRError, match="cannot remove %a: still used by %b"):
        m.entry.remove_instructions([d, a])
    # d went before the refusal (as it would have, one at a time); a and the rest stay
    assert [i.name for i in m.entry.instructions] == ["p", "a", "b", "c", "r"]
    assert [c.name for c in m.entry.root.control_predecessors] == ["b"]
    assert m.entry.get("c").users == []
    with pytest.raises(hlo.ir.IRError, match="root"):
        m.entry.remove_instructions([m.entry.root])
    with pytest.raises(hlo.ir.IRError, match="still used by %a, %c, %r"):
        m.entry.remove_instructions([m.entry.get("p")])
    unused = hlo.parse_hlo(REMOVE.replace("e {\n", "e {\n  q = f32[4] parameter(1)\n"))
    with pytest.raises(hlo.ir.IRError, match="cannot remove parameter %q"):
        unused.entry.remove_instructions([unused.entry.get("q")])
