"""Control flow rules: while, conditional, call, fusion, async wrappers, ids."""
from __future__ import annotations

import numpy as np
import pytest

import hlo
from hlo import Builder, array, scalar, tuple_shape

S32 = scalar("s32")
F32V = array("f32", (3,))
PRED = scalar("pred")


def _const(b: Builder, v, dtype="s32"):
    return b.constant(v, dtype)


def _while_module():
    """state (i, acc): while i < n { acc += i * x; i += 1 }; returns acc."""
    state = tuple_shape(S32, F32V, S32)
    cb = Builder("cond")
    p = cb.parameter(state)
    i = cb.op("get-tuple-element", p, shape=S32, index=0)
    n = cb.op("get-tuple-element", p, shape=S32, index=2)
    cond = cb.build(cb.op("compare", i, n, shape=PRED, direction="LT"))

    bb = Builder("body")
    p = bb.parameter(state)
    i = bb.op("get-tuple-element", p, shape=S32, index=0)
    acc = bb.op("get-tuple-element", p, shape=F32V, index=1)
    n = bb.op("get-tuple-element", p, shape=S32, index=2)
    fi = bb.op("convert", i, shape=scalar("f32"))
    step = bb.op("broadcast", fi, shape=F32V, dimensions=())
    new_acc = bb.op("add", acc, step, shape=F32V)
    new_i = bb.op("add", i, _const(bb, 1), shape=S32)
    body = bb.build(bb.op("tuple", new_i, new_acc, n, shape=state))

    b = Builder("main")
    x = b.parameter(F32V)
    n = b.parameter(S32)
    init = b.op("tuple", _const(b, 0), x, n, shape=state)
    loop = b.op("while", init, shape=state, condition=cond, body=body)
    root = b.op("get-tuple-element", loop, shape=F32V, index=1)
    return b.module(root=root, called=(cond, body))


def test_while_with_tuple_state():
    m = _while_module()
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(hlo.evaluate(m, [x, np.int32(5)]), x + 10)   # 0+1+2+3+4
    np.testing.assert_array_equal(hlo.evaluate(m, [x, np.int32(0)]), x)         # never runs


def _branch(name: str, opcode: str, operand_shape=F32V):
    bb = Builder(name)
    p = bb.parameter(operand_shape)
    return bb.build(bb.op(opcode, p, shape=operand_shape))


def test_conditional_pred_form():
    t, f = _branch("on_true", "negate"), _branch("on_false", "abs")
    b = Builder("main")
    pred = b.parameter(PRED)
    x = b.parameter(F32V)
    y = b.parameter(F32V)
    root = b.op("conditional", pred, x, y, shape=F32V, true_computation=t, false_computation=f)
    m = b.module(root=root, called=(t, f))
    x_v = np.array([1, -2, 3], np.float32)
    y_v = np.array([-4, 5, -6], np.float32)
    np.testing.assert_array_equal(hlo.evaluate(m, [np.bool_(True), x_v, y_v]), -x_v)
    np.testing.assert_array_equal(hlo.evaluate(m, [np.bool_(False), x_v, y_v]), np.abs(y_v))


@pytest.mark.parametrize("index,expect", [(0, "negate"), (1, "abs"), (2, "floor"),
                                          (3, "floor"), (-1, "floor"), (100, "floor")])
def test_conditional_branch_index_out_of_range_runs_last(index, expect):
    names = ["negate", "abs", "floor"]
    branches = [_branch(f"b{k}", n) for k, n in enumerate(names)]
    b = Builder("main")
    idx = b.parameter(S32)
    args = [b.parameter(F32V) for _ in branches]
    root = b.op("conditional", idx, *args, shape=F32V, branch_computations=tuple(branches))
    m = b.module(root=root, called=tuple(branches))
    vals = [np.array([-1.5, 2.5, 0.5], np.float32) * (k + 1) for k in range(3)]
    k = names.index(expect)
    want = {"negate": np.negative, "abs": np.abs, "floor": np.floor}[expect](vals[k])
    np.testing.assert_array_equal(hlo.evaluate(m, [np.int32(index)] + vals), want)


def test_call_fusion_and_async():
    sb = Builder("mul_add")
    a = sb.parameter(F32V)
    c = sb.parameter(F32V)
    comp = sb.build(sb.op("add", sb.op("multiply", a, c, shape=F32V), a, shape=F32V))
    b = Builder("main")
    x = b.parameter(F32V)
    y = b.parameter(F32V)
    called = b.op("call", x, y, shape=F32V, to_apply=comp)
    fused = b.op("fusion", called, y, shape=F32V, kind="kLoop", calls=comp)
    start = b.op("async-start", fused, y,
                 shape=tuple_shape(tuple_shape(F32V, F32V), F32V, S32), calls=comp)
    update = b.op("async-update", start, shape=start.shape)
    done = b.op("async-done", update, shape=F32V)
    m = b.module(root=done, called=(comp,))
    xv = np.array([1, 2, 3], np.float32)
    yv = np.array([2, 2, 2], np.float32)
    f = lambda p, q: p * q + p  # noqa: E731
    np.testing.assert_array_equal(hlo.evaluate(m, [xv, yv]), f(f(f(xv, yv), yv), yv))


def test_replica_and_partition_id_come_from_the_context():
    b = Builder("main")
    r = b.op("replica-id", shape=scalar("u32"))
    p = b.op("partition-id", shape=scalar("u32"))
    m = b.module(root=b.op("tuple", r, p, shape=tuple_shape(r.shape, p.shape)))
    rid, pid = hlo.evaluate(m, [], replica_id=3, partition_id=1, num_replicas=4,
                            num_partitions=2)
    assert (int(rid), int(pid)) == (3, 1)
    assert rid.dtype == np.uint32


def test_while_condition_must_be_scalar_pred():
    cb = Builder("cond")
    p = cb.parameter(S32)
    cond = cb.build(p)   # returns s32, not pred
    bb = Builder("body")
    q = bb.parameter(S32)
    body = bb.build(q)
    b = Builder("main")
    x = b.parameter(S32)
    m = b.module(root=b.op("while", x, shape=S32, condition=cond, body=body), called=(cond, body))
    with pytest.raises(hlo.EvaluationError, match="pred"):
        hlo.evaluate(m, [np.int32(1)])


# --- whole programs: HLO text and JAX functions ------------------------------------------------
def test_parsed_hlo_text_while_and_conditional():
    text = """HloModule m

cond {
  cs = (s32[], f32[2]) parameter(0)
  ci = s32[] get-tuple-element(cs), index=0
  cn = s32[] constant(4)
  ROOT lt = pred[] compare(ci, cn), direction=LT
}

body {
  bs = (s32[], f32[2]) parameter(0)
  bi = s32[] get-tuple-element(bs), index=0
  bv = f32[2] get-tuple-element(bs), index=1
  one = s32[] constant(1)
  i1 = s32[] add(bi, one)
  v2 = f32[2] add(bv, bv)
  ROOT bt = (s32[], f32[2]) tuple(i1, v2)
}

neg {
  np = f32[2] parameter(0)
  ROOT nn = f32[2] negate(np)
}

ident {
  ip = f32[2] parameter(0)
  ROOT ic = f32[2] copy(ip)
}

ENTRY e {
  x = f32[2] parameter(0)
  k = s32[] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[2]) tuple(zero, x)
  w = (s32[], f32[2]) while(init), condition=cond, body=body
  r = f32[2] get-tuple-element(w), index=1
  ROOT c = f32[2] conditional(k, r, r), branch_computations={neg, ident}
}
"""
    m = hlo.parse_hlo(text)
    x = np.array([1, -2], np.float32)
    np.testing.assert_array_equal(hlo.evaluate(m, [x, np.int32(0)]), -16 * x)
    np.testing.assert_array_equal(hlo.evaluate(m, [x, np.int32(1)]), 16 * x)
    np.testing.assert_array_equal(hlo.evaluate(m, [x, np.int32(9)]), 16 * x)   # last branch


def test_jax_programs_with_control_flow_match_jax():
    jax = pytest.importorskip("jax")
    from jax import lax

    def f(x, i):
        y = lax.fori_loop(0, 3, lambda k, c: c * 2 + x[i], x)
        z = lax.cond(y.sum() > 10, lambda v: v - 1, lambda v: v * 3, y)
        return lax.switch(i, [jax.numpy.sin, jax.numpy.cos, lambda v: v], z)

    x = np.arange(4, dtype=np.float32)
    for i in (0, 1, 2):
        m = hlo.from_jax(f, x, np.int32(i))
        got = hlo.evaluate(m, [x, np.int32(i)])
        np.testing.assert_allclose(got, np.asarray(jax.jit(f)(x, np.int32(i))), rtol=1e-6)
