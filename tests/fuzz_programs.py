"""Hypothesis strategies that build random JAX programs, for differential testing.

A program is a list of Python statements over named values (``v0 = ...``), drawn one at a
time by the generators in ``OPS``, each knowing the dtype and shape of every value so far.
The statements are JAX as a user writes it (``jnp``, ``lax``, ``jax.nn``), so a failing
example prints as a runnable reproducer::

    def program(p0, p1):
        v0 = lax.fori_loop(0, 2, lambda i, c: jnp.tanh(c) * p1, p0)
        v1 = jnp.sort(v0, axis=1)
        return (v1,)

    p0: f32[3,2]  p1: f32[2]

The vocabulary: elementwise chains with broadcasting, reductions (variadic ones too:
argmax), reshapes, transposes, slicing (strided, reversed), concatenation, padding,
dots (batched, integer, complex), select, clamp, cumulative ops, scans, fori/while loops,
cond/switch, sort/argsort/top_k, gather/scatter (every index mode), dynamic slices, nested
``jax.jit`` calls (a computation shared by two call sites), converts, over
f32/bf16/f16/c64/s32/u8/pred values whose dimensions are often 0 or 1.

Inputs are drawn from a seed (numpy), with NaN, +-inf and -0.0 mixed into float inputs and
INT_MIN/INT_MAX into integer ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

FLOATS = ("f32", "bf16", "f16")
COMPLEX = ("c64",)
INTS = ("s32", "u8")
PRED = "pred"
ALL_DTYPES = FLOATS + COMPLEX + INTS + (PRED,)
JNP_DTYPE = {"f32": "jnp.float32", "bf16": "jnp.bfloat16", "f16": "jnp.float16",
             "c64": "jnp.complex64", "s32": "jnp.int32", "u8": "jnp.uint8",
             "pred": "jnp.bool_"}
MAX_ELEMS = 64
MAX_STATEMENTS = 8


def np_dtype(dtype: str) -> np.dtype:
    import ml_dtypes
    return np.dtype({"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16,
                     "c64": np.complex64, "s32": np.int32, "u8": np.uint8,
                     "pred": np.bool_}[dtype])


@dataclass(frozen=True)
class Val:
    name: str
    dtype: str
    dims: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    def describe(self) -> str:
        return f"{self.name}: {self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass
class Program:
    """Parameters, statements and outputs; ``source`` is the JAX function."""
    params: list[Val] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    values: list[Val] = field(default_factory=list)
    outputs: list[Val] = field(default_factory=list)
    seed: int = 0
    special: bool = False     # inputs include NaN/inf/-0.0/INT_MIN...

    @property
    def source(self) -> str:
        lines = [f"def program({', '.join(p.name for p in self.params)}):"]
        lines += [f"    {s}" for s in self.statements]
        lines.append(f"    return ({''.join(o.name + ', ' for o in self.outputs)})")
        return "\n".join(lines)

    def function(self):
        import jax
        import jax.numpy as jnp
        from jax import lax
        namespace = {"jax": jax, "jnp": jnp, "lax": lax, "np": np}
        exec(compile(self.source, "<fuzz program>", "exec"), namespace)
        return namespace["program"]

    def inputs(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed)
        return [random_array(p.dtype, p.dims, rng, self.special) for p in self.params]

    def _repr_pretty_(self, printer, cycle) -> None:   # how hypothesis prints an example
        printer.text(repr(self))

    def __repr__(self) -> str:
        params = "  ".join(p.describe() for p in self.params)
        return (f"\n{self.source}\n\n# {params}\n# inputs: seed={self.seed} "
                f"special={self.special}\n")


def random_array(dtype: str, dims: tuple[int, ...], rng: np.random.Generator,
                 special: bool, specials=(np.nan, np.inf, -np.inf, -0.0)) -> np.ndarray:
    if dtype == PRED:
        return rng.integers(0, 2, dims).astype(bool)
    if dtype in INTS:
        info = np.iinfo(np_dtype(dtype))
        lo, hi = max(info.min, -20), min(info.max, 20)
        out = rng.integers(lo, hi + 1, dims).astype(np_dtype(dtype))
        if special and out.size:
            flat = out.reshape(-1)
            for v in (info.min, info.max, 0):
                flat[rng.integers(0, flat.size)] = v
        return out
    if dtype in COMPLEX:
        # NaN and -0.0 only: where XLA's complex dots meet an infinity, its result depends
        # on which kernel its rewrites chose (std::complex products recover infinities,
        # the multiply+reduce form does not), which no single rule reproduces.
        out = np.empty(dims, np.complex64)
        out.real, out.imag = (random_array("f32", dims, rng, special, (np.nan, -0.0))
                              for _ in range(2))
        return out
    out = (rng.standard_normal(dims) * 2).astype(np.float32)
    if special and out.size:
        flat = out.reshape(-1)
        for v in specials:
            if rng.random() < 0.5:
                flat[rng.integers(0, flat.size)] = v
    return out.astype(np_dtype(dtype))


# --- drawing helpers ----------------------------------------------------------------------
class Builder:
    """The program being drawn: values in scope, fresh names, fresh parameters."""

    def __init__(self, draw):
        self.draw = draw
        self.program = Program()

    def new_param(self, dtype: str, dims: tuple[int, ...]) -> Val:
        v = Val(f"p{len(self.program.params)}", dtype, tuple(dims))
        self.program.params.append(v)
        self.program.values.append(v)
        return v

    def new_value(self, dtype: str, dims: tuple[int, ...]) -> Val:
        v = Val(f"v{sum(1 for x in self.program.values if x.name[0] == 'v')}", dtype,
                tuple(dims))
        self.program.values.append(v)
        return v

    def emit(self, expr: str, dtype: str, dims: tuple[int, ...]) -> Val:
        v = self.new_value(dtype, dims)
        self.program.statements.append(f"{v.name} = {expr}")
        return v

    def pick(self, pred=lambda v: True) -> Val | None:
        cands = [v for v in self.program.values if pred(v)]
        if not cands:
            return None
        # Prefer recent values, so programs are chains rather than independent ops.
        return cands[-1 - self.draw(st.integers(0, min(len(cands), 4) - 1))]

    def operand(self, dtype: str, dims: tuple[int, ...]) -> Val:
        """An existing value of exactly this type, or a new parameter."""
        same = [v for v in self.program.values if v.dtype == dtype and v.dims == tuple(dims)]
        if same and self.draw(st.booleans()):
            return self.draw(st.sampled_from(same))
        return self.new_param(dtype, dims)

    def broadcastable(self, x: Val) -> tuple[Val, tuple[int, ...]]:
        """An operand that broadcasts against ``x`` (numpy rules) and the result dims."""
        kind = self.draw(st.sampled_from(["same", "suffix", "ones", "scalar", "expand"]))
        dims = x.dims
        if kind == "suffix" and dims:
            dims = dims[self.draw(st.integers(0, len(dims))):]
        elif kind == "ones":
            dims = tuple(1 if self.draw(st.booleans()) else d for d in dims)
        elif kind == "scalar":
            dims = ()
        elif kind == "expand" and len(dims) < 4 and math.prod(dims) * 3 <= MAX_ELEMS:
            dims = (self.draw(st.integers(0, 3)),) + dims
            y = self.operand(x.dtype, dims)
            return y, dims
        y = self.operand(x.dtype, dims)
        return y, x.dims


def draw_dims(draw, max_rank: int = 3, max_elems: int = MAX_ELEMS) -> tuple[int, ...]:
    rank = draw(st.integers(0, max_rank))
    dims: list[int] = []
    for _ in range(rank):
        d = draw(st.sampled_from([0, 1, 1, 2, 2, 3, 3, 4, 5]))
        if math.prod(dims) * max(d, 1) > max_elems:
            d = 1
        dims.append(d)
    return tuple(dims)


def is_float(v: Val) -> bool:
    return v.dtype in FLOATS


def is_numeric(v: Val) -> bool:
    return v.dtype != PRED


# --- the op generators --------------------------------------------------------------------
FLOAT_UNARY = ["jnp.sin({})", "jnp.cos({})", "jnp.tanh({})", "jnp.exp({})", "jnp.abs({})",
               "-{}", "jnp.floor({})", "jnp.round({})", "jnp.sign({})", "jax.nn.sigmoid({})",
               "jnp.log1p(jnp.abs({}))", "jnp.sqrt(jnp.abs({}))", "lax.rsqrt({})",
               "jnp.square({})", "jnp.expm1({})", "jnp.log({})", "lax.erf({})",
               "jax.nn.relu({})", "jax.nn.gelu({})", "jnp.reciprocal({})", "jnp.ceil({})",
               "jnp.arctan({})", "jax.nn.softplus({})", "lax.is_finite({})"]
INT_UNARY = ["-{}", "jnp.abs({})", "~{}", "jnp.sign({})", "jnp.square({})",
             "lax.population_count({})", "lax.clz({})"]
COMPLEX_UNARY = ["jnp.conj({})", "-{}", "jnp.exp({})", "jnp.sqrt({})", "{0} * {0}",
                 "jnp.abs({})", "jnp.real({})", "jnp.imag({})", "jnp.tanh({})", "jnp.log({})"]
FLOAT_BINARY = ["{} + {}", "{} - {}", "{} * {}", "{} / {}", "jnp.maximum({}, {})",
                "jnp.minimum({}, {})", "jnp.arctan2({}, {})", "jnp.remainder({}, {})",
                "jnp.power(jnp.abs({}), {})", "jnp.hypot({}, {})", "jnp.fmod({}, {})",
                "jnp.nextafter({}, {})"]   # not copysign: a NaN's sign bit is unspecified
INT_BINARY = ["{} + {}", "{} - {}", "{} * {}", "{} // {}", "{} % {}", "jnp.maximum({}, {})",
              "jnp.minimum({}, {})", "{} & {}", "{} | {}", "{} ^ {}", "{} << {}", "{} >> {}"]
COMPLEX_BINARY = ["{} + {}", "{} - {}", "{} * {}", "{} / {}"]
PRED_BINARY = ["{} & {}", "{} | {}", "{} ^ {}", "{} == {}"]
COMPARE = ["{} == {}", "{} != {}", "{} < {}", "{} <= {}", "{} > {}", "{} >= {}"]


def unary_exprs(dtype: str) -> list[str]:
    if dtype in FLOATS:
        return FLOAT_UNARY
    if dtype in INTS:
        return INT_UNARY
    if dtype in COMPLEX:
        return COMPLEX_UNARY
    return ["~{}"]


def unary_result(expr: str, dtype: str) -> str:
    if dtype in COMPLEX and any(f in expr for f in ("abs", "real", "imag")):
        return "f32"
    if "is_finite" in expr:
        return PRED
    return dtype


def g_unary(b: Builder) -> Val | None:
    x = b.pick()
    expr = b.draw(st.sampled_from(unary_exprs(x.dtype)))
    return b.emit(expr.format(x.name), unary_result(expr, x.dtype), x.dims)


def g_binary(b: Builder) -> Val | None:
    x = b.pick()
    y, dims = b.broadcastable(x)
    if b.draw(st.booleans()):
        x, y = y, x
    if x.dtype != PRED and b.draw(st.integers(0, 4)) == 0:
        return b.emit(b.draw(st.sampled_from(COMPARE if x.dtype not in COMPLEX
                                             else COMPARE[:2])).format(x.name, y.name),
                      PRED, dims)
    table = {**{d: FLOAT_BINARY for d in FLOATS}, **{d: INT_BINARY for d in INTS},
             "c64": COMPLEX_BINARY, PRED: PRED_BINARY}[x.dtype]
    expr = b.draw(st.sampled_from(table))
    return b.emit(expr.format(x.name, y.name), PRED if "==" in expr else x.dtype, dims)


def g_scalar_op(b: Builder) -> Val | None:
    """A Python scalar operand: weakly typed, keeps the array's dtype."""
    # Not complex: XLA's simplifier drops x*1, x+0 ..., which changes non-finite complex
    # values ((inf+nanj)*(1+0j) is nan+nanj), so jax.jit and pipeline="none" differ there.
    x = b.pick(lambda v: is_numeric(v) and v.dtype not in COMPLEX)
    if x is None:
        return None
    if x.dtype in INTS:
        c = b.draw(st.sampled_from([0, 1, 2, 3, 7]))
        ops = ["{} + %d", "{} * %d", "{} - %d", "jnp.minimum({}, %d)"]
    else:
        c = b.draw(st.sampled_from([0.0, 0.5, 1.0, -2.0, 3.0]))
        ops = ["{} + %r", "{} * %r", "{} - %r", "%r - {}", "jnp.maximum({}, %r)"]
    return b.emit((b.draw(st.sampled_from(ops)) % c).format(x.name), x.dtype, x.dims)


def g_convert(b: Builder) -> Val | None:
    x = b.pick()
    to = b.draw(st.sampled_from(ALL_DTYPES))
    if x.dtype in COMPLEX and to not in COMPLEX:
        return b.emit(f"jnp.real({x.name}).astype({JNP_DTYPE[to]})", to, x.dims)
    if x.dtype in FLOATS and to in INTS:
        # Float to integer conversion of NaN/inf/out-of-range values is implementation
        # defined (XLA:CPU follows LLVM's fptosi): keep it in range.
        lo, hi = (0, 255) if to == "u8" else (-1000, 1000)
        return b.emit(f"jnp.clip(jnp.nan_to_num({x.name}), {lo}, {hi}).astype({JNP_DTYPE[to]})",
                      to, x.dims)
    if x.dtype == "s32" and to == "f16":
        return b.emit(f"jnp.clip({x.name}, -60000, 60000).astype(jnp.float16)", to, x.dims)
    return b.emit(f"{x.name}.astype({JNP_DTYPE[to]})", to, x.dims)


def g_bitcast(b: Builder) -> Val | None:
    # Of parameters only: the bits of a computed float expose last-ulp differences.
    x = b.pick(lambda v: v.dtype in ("f32", "s32") and v.name[0] == "p")
    if x is None:
        return None
    to = "s32" if x.dtype == "f32" else "f32"
    if to == "f32":
        return None   # s32 -> f32 bit patterns give NaN payloads that XLA may canonicalize
    return b.emit(f"lax.bitcast_convert_type({x.name}, jnp.int32)", to, x.dims)


def g_reduce(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1)
    if x is None:
        return None
    axes = tuple(a for a in range(len(x.dims)) if b.draw(st.booleans()))
    keep = b.draw(st.booleans())
    dims = tuple((1 if keep else None) if a in axes else d for a, d in enumerate(x.dims))
    dims = tuple(d for d in dims if d is not None)
    if x.dtype == PRED:
        f = b.draw(st.sampled_from(["jnp.any", "jnp.all"]))
        return b.emit(f"{f}({x.name}, axis={axes}, keepdims={keep})", PRED, dims)
    if len(axes) == 1 and x.dims[axes[0]] > 0 and x.dtype not in COMPLEX and \
            b.draw(st.integers(0, 2)) == 0:
        f = b.draw(st.sampled_from(["jnp.argmax", "jnp.argmin"]))
        return b.emit(f"{f}({x.name}, axis={axes[0]}, keepdims={keep})", "s32", dims)
    names = ["jnp.sum", "jnp.prod"] + ([] if x.dtype in COMPLEX else ["jnp.max", "jnp.min"])
    if x.dtype in FLOATS:
        names += ["jnp.mean"]    # not complex: the division by a constant 1 (see g_scalar_op)
    if x.dtype in FLOATS:
        names += ["jax.nn.logsumexp"]
    f = b.draw(st.sampled_from(names))
    if f in ("jnp.max", "jnp.min") and any(x.dims[a] == 0 for a in axes):
        init = {"jnp.max": "-1", "jnp.min": "1"}[f]
        return b.emit(f"{f}({x.name}, axis={axes}, keepdims={keep}, initial={init})",
                      x.dtype, dims)
    if f == "jax.nn.logsumexp" and any(x.dims[a] == 0 for a in axes):
        return None
    # jnp sums u8 in u32 (a dtype this generator does not track): keep u8, wrapping.
    dtype = ", dtype=jnp.uint8" if x.dtype == "u8" and f in ("jnp.sum", "jnp.prod") else ""
    return b.emit(f"{f}({x.name}, axis={axes}, keepdims={keep}{dtype})", x.dtype, dims)


def factorizations(n: int, rank: int) -> list[tuple[int, ...]]:
    if rank == 0:
        return [()] if n == 1 else []
    if n == 0:
        return [tuple(0 if i == k else d for i in range(rank)) for k in range(rank)
                for d in (1, 2)][:4]
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out += [(d,) + rest for rest in factorizations(n // d, rank - 1)]
    return out


def g_reshape(b: Builder) -> Val | None:
    x = b.pick()
    rank = b.draw(st.integers(0, 4))
    shapes = factorizations(x.size, rank)
    if not shapes:
        return None
    dims = b.draw(st.sampled_from(shapes[:16]))
    return b.emit(f"{x.name}.reshape({dims})", x.dtype, dims)


def g_transpose(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 2)
    if x is None:
        return None
    perm = tuple(b.draw(st.permutations(range(len(x.dims)))))
    return b.emit(f"jnp.transpose({x.name}, {perm})", x.dtype,
                  tuple(x.dims[p] for p in perm))


def g_slice(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1)
    if x is None:
        return None
    parts, dims = [], []
    for d in x.dims:
        kind = b.draw(st.sampled_from(["all", "range", "step", "rev", "index"]))
        if kind == "range" and d > 0:
            lo = b.draw(st.integers(0, d))
            hi = b.draw(st.integers(lo, d))
            parts.append(f"{lo}:{hi}")
            dims.append(hi - lo)
        elif kind == "step" and d > 0:
            step = b.draw(st.integers(2, 3))
            lo = b.draw(st.integers(0, d - 1))
            parts.append(f"{lo}::{step}")
            dims.append(len(range(lo, d, step)))
        elif kind == "rev":
            parts.append("::-1")
            dims.append(d)
        elif kind == "index" and d > 0:
            parts.append(str(b.draw(st.integers(-d, d - 1))))
        else:
            parts.append(":")
            dims.append(d)
    return b.emit(f"{x.name}[{', '.join(parts)}]", x.dtype, tuple(dims))


def g_concat(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1)
    if x is None:
        return None
    axis = b.draw(st.integers(0, len(x.dims) - 1))
    extra = b.draw(st.sampled_from([0, 1, 2]))
    ydims = tuple(extra if a == axis else d for a, d in enumerate(x.dims))
    y = b.operand(x.dtype, ydims)
    dims = tuple(d + extra if a == axis else d for a, d in enumerate(x.dims))
    ops = [x.name, y.name] if b.draw(st.booleans()) else [y.name, x.name, x.name]
    if len(ops) == 3:
        dims = tuple(d + x.dims[axis] if a == axis else d for a, d in enumerate(dims))
    return b.emit(f"jnp.concatenate([{', '.join(ops)}], axis={axis})", x.dtype, dims)


def g_pad(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1 and v.dtype != PRED)
    if x is None:
        return None
    config, dims = [], []
    for d in x.dims:
        lo, hi = b.draw(st.integers(-1, 2)), b.draw(st.integers(-1, 2))
        interior = b.draw(st.integers(0, 1)) if d > 1 else 0
        size = d + lo + hi + max(d - 1, 0) * interior
        if size < 0 or (d + max(d - 1, 0) * interior) + min(lo, 0) < 0:
            lo = hi = 0
            size = d + max(d - 1, 0) * interior
        config.append((lo, hi, interior))
        dims.append(size)
    if math.prod(dims) > 4 * MAX_ELEMS:
        return None
    pad_value = "0" if x.dtype in INTS + COMPLEX else "1.5"
    return b.emit(f"lax.pad({x.name}, {JNP_DTYPE[x.dtype]}({pad_value}), {config})",
                  x.dtype, tuple(dims))


def g_broadcast(b: Builder) -> Val | None:
    x = b.pick(lambda v: v.size * 3 <= MAX_ELEMS)
    if x is None:
        return None
    lead = b.draw(st.integers(0, 3))
    dims = ((lead,) if len(x.dims) < 4 else ()) + tuple(
        b.draw(st.integers(0, 3)) if d == 1 else d for d in x.dims)
    return b.emit(f"jnp.broadcast_to({x.name}, {dims})", x.dtype, dims)


def g_dot(b: Builder) -> Val | None:
    x = b.pick(lambda v: 1 <= len(v.dims) <= 3 and v.dtype != PRED and v.dtype != "u8")
    if x is None:
        return None
    k = x.dims[-1]
    kind = b.draw(st.sampled_from(["matmul", "vec", "batched", "einsum"]))
    n = b.draw(st.sampled_from([0, 1, 2, 3, 4]))
    if kind == "vec" or len(x.dims) == 1:
        y = b.operand(x.dtype, (k,))
        return b.emit(f"jnp.matmul({x.name}, {y.name})", x.dtype, x.dims[:-1])
    if kind == "batched" and len(x.dims) == 3:
        y = b.operand(x.dtype, (x.dims[0], k, n))
        return b.emit(f"jnp.matmul({x.name}, {y.name})", x.dtype, x.dims[:2] + (n,))
    if kind == "einsum" and len(x.dims) == 2:
        y = b.operand(x.dtype, (n, x.dims[0]))
        return b.emit(f"jnp.einsum('ij,ki->jk', {x.name}, {y.name})", x.dtype,
                      (x.dims[1], n))
    y = b.operand(x.dtype, (k, n))
    return b.emit(f"jnp.matmul({x.name}, {y.name})", x.dtype, x.dims[:-1] + (n,))


def g_select(b: Builder) -> Val | None:
    x = b.pick()
    y, dims = b.broadcastable(x)
    if y.dims != dims and x.dims != dims:
        return None
    if x.dtype != PRED and x.dtype not in COMPLEX and b.draw(st.booleans()):
        cond = f"{x.name} > {y.name}"
    else:
        c = b.operand(PRED, dims if b.draw(st.booleans()) else ())
        cond = c.name
    return b.emit(f"jnp.where({cond}, {x.name}, {y.name})", x.dtype, dims)


def g_clamp(b: Builder) -> Val | None:
    x = b.pick(lambda v: v.dtype in FLOATS + INTS)
    if x is None:
        return None
    lo, hi = ("-1", "2") if b.draw(st.booleans()) else ("2", "-1")
    if x.dtype == "u8":
        lo, hi = "1", "9"
    return b.emit(f"jnp.clip({x.name}, {lo}, {hi})", x.dtype, x.dims)


def g_cumulative(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1 and v.dtype in FLOATS + ("s32",))
    if x is None:
        return None
    axis = b.draw(st.integers(0, len(x.dims) - 1))
    f = b.draw(st.sampled_from(["jnp.cumsum", "lax.cummax", "lax.cummin", "jnp.cumprod"]))
    rev = b.draw(st.booleans()) and f.startswith("lax")
    extra = ", reverse=True" if rev else ""
    return b.emit(f"{f}({x.name}, axis={axis}{extra})", x.dtype, x.dims)


def body_expr(b: Builder, dtype: str, arg: str) -> str:
    """A small elementwise expression of ``arg``, for loop and branch bodies."""
    e = b.draw(st.sampled_from(unary_exprs(dtype)))
    if unary_result(e, dtype) != dtype:
        e = "-{}" if dtype != PRED else "~{}"
    return e.format(arg)


def g_scan(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1 and v.dtype in FLOATS + ("s32", "c64"))
    if x is None:
        return None
    carry = b.operand(x.dtype, x.dims[1:])
    step = body_expr(b, x.dtype, "c")
    rev = b.draw(st.booleans())
    c_out = b.new_value(x.dtype, x.dims[1:])
    ys = b.new_value(x.dtype, x.dims)
    b.program.statements.append(
        f"{c_out.name}, {ys.name} = lax.scan(lambda c, xi: ({step} + xi, c * xi), "
        f"{carry.name}, {x.name}, reverse={rev})")
    return ys


def g_fori(b: Builder) -> Val | None:
    x = b.pick(lambda v: v.dtype in FLOATS + ("s32", "c64"))
    if x is None:
        return None
    n = b.draw(st.integers(0, 3))
    step = body_expr(b, x.dtype, "c")
    # A captured outer value becomes loop state that the body reads.
    w = b.pick(lambda v: v.dtype == x.dtype and v.dims == x.dims and v is not x)
    captured = f" * {w.name}" if w is not None and b.draw(st.booleans()) else ""
    counter = f" + i.astype({JNP_DTYPE[x.dtype]})" if b.draw(st.booleans()) else ""
    return b.emit(f"lax.fori_loop(0, {n}, lambda i, c: {step}{captured}{counter}, {x.name})",
                  x.dtype, x.dims)


def g_while(b: Builder) -> Val | None:
    """A while loop whose trip count depends on the data."""
    x = b.pick(lambda v: v.dtype in ("f32", "s32"))
    if x is None:
        return None
    limit = b.draw(st.integers(0, 4))
    one = "1.0" if x.dtype == "f32" else "1"
    step = f"jnp.abs(c) + {one}" if b.draw(st.booleans()) else f"c * 2 + {one}"
    cond = (f"lambda s: (s[0] < {limit}) & (jnp.sum(s[1]) < 1000)")
    v = b.new_value(x.dtype, x.dims)
    b.program.statements.append(
        f"_, {v.name} = lax.while_loop({cond}, lambda s: (s[0] + 1, "
        f"(lambda c: {step})(s[1])), (0, {x.name}))")
    return v


def g_cond(b: Builder) -> Val | None:
    x = b.pick(lambda v: v.dtype != PRED)
    if x is None:
        return None
    p = b.pick(lambda v: v.dtype in FLOATS + INTS)
    pred = f"jnp.sum({p.name}) > 0" if p is not None and p.dtype != "u8" else \
        b.operand(PRED, ()).name
    if b.draw(st.booleans()):
        f1, f2 = body_expr(b, x.dtype, "a"), body_expr(b, x.dtype, "a")
        return b.emit(f"lax.cond({pred}, lambda a: {f1}, lambda a: {f2}, {x.name})",
                      x.dtype, x.dims)
    idx = b.operand("s32", ())
    branches = ", ".join(f"lambda a: {body_expr(b, x.dtype, 'a')}" for _ in range(3))
    return b.emit(f"lax.switch({idx.name}, [{branches}], {x.name})", x.dtype, x.dims)


def g_sort(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1 and v.dtype not in COMPLEX)
    if x is None:
        return None
    axis = b.draw(st.integers(0, len(x.dims) - 1))
    kind = b.draw(st.sampled_from(["sort", "argsort", "pair", "top_k"]))
    if kind == "argsort":
        return b.emit(f"jnp.argsort({x.name}, axis={axis}, stable=True)", "s32", x.dims)
    if kind == "pair":
        y = b.operand(b.draw(st.sampled_from(["f32", "s32"])), x.dims)
        k = b.new_value(x.dtype, x.dims)
        v = b.new_value(y.dtype, x.dims)
        b.program.statements.append(
            f"{k.name}, {v.name} = lax.sort(({x.name}, {y.name}), dimension={axis}, "
            f"num_keys=1, is_stable=True)")
        return v
    if kind == "top_k" and x.dtype != PRED and x.name[0] == "p":
        # Of parameters only: top_k orders with the total order, where a NaN's sign bit
        # decides its place, and the sign of a computed NaN is unspecified.
        k = b.draw(st.integers(0, x.dims[-1]))
        vals = b.new_value(x.dtype, x.dims[:-1] + (k,))
        idx = b.new_value("s32", x.dims[:-1] + (k,))
        b.program.statements.append(f"{vals.name}, {idx.name} = lax.top_k({x.name}, {k})")
        return idx
    desc = ", descending=True" if b.draw(st.booleans()) else ""
    return b.emit(f"jnp.sort({x.name}, axis={axis}{desc})", x.dtype, x.dims)


MODES = ["None", "'clip'", "'fill'", "'wrap'"]


def g_gather(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1)
    if x is None:
        return None
    axis = b.draw(st.integers(0, len(x.dims) - 1))
    if x.dims[axis] == 0:
        return None   # jnp.take refuses a non-empty take from an empty axis
    idims = draw_dims(b.draw, max_rank=2, max_elems=8)
    idx = b.new_param("s32", idims)
    mode = b.draw(st.sampled_from(MODES))
    ix = f"{idx.name} % {x.dims[axis] + 2} - 1" if b.draw(st.booleans()) else idx.name
    dims = x.dims[:axis] + idims + x.dims[axis + 1:]
    if math.prod(dims) > 4 * MAX_ELEMS:
        return None
    if axis == 0 and mode == "None" and b.draw(st.booleans()):
        # Indexing: negative indices count from the end, out-of-range ones are clamped.
        return b.emit(f"{x.name}[{ix}]", x.dtype, dims)
    return b.emit(f"jnp.take({x.name}, {ix}, axis={axis}, mode={mode})", x.dtype, dims)


def g_scatter(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1)
    if x is None:
        return None
    n = b.draw(st.integers(0, 4))
    idx = b.new_param("s32", (n,))
    kind = b.draw(st.sampled_from(["set", "add", "max", "min", "mul"]))
    if x.dtype == PRED and kind != "set":
        kind = "set"
    if x.dtype in COMPLEX and kind in ("max", "min"):
        kind = "add"
    upd = b.operand(x.dtype, (n,) + x.dims[1:] if b.draw(st.booleans()) else ())
    mode = b.draw(st.sampled_from(["None", "'drop'", "'clip'", "'promise_in_bounds'"]))
    ix = f"{idx.name} % {x.dims[0] + 2} - 1"
    if mode == "'promise_in_bounds'":
        if x.dims[0] == 0:
            return None
        ix = f"jnp.clip({idx.name}, 0, {x.dims[0] - 1})"
        if kind == "set":
            if x.dtype == PRED:
                return None
            kind = "add"   # duplicate indices with set: which update wins is unspecified
    elif kind == "set":
        # Duplicate indices with set: XLA leaves the winner unspecified; make them unique.
        ix = f"jnp.arange({n}) * 2 - 1"
    return b.emit(f"{x.name}.at[{ix}].{kind}({upd.name}, mode={mode})", x.dtype, x.dims)


def g_dynamic_slice(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1)
    if x is None:
        return None
    sizes = tuple(b.draw(st.integers(0, d)) for d in x.dims)
    starts = b.new_param("s32", (len(x.dims),))
    start_list = ", ".join(f"{starts.name}[{i}]" for i in range(len(x.dims)))
    if b.draw(st.booleans()):
        return b.emit(f"lax.dynamic_slice({x.name}, ({start_list},), {sizes})",
                      x.dtype, sizes)
    upd = b.operand(x.dtype, sizes)
    return b.emit(f"lax.dynamic_update_slice({x.name}, {upd.name}, ({start_list},))",
                  x.dtype, x.dims)


def g_iota(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 2 and v.dtype in FLOATS + INTS)
    if x is None:
        return None
    if b.draw(st.booleans()):
        f = b.draw(st.sampled_from(["jnp.triu", "jnp.tril"]))
        k = b.draw(st.integers(-1, 1))
        return b.emit(f"{f}({x.name}, k={k})", x.dtype, x.dims)
    d = x.dims[-1]
    return b.emit(f"{x.name} + jnp.arange({d}, dtype={JNP_DTYPE[x.dtype]})", x.dtype, x.dims)


def g_complex(b: Builder) -> Val | None:
    x = b.pick(lambda v: v.dtype == "f32")
    if x is None:
        return None
    y = b.operand("f32", x.dims)
    return b.emit(f"lax.complex({x.name}, {y.name})", "c64", x.dims)


def g_call(b: Builder) -> Val | None:
    """A nested jax.jit called twice (one callee, two call sites), once inside a loop."""
    x = b.pick(lambda v: v.dtype in FLOATS + ("s32",))
    if x is None:
        return None
    body = body_expr(b, x.dtype, "a")
    n = b.draw(st.integers(1, 2))
    return b.emit(f"(lambda g: lax.fori_loop(0, {n}, lambda i, c: g(c), g({x.name})))"
                  f"(jax.jit(lambda a: {body}))", x.dtype, x.dims)


def g_softmax(b: Builder) -> Val | None:
    x = b.pick(lambda v: len(v.dims) >= 1 and v.dtype in FLOATS)
    if x is None:
        return None
    f = b.draw(st.sampled_from(["jax.nn.softmax", "jax.nn.log_softmax", "jax.nn.standardize"]))
    return b.emit(f"{f}({x.name}, axis=-1)", x.dtype, x.dims)


OPS = {
    "unary": (g_unary, 4), "binary": (g_binary, 5), "scalar": (g_scalar_op, 2),
    "convert": (g_convert, 2), "bitcast": (g_bitcast, 1), "reduce": (g_reduce, 3),
    "reshape": (g_reshape, 2), "transpose": (g_transpose, 2), "slice": (g_slice, 2),
    "concat": (g_concat, 2), "pad": (g_pad, 1), "broadcast": (g_broadcast, 1),
    "dot": (g_dot, 3), "select": (g_select, 2), "clamp": (g_clamp, 1),
    "cumulative": (g_cumulative, 1), "scan": (g_scan, 2), "fori": (g_fori, 2),
    "while": (g_while, 1), "cond": (g_cond, 2), "sort": (g_sort, 2), "gather": (g_gather, 2),
    "scatter": (g_scatter, 2), "dynamic_slice": (g_dynamic_slice, 1), "iota": (g_iota, 1),
    "complex": (g_complex, 1), "call": (g_call, 1), "softmax": (g_softmax, 1),
}
OP_NAMES = sorted(OPS)
OP_WEIGHTED = [name for name in OP_NAMES for _ in range(OPS[name][1])]


@st.composite
def programs(draw, max_statements: int = MAX_STATEMENTS) -> Program:
    """A random JAX program (see the module docstring)."""
    b = Builder(draw)
    b.new_param(draw(st.sampled_from(ALL_DTYPES[:5] + ("f32", "f32", "s32", PRED))),
                draw_dims(draw))
    n = draw(st.integers(1, max_statements))
    for _ in range(n):
        name = draw(st.sampled_from(OP_WEIGHTED))
        OPS[name][0](b)
    prog = b.program
    produced = [v for v in prog.values if v.name[0] == "v"]
    if not produced:
        prog.outputs = [prog.values[-1]]
    else:
        prog.outputs = [produced[-1]] + [v for v in produced[:-1] if draw(st.booleans())]
    prog.seed = draw(st.integers(0, 2**32 - 1))
    prog.special = draw(st.integers(0, 3)) == 0
    return prog
