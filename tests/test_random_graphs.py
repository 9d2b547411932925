"""Property test: random graphs of HLO-level ops, written as JAX functions.

Hypothesis draws a small program (a list of ops over f32/s32/pred values), we build it as a
JAX function from ``jax.lax`` primitives (so each op lowers to one StableHLO op, and
``jax.jit`` gives the expected value), import it with ``hlo.from_jax``, run it with
``hlo.evaluate`` and compare. Inputs include the edge values where semantics differ between
libraries: NaN, +-inf, -0.0, INT_MIN/INT_MAX, zero divisors, out-of-range shift amounts.

A failing example shrinks to a short listing such as::

    v0: f32[2,3] = param  [[nan, 0.0, ...]]
    v1: f32[3] = reduce_max(v0, axes=(0,))
    outputs: v1
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from jax import lax  # noqa: E402

import hlo  # noqa: E402
from tests.zoo import assert_leaf_close  # noqa: E402

F32, S32, PRED = "f32", "s32", "pred"
NP_DTYPE = {F32: np.float32, S32: np.int32, PRED: np.bool_}
INT_MIN, INT_MAX = -2**31, 2**31 - 1
MAX_ELEMS = 48

# Float transcendental ops differ by an ulp or so between XLA:CPU and numpy; chains of a
# few ops keep the difference well inside these tolerances.
RTOL, ATOL = 2e-4, 1e-5

# --- the op vocabulary --------------------------------------------------------------------
# Each entry: name -> jax implementation. Elementwise ops use lax directly so that jnp's
# extra promotion or NaN handling does not hide the op's own HLO semantics.
FLOAT_UNARY = {
    "neg": lax.neg, "abs": lax.abs, "exp": lax.exp, "log": lax.log, "sqrt": lax.sqrt,
    "tanh": lax.tanh, "floor": lax.floor, "ceil": lax.ceil, "sign": lax.sign,
    "round_even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
    "logistic": lax.logistic, "is_finite": lax.is_finite,
    "round_bf16": lambda x: lax.convert_element_type(
        lax.convert_element_type(x, jnp.bfloat16), jnp.float32),
}
INT_UNARY = {"neg": lax.neg, "abs": lax.abs, "not": lax.bitwise_not,
             "popcnt": lax.population_count, "sign": lax.sign}
PRED_UNARY = {"not": lax.bitwise_not}
FLOAT_BINARY = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div,
                "max": lax.max, "min": lax.min, "rem": lax.rem, "pow": lax.pow,
                "atan2": lax.atan2}
INT_BINARY = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "rem": lax.rem,
              "max": lax.max, "min": lax.min, "and": lax.bitwise_and, "or": lax.bitwise_or,
              "xor": lax.bitwise_xor, "shl": lax.shift_left,
              "shr_a": lax.shift_right_arithmetic, "shr_l": lax.shift_right_logical}
PRED_BINARY = {"and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor}
COMPARE = {"eq": lax.eq, "ne": lax.ne, "lt": lax.lt, "le": lax.le, "gt": lax.gt, "ge": lax.ge}
UNARY = {F32: FLOAT_UNARY, S32: INT_UNARY, PRED: PRED_UNARY}
BINARY = {F32: FLOAT_BINARY, S32: INT_BINARY, PRED: PRED_BINARY}
REDUCERS = {  # name -> (computation, init per dtype)
    "sum": (lax.add, {F32: 0.0, S32: 0}),
    "max": (lax.max, {F32: -np.inf, S32: INT_MIN}),
    "min": (lax.min, {F32: np.inf, S32: INT_MAX}),
}


@dataclass(frozen=True)
class Val:
    dtype: str
    dims: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass(frozen=True)
class Op:
    kind: str                 # unary, binary, compare, broadcast, reshape, ...
    name: str                 # the specific op (add, reduce_max, ...)
    args: tuple[int, ...]     # value numbers it reads
    params: tuple = ()        # static parameters (axes, shapes, slice bounds)
    out: Val | None = None


@dataclass
class Program:
    inputs: list[Val]
    input_data: list[np.ndarray]
    ops: list[Op] = field(default_factory=list)
    outputs: tuple[int, ...] = ()

    def listing(self) -> str:
        lines = []
        for i, (v, d) in enumerate(zip(self.inputs, self.input_data)):
            lines.append(f"v{i}: {v} = param  {np.array2string(d, separator=', ', threshold=64)}")
        base = len(self.inputs)
        for j, op in enumerate(self.ops):
            args = ", ".join(f"v{a}" for a in op.args)
            params = f", {op.params}" if op.params else ""
            lines.append(f"v{base + j}: {op.out} = {op.name}({args}{params})")
        lines.append("outputs: " + ", ".join(f"v{o}" for o in self.outputs))
        return "\n".join(lines)

    def __repr__(self) -> str:   # what hypothesis prints for the falsifying example
        return "Program:\n" + self.listing()

    def build(self):
        """The program as a JAX function of its inputs."""
        def fn(*xs):
            vals: list[Any] = list(xs)
            for op in self.ops:
                vals.append(_apply(op, vals))
            return tuple(vals[o] for o in self.outputs)
        return fn


def _apply(op: Op, vals: list) -> Any:
    a = [vals[i] for i in op.args]
    dt = op.out.dtype if op.out else None
    if op.kind == "unary":
        return UNARY[_dtype_of(a[0])][op.name](a[0])
    if op.kind == "binary":
        return BINARY[_dtype_of(a[0])][op.name](a[0], a[1])
    if op.kind == "compare":
        return COMPARE[op.name](a[0], a[1])
    if op.kind == "select":
        return lax.select(a[0], a[1], a[2])
    if op.kind == "convert":
        return lax.convert_element_type(a[0], NP_DTYPE[dt])
    if op.kind == "broadcast":
        shape, bdims = op.params
        return lax.broadcast_in_dim(a[0], shape, bdims)
    if op.kind == "reshape":
        return lax.reshape(a[0], op.params[0])
    if op.kind == "transpose":
        return lax.transpose(a[0], op.params[0])
    if op.kind == "reduce":
        comp, inits = REDUCERS[op.name.removeprefix("reduce_")]
        init = np.array(inits[_dtype_of(a[0])], NP_DTYPE[_dtype_of(a[0])])
        return lax.reduce(a[0], init, comp, op.params[0])
    if op.kind == "slice":
        start, limit, strides = op.params
        return lax.slice(a[0], start, limit, strides)
    if op.kind == "concatenate":
        return lax.concatenate(a, op.params[0])
    raise AssertionError(op.kind)


def _dtype_of(x: Any) -> str:
    return {np.dtype(np.float32): F32, np.dtype(np.int32): S32,
            np.dtype(np.bool_): PRED}[np.dtype(x.dtype)]


# --- strategies ---------------------------------------------------------------------------
FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.nan, np.inf, -np.inf, 1e30, -1e-30, 88.0]
INT_EDGES = [0, 1, -1, 2, -7, 31, 32, 33, -32, INT_MIN, INT_MAX, INT_MIN + 1]

float_elems = st.one_of(st.sampled_from(FLOAT_EDGES),
                        st.floats(-8, 8, width=32, allow_subnormal=False))
int_elems = st.one_of(st.sampled_from(INT_EDGES), st.integers(-40, 40))
pred_elems = st.booleans()
ELEMS = {F32: float_elems, S32: int_elems, PRED: pred_elems}


def _factorizations(n: int, max_rank: int = 3) -> list[tuple[int, ...]]:
    """Every shape of rank <= max_rank (dims >= 1) with n elements."""
    shapes = {(n,)} if n > 0 else set()
    if n == 1:
        shapes.add(())
    for rank in (2, 3)[: max_rank - 1]:
        for dims in itertools.product(range(1, n + 1), repeat=rank):
            if math.prod(dims) == n:
                shapes.add(dims)
    return sorted(shapes)


@st.composite
def shapes(draw) -> tuple[int, ...]:
    rank = draw(st.integers(0, 3))
    return tuple(draw(st.integers(1, 4)) for _ in range(rank))


@st.composite
def programs(draw, max_ops: int = 12) -> Program:
    n_inputs = draw(st.integers(1, 3))
    inputs, data = [], []
    for k in range(n_inputs):
        # Later inputs often repeat the first one's type, so binary ops find partners.
        same = k > 0 and draw(st.booleans())
        dtype = inputs[0].dtype if same else draw(st.sampled_from([F32, F32, S32, PRED]))
        dims = inputs[0].dims if same else draw(shapes())
        size = math.prod(dims)
        elems = draw(st.lists(ELEMS[dtype], min_size=size, max_size=size))
        inputs.append(Val(dtype, dims))
        data.append(np.array(elems, NP_DTYPE[dtype]).reshape(dims))
    prog = Program(inputs, data)
    values: list[Val] = list(inputs)

    n_ops = draw(st.integers(3, max_ops))
    for _ in range(n_ops):
        op = draw(_next_op(values))
        prog.ops.append(op)
        values.append(op.out)
    # Return every op result that no later op reads: nothing is dead, so JAX cannot drop
    # an op before we get to check it.
    used = {a for op in prog.ops for a in op.args}
    prog.outputs = tuple(k for k in range(n_inputs, len(values)) if k not in used)
    return prog


def _partners(values: list[Val], i: int) -> list[int]:
    """Values of the same type as value i, other than i when there are any (x op x hides
    asymmetric bugs such as max(NaN, 1))."""
    same = [j for j, w in enumerate(values) if w == values[i]]
    return [j for j in same if j != i] or same


@st.composite
def _next_op(draw, values: list[Val]) -> Op:
    i = draw(st.integers(0, len(values) - 1))
    v = values[i]
    # Elementwise ops carry most of the edge semantics: they get more weight.
    kinds = ["unary", "unary", "binary", "binary", "binary", "binary", "compare", "convert",
             "reshape", "slice", "concatenate"]
    if len(v.dims) < 3 and math.prod(v.dims) * 3 <= MAX_ELEMS:
        kinds.append("broadcast")
    if len(v.dims) >= 2:
        kinds.append("transpose")
    if v.dtype != PRED and v.dims:
        kinds += ["reduce", "reduce"]
    if v.dtype != PRED:
        preds = [j for j, w in enumerate(values) if w == Val(PRED, v.dims)]
        if preds:
            kinds += ["select", "select"]
    kind = draw(st.sampled_from(kinds))

    if kind == "unary":
        name = draw(st.sampled_from(sorted(UNARY[v.dtype])))
        out = Val(PRED, v.dims) if name == "is_finite" else v
        return Op(kind, name, (i,), (), out)
    if kind in ("binary", "compare"):
        j = draw(st.sampled_from(_partners(values, i)))
        if kind == "compare":
            return Op(kind, draw(st.sampled_from(sorted(COMPARE))), (i, j), (), Val(PRED, v.dims))
        return Op(kind, draw(st.sampled_from(sorted(BINARY[v.dtype]))), (i, j), (), v)
    if kind == "select":
        p = draw(st.sampled_from(preds))
        j = draw(st.sampled_from(_partners(values, i)))
        return Op(kind, "select", (p, i, j), (), v)
    if kind == "convert":
        to = draw(st.sampled_from([d for d in (F32, S32, PRED) if d != v.dtype]))
        return Op(kind, f"convert_{to}", (i,), (), Val(to, v.dims))
    if kind == "broadcast":
        # Insert one new dimension anywhere; size-1 operand dims may also grow.
        pos = draw(st.integers(0, len(v.dims)))
        new = draw(st.integers(1, 3))
        grown = tuple(draw(st.integers(1, 3)) if d == 1 else d for d in v.dims)
        shape = grown[:pos] + (new,) + grown[pos:]
        if math.prod(shape) > MAX_ELEMS:
            shape, grown = v.dims[:pos] + (1,) + v.dims[pos:], v.dims
        bdims = tuple(k if k < pos else k + 1 for k in range(len(v.dims)))
        return Op(kind, "broadcast_in_dim", (i,), (shape, bdims), Val(v.dtype, shape))
    if kind == "reshape":
        shape = draw(st.sampled_from(_factorizations(math.prod(v.dims))))
        return Op(kind, "reshape", (i,), (shape,), Val(v.dtype, shape))
    if kind == "transpose":
        perm = tuple(draw(st.permutations(range(len(v.dims)))))
        return Op(kind, "transpose", (i,), (perm,), Val(v.dtype, tuple(v.dims[p] for p in perm)))
    if kind == "reduce":
        axes = tuple(sorted(draw(st.sets(st.integers(0, len(v.dims) - 1), min_size=1))))
        name = "reduce_" + draw(st.sampled_from(sorted(REDUCERS)))
        out = tuple(d for k, d in enumerate(v.dims) if k not in axes)
        return Op(kind, name, (i,), (axes,), Val(v.dtype, out))
    if kind == "slice":
        start, limit, strides = [], [], []
        for d in v.dims:
            s = draw(st.integers(0, d - 1))
            e = draw(st.integers(s + 1, d))
            start.append(s), limit.append(e), strides.append(draw(st.integers(1, 2)))
        out = tuple(-(-(e - s) // k) for s, e, k in zip(start, limit, strides))
        return Op(kind, "slice", (i,), (tuple(start), tuple(limit), tuple(strides)),
                  Val(v.dtype, out))
    if kind == "concatenate":
        if not v.dims:   # a scalar: nothing to concatenate along, reshape to [1] instead
            return Op("reshape", "reshape", (i,), ((1,),), Val(v.dtype, (1,)))
        axis = draw(st.integers(0, len(v.dims) - 1))
        rest = [j for j, w in enumerate(values) if w.dtype == v.dtype and len(w.dims) == len(
            v.dims) and all(a == b for k, (a, b) in enumerate(zip(w.dims, v.dims)) if k != axis)]
        j = draw(st.sampled_from(rest))
        total = v.dims[axis] + values[j].dims[axis]
        out = v.dims[:axis] + (total,) + v.dims[axis + 1:]
        if math.prod(out) > MAX_ELEMS:
            return Op("unary", UNARY_SAFE[v.dtype], (i,), (), v)
        return Op(kind, "concatenate", (i, j), (axis,), Val(v.dtype, out))
    raise AssertionError(kind)


UNARY_SAFE = {F32: "neg", S32: "neg", PRED: "not"}


# --- the property -------------------------------------------------------------------------
def check_program(prog: Program) -> None:
    fn = prog.build()
    args = [np.asarray(d) for d in prog.input_data]
    # keep_unused: an input that no output reads must still be an entry parameter.
    jitted = jax.jit(fn, keep_unused=True)
    expected = jitted(*args)
    module = hlo.from_jax(jitted, *args)
    got = hlo.evaluate(module, args)
    got_leaves = list(got) if isinstance(got, tuple) else [got]
    assert len(got_leaves) == len(expected), (
        f"{len(got_leaves)} results, expected {len(expected)}\n{prog.listing()}")
    for out_index, g, e in zip(prog.outputs, got_leaves, expected):
        try:
            assert_leaf_close(g, np.asarray(e), RTOL, ATOL, f"v{out_index}")
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- program ---\n{prog.listing()}\n"
                                 f"--- imported module ---\n{module.to_text()}") from None


@settings(max_examples=40, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_random_graph_matches_jax(prog: Program) -> None:
    check_program(prog)


def test_listing_is_readable():
    """The shrunk-example printout names every value with its type and op."""
    prog = Program([Val(F32, (2, 3))], [np.array([[np.nan, 0, 1], [2, 3, 4]], np.float32)])
    prog.ops.append(Op("reduce", "reduce_max", (0,), ((0,),), Val(F32, (3,))))
    prog.outputs = (1,)
    text = prog.listing()
    assert "v0: f32[2,3] = param" in text
    assert "v1: f32[3] = reduce_max(v0, ((0,),))" in text
    assert text.endswith("outputs: v1")


def test_known_edge_program():
    """A hand-written program through the same path: NaN max, int div by zero, INT_MIN / -1."""
    prog = Program(
        [Val(F32, (3,)), Val(F32, (3,)), Val(S32, (4,)), Val(S32, (4,))],
        [np.array([np.nan, 1.0, -0.0], np.float32), np.array([2.0, np.nan, 0.0], np.float32),
         np.array([7, INT_MIN, -7, 5], np.int32), np.array([0, -1, 2, 40], np.int32)])
    prog.ops += [Op("binary", "max", (0, 1), (), Val(F32, (3,))),
                 Op("binary", "div", (2, 3), (), Val(S32, (4,))),
                 Op("binary", "rem", (2, 3), (), Val(S32, (4,))),
                 Op("binary", "shl", (2, 3), (), Val(S32, (4,)))]
    prog.outputs = (4, 5, 6, 7)
    # What XLA does (checked here against jax.jit so the expectations stay honest):
    # max propagates NaN; x / 0 == -1, x % 0 == x, INT_MIN / -1 == INT_MIN,
    # INT_MIN % -1 == 0; a shift by >= 32 gives 0.
    out = jax.jit(prog.build())(*prog.input_data)
    np.testing.assert_array_equal(out[0], np.array([np.nan, np.nan, 0.0], np.float32))
    np.testing.assert_array_equal(out[1], np.array([-1, INT_MIN, -3, 0], np.int32))
    np.testing.assert_array_equal(out[2], np.array([7, 0, -1, 5], np.int32))
    assert out[3][3] == 0
    check_program(prog)


@pytest.mark.parametrize("dtype", [F32, S32, PRED])
def test_every_elementwise_op_on_edge_values(dtype: str):
    """Each unary/binary/compare/convert op of the vocabulary on every pair of edge values.

    Forty random programs cannot promise to hit, say, ``max(NaN, 1)`` or ``INT_MIN / -1``;
    this grid does, through the same import-and-evaluate path as the property test."""
    edges = {F32: FLOAT_EDGES, S32: INT_EDGES, PRED: [False, True]}[dtype]
    a, b = np.meshgrid(np.array(edges, NP_DTYPE[dtype]), np.array(edges, NP_DTYPE[dtype]))
    v = Val(dtype, a.shape)
    prog = Program([v, v], [a, b])
    for name in sorted(UNARY[dtype]):
        prog.ops.append(Op("unary", name, (0,), (), Val(PRED, v.dims) if name == "is_finite" else v))
    for name in sorted(BINARY[dtype]):
        prog.ops.append(Op("binary", name, (0, 1), (), v))
    for name in sorted(COMPARE):
        prog.ops.append(Op("compare", name, (0, 1), (), Val(PRED, v.dims)))
    for to in (F32, S32, PRED):
        if to != dtype:
            prog.ops.append(Op("convert", f"convert_{to}", (0,), (), Val(to, v.dims)))
    if dtype != PRED:
        for name in sorted(REDUCERS):
            prog.ops.append(Op("reduce", f"reduce_{name}", (0,), ((1,),), Val(dtype, v.dims[:1])))
    prog.outputs = tuple(range(2, 2 + len(prog.ops)))
    check_program(prog)
