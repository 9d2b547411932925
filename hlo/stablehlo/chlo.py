"""CHLO ops -> HLO, decomposed the way XLA's CHLO legalization does.

Ops with an HLO opcode map to it (erf, tan, top_k -> topk, ragged_dot -> ragged-dot); the
rest are written as small HLO graphs: real types here, complex types in chlo_math.py. The
special functions not listed here raise ``hlo.ImportError``.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

from .. import dtypes as dt
from ..errors import HloImportError
from ..ir import Instruction
from ..shape import Layout, Shape, TupleShape
from .chlo_math import COMPLEX_RULES, Expr, ExprBuilder, square
from .chlo_special import SPECIAL_RULES, in_f64
from .importer import Importer, Scope, op_rule
from .ops_table import int_attr, bool_attr, result_shape, results_shape, where


class _G:
    """Emits elementwise HLO on values of one shape (a tiny graph builder)."""

    def __init__(self, imp: Importer, scope: Scope, op: Any):
        self.imp, self.scope, self.op = imp, scope, op
        self.orig_dtype: dt.DType | None = None   # the op's element type, before any widening

    def e(self, opcode: str, *xs: Instruction, shape: Shape | None = None, **attrs) -> Instruction:
        # A select's shape is its values', not its predicate's.
        like = xs[1] if opcode == "select" else xs[0]
        return self.imp.emit(self.scope, opcode, list(xs), shape or like.shape, attrs, self.op)

    def c(self, value: float | int, like: Instruction) -> Instruction:
        s = like.shape
        k = self.imp.constant(self.scope, value, s.dtype, self.op)
        if s.rank == 0:
            return k
        return self.e("broadcast", k, shape=s, dimensions=())

    def cmp(self, a: Instruction, b: Instruction, direction: str) -> Instruction:
        shape = Shape(dt.PRED, a.shape.dims, Layout.row_major(a.shape.rank))
        ctype = "FLOAT" if a.shape.dtype.is_float else (
            "UNSIGNED" if a.shape.dtype.is_unsigned else "SIGNED")
        return self.e("compare", a, b, shape=shape, direction=direction, type=ctype)

    def convert(self, x: Instruction, dtype) -> Instruction:
        return self.e("convert", x, shape=Shape(dtype, x.shape.dims, x.shape.layout))


def _expr_builder(imp: Importer, scope: Scope, op: Any, like: Instruction) -> ExprBuilder:
    return ExprBuilder(lambda opcode, xs, shape, attrs: imp.emit(scope, opcode, xs, shape,
                                                                 attrs, op),
                       lambda value, dtype: imp.constant(scope, value, dtype, op),
                       like.shape.dims)


def _real_unary(fn, complex_fn=None, wide: bool = True):
    """A rule for a unary chlo op on floats, written with the graph builder; complex
    operands go to ``complex_fn`` (chlo_math) where the op has a complex form. ``wide``:
    f32 computes in f64; else only narrow floats widen, to f32 (XLA's graph, whose
    rounding of x + log(1/2) in sinh/cosh the suites' goldens carry)."""
    def rule(imp, scope, op):
        (x,) = imp.operands(scope, op)
        if x.shape.dtype.is_complex and complex_fn is not None:
            b = _expr_builder(imp, scope, op, x)
            return in_f64(complex_fn)(b, b.wrap(x)).inst
        if not x.shape.dtype.is_float:
            kinds = "floating-point or complex" if complex_fn else "real floating-point"
            raise HloImportError(f"only {kinds} operands are supported "
                                 f"(got {x.shape.dtype})", op=op.operation.name, location=where(op))
        g = _G(imp, scope, op)
        g.orig_dtype = x.shape.dtype
        # f32 and narrower compute in f64 and round once (StableHLO's reference interpreter
        # is that accurate; XLA's f32 graphs are a few ULP off).
        orig = x.shape.dtype
        compute = (dt.F64 if orig.bits <= 32 else orig) if wide else \
            (dt.F32 if orig.bits < 32 else orig)
        if compute != orig:
            x = g.convert(x, compute)
        y = fn(g, x)
        return g.convert(y, orig) if compute != orig else y
    return rule


def _direct(opcode: str):
    def rule(imp, scope, op):
        return imp.emit(scope, opcode, imp.operands(scope, op), result_shape(op), op=op)
    return rule


op_rule("chlo.erf")(_direct("erf"))
op_rule("chlo.tan")(_direct("tan"))


def _atan(g: _G, x):
    return g.e("atan2", x, g.c(1, x))


def _asin(g: _G, x):
    # asin(x) = 2 atan2(x, 1 + sqrt((1 - x)(1 + x))); the product form of 1 - x^2 keeps
    # accuracy near |x| = 1.
    one = g.c(1, x)
    root = g.e("sqrt", g.e("multiply", g.e("subtract", one, x), g.e("add", one, x)))
    half = g.e("atan2", x, g.e("add", one, root))
    return g.e("add", half, half)


def _acos(g: _G, x):
    # acos(x) = atan2(sqrt((1 - x)(1 + x)), x).
    one = g.c(1, x)
    root = g.e("sqrt", g.e("multiply", g.e("subtract", one, x), g.e("add", one, x)))
    return g.e("atan2", root, x)


def _sinh(g: _G, x):
    # Small |x|: from expm1 to keep precision; large: exp(±x + log(1/2)) avoids overflow.
    half_log = g.c(math.log(0.5), x)
    large = g.e("subtract", g.e("exponential", g.e("add", x, half_log)),
                g.e("exponential", g.e("subtract", half_log, x)))
    em1 = g.e("exponential-minus-one", x)
    small = g.e("multiply", g.c(0.5, x),
                g.e("add", em1, g.e("divide", em1, g.e("add", em1, g.c(1, x)))))
    return g.e("select", g.cmp(g.e("abs", x), g.c(1, x), "LT"), small, large)


def _cosh(g: _G, x):
    half_log = g.c(math.log(0.5), x)
    return g.e("add", g.e("exponential", g.e("add", x, half_log)),
               g.e("exponential", g.e("subtract", half_log, x)))


def _asinh(g: _G, x):
    # sign(x) * log1p(a + a^2 / (1 + sqrt(1 + a^2))), a = |x|; log(2) + log(a) from
    # a >= sqrt(max), where a^2 overflows.
    a = g.e("abs", x)
    one = g.c(1, x)
    a2 = g.e("multiply", a, a)
    small = g.e("log-plus-one", g.e("add", a, g.e("divide", a2, g.e(
        "add", one, g.e("sqrt", g.e("add", one, a2))))))
    big = g.e("add", g.e("log", g.c(2, x)), g.e("log", a))
    limit = g.c(math.sqrt(float(_finfo_max(x))), x)
    r = g.e("select", g.cmp(a, limit, "GE"), big, small)
    return g.e("multiply", g.e("sign", x), r)


def _acosh(g: _G, x):
    # log1p(sqrt(x - 1) (sqrt(x + 1) + sqrt(x - 1))): no cancellation near 1, NaN below 1;
    # log(2) + log(x) from max / 2 on.
    one = g.c(1, x)
    sm1 = g.e("sqrt", g.e("subtract", x, one))
    main = g.e("log-plus-one", g.e("multiply", sm1, g.e("add", g.e("sqrt", g.e("add", x, one)),
                                                            sm1)))
    big = g.e("add", g.e("log", g.c(2, x)), g.e("log", x))
    limit = g.c(float(_finfo_max(x)) / 2, x)
    return g.e("select", g.cmp(x, limit, "GE"), big, main)


def _atanh(g: _G, x):
    # 0.5 * (log1p(x) - log1p(-x)); NaN outside [-1, 1].
    main = g.e("multiply", g.c(0.5, x), g.e("subtract", g.e("log-plus-one", x),
                                            g.e("log-plus-one", g.e("negate", x))))
    return g.e("select", g.cmp(g.e("abs", x), g.c(1, x), "GT"), g.c(float("nan"), x), main)


def _erf_inv(g: _G, x):
    # Giles, "Approximating the erfinv function" (single precision): two polynomials in
    # w = -log((1 - x)(1 + x)); +-inf at x = +-1.
    small_c = [2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
               0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941]
    big_c = [-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
             0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682]
    one = g.c(1, x)
    w = g.e("negate", g.e("log", g.e("multiply", g.e("subtract", one, x), g.e("add", one, x))))
    is_small = g.cmp(w, g.c(5, x), "LT")
    w_small = g.e("subtract", w, g.c(2.5, x))
    w_big = g.e("subtract", g.e("sqrt", w), g.c(3, x))
    ww = g.e("select", is_small, w_small, w_big)
    p = g.e("select", is_small, g.c(small_c[0], x), g.c(big_c[0], x))
    for cs, cb in zip(small_c[1:], big_c[1:]):
        p = g.e("add", g.e("select", is_small, g.c(cs, x), g.c(cb, x)), g.e("multiply", p, ww))
    result = g.e("multiply", p, x)
    is_one = g.cmp(g.e("abs", x), one, "EQ")
    return g.e("select", is_one, g.e("multiply", x, g.c(float("inf"), x)), result)


# Giles' double-precision erfinv: p(w) * x with w = -log((1 - x)(1 + x)), one polynomial
# per range of w (in u = w - 3.125 below 6.25, else u = sqrt(w) - 3.25 below 16, else
# sqrt(w) - 5), highest degree first. The single-precision pair above is only ~1e-7 relative.
_ERFINV64 = (
    (6.25, lambda g, w: g.e("subtract", w, g.c(3.125, w)), (
        -3.6444120640178196996e-21, -1.685059138182016589e-19, 1.2858480715256400167e-18,
        1.115787767802518096e-17, -1.333171662854620906e-16, 2.0972767875968561637e-17,
        6.6376381343583238325e-15, -4.0545662729752068639e-14, -8.1519341976054721522e-14,
        2.6335093153082322977e-12, -1.2975133253453532498e-11, -5.4154120542946279317e-11,
        1.051212273321532285e-09, -4.1126339803469836976e-09, -2.9070369957882005086e-08,
        4.2347877827932403518e-07, -1.3654692000834678645e-06, -1.3882523362786468719e-05,
        0.0001867342080340571352, -0.00074070253416626697512, -0.0060336708714301490533,
        0.24015818242558961693, 1.6536545626831027356)),
    (16.0, lambda g, w: g.e("subtract", g.e("sqrt", w), g.c(3.25, w)), (
        2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
        1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
        2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
        6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
        0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
        -0.0037512085075692412107, 0.005370914553590063617, 1.0052589676941592334,
        3.0838856104922207635)),
    (math.inf, lambda g, w: g.e("subtract", g.e("sqrt", w), g.c(5.0, w)), (
        -2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
        -3.7894654401267369937e-09, 7.6157012080783393804e-09, -1.4960026627149240478e-08,
        2.9147953450901080826e-08, -6.7711997758452339498e-08, 2.2900482228026654717e-07,
        -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
        7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026,
        1.0103004648645343977, 4.8499064014085844221)),
)


def _erf_inv64(g: _G, x):
    """erfinv on f64 to ~1 ULP (f32 and narrower keep the single-precision graph above,
    computed in f64: XLA's f32 goldens carry that polynomial's rounding)."""
    one = g.c(1, x)
    w = g.e("negate", g.e("log", g.e("multiply", g.e("subtract", one, x), g.e("add", one, x))))
    result = None
    for bound, arg, coeffs in reversed(_ERFINV64):     # the last range is the fallback
        u = arg(g, w)
        p = g.c(coeffs[0], x)
        for c in coeffs[1:]:
            p = g.e("add", g.c(c, x), g.e("multiply", p, u))
        result = p if result is None else g.e("select", g.cmp(w, g.c(bound, x), "LT"), p, result)
    result = g.e("multiply", result, x)
    is_one = g.cmp(g.e("abs", x), one, "EQ")
    return g.e("select", is_one, g.e("multiply", x, g.c(float("inf"), x)), result)


def _erf_inv_any(g: _G, x):
    return _erf_inv64(g, x) if g.orig_dtype == dt.F64 else _erf_inv(g, x)


def _finfo_max(x: Instruction):
    import numpy as np
    import ml_dtypes
    d = x.shape.dtype.np_dtype
    try:
        return np.finfo(d).max
    except ValueError:
        return ml_dtypes.finfo(d).max


for _name, _fn in (("asin", _asin), ("acos", _acos), ("atan", _atan), ("sinh", _sinh),
                   ("cosh", _cosh), ("asinh", _asinh), ("acosh", _acosh), ("atanh", _atanh),
                   ("erf_inv", _erf_inv_any)):
    op_rule("chlo." + _name)(_real_unary(_fn, COMPLEX_RULES.get(_name),
                                         wide=_name not in ("sinh", "cosh")))


@op_rule("chlo.square")
def _square(imp, scope, op):
    (x,) = imp.operands(scope, op)
    b = _expr_builder(imp, scope, op, x)
    return square(b, b.wrap(x)).inst


@op_rule("chlo.conj")
def _conj(imp, scope, op):
    (x,) = imp.operands(scope, op)
    if not x.shape.dtype.is_complex:
        return x
    b = _expr_builder(imp, scope, op, x)
    z = b.wrap(x)
    return b.complex(b.real(z), -b.imag(z)).inst


def _is_inf_rule(test: Callable[[ExprBuilder, Expr], Expr]):
    def rule(imp, scope, op):
        (x,) = imp.operands(scope, op)
        if not x.shape.dtype.is_float:
            raise HloImportError(f"needs a floating-point operand (got {x.shape.dtype})",
                                 op=op.operation.name, location=where(op))
        b = _expr_builder(imp, scope, op, x)
        return test(b, b.wrap(x)).inst
    return rule


op_rule("chlo.is_inf")(_is_inf_rule(lambda b, x: b.abs(x).eq(math.inf)))
op_rule("chlo.is_pos_inf")(_is_inf_rule(lambda b, x: x.eq(math.inf)))
op_rule("chlo.is_neg_inf")(_is_inf_rule(lambda b, x: x.eq(-math.inf)))


@op_rule("chlo.next_after")
def _next_after(imp, scope, op):
    x, y = imp.operands(scope, op)
    d = x.shape.dtype
    if not d.is_float:
        raise HloImportError("next_after needs floating-point operands", op=op.operation.name,
                             location=where(op))
    g = _G(imp, scope, op)
    ity = {16: dt.S16, 32: dt.S32, 64: dt.S64, 8: dt.S8}[d.bits]
    ishape = Shape(ity, x.shape.dims, x.shape.layout)
    xi = g.e("bitcast-convert", x, shape=ishape)
    yi = g.e("bitcast-convert", y, shape=ishape)
    sign_mask = g.c(-(1 << (d.bits - 1)), xi)
    # Step the magnitude towards y: +1 if (x < y) == (x > 0), else -1.
    toward_up = g.cmp(g.cmp(x, y, "LT"), g.cmp(x, g.c(0, x), "GT"), "EQ")
    stepped = g.e("select", toward_up, g.e("add", xi, g.c(1, xi)),
                  g.e("subtract", xi, g.c(1, xi)))
    # From zero: the smallest denormal carrying y's sign.
    from_zero = g.e("or", g.e("and", yi, sign_mask), g.c(1, xi))
    x_zero = g.cmp(x, g.c(0, x), "EQ")
    ri = g.e("select", x_zero, from_zero, stepped)
    r = g.e("bitcast-convert", ri, shape=x.shape)
    r = g.e("select", g.cmp(x, y, "EQ"), y, r)
    nan = g.e("or", g.cmp(x, x, "NE"), g.cmp(y, y, "NE"))
    return g.e("select", nan, g.c(float("nan"), x), r)


@op_rule("chlo.mulhi")
def _mulhi(imp, scope, op):
    x, y = imp.operands(scope, op)
    d = x.shape.dtype
    wide = {("sint", 8): dt.S16, ("sint", 16): dt.S32, ("sint", 32): dt.S64,
            ("uint", 8): dt.U16, ("uint", 16): dt.U32, ("uint", 32): dt.U64}.get((d.kind, d.bits))
    g = _G(imp, scope, op)
    if wide is None and d.bits == 64 and d.kind in ("sint", "uint"):
        return _mulhi64(g, x, y, signed=d.kind == "sint")
    if wide is None:
        raise HloImportError(f"mulhi on {d} is not supported", op=op.operation.name,
                             location=where(op))
    p = g.e("multiply", g.convert(x, wide), g.convert(y, wide))
    shift = "shift-right-arithmetic" if d.kind == "sint" else "shift-right-logical"
    return g.convert(g.e(shift, p, g.c(d.bits, p)), d)


def _mulhi64(g: _G, x: Instruction, y: Instruction, signed: bool) -> Instruction:
    """High 64 bits of a 64x64-bit product from 32-bit halves (no 128-bit type in HLO).

    With a = ah*2^32 + al and b = bh*2^32 + bl (unsigned), the high word is
    ah*bh + (ah*bl >> 32) + (al*bh >> 32) + (carry of the middle column >> 32). For signed
    operands, the unsigned high word of the two's-complement patterns is corrected by
    subtracting b where a < 0 and a where b < 0 (mod 2^64)."""
    ushape = Shape(dt.U64, x.shape.dims, x.shape.layout)
    a = g.e("bitcast-convert", x, shape=ushape) if signed else x
    b = g.e("bitcast-convert", y, shape=ushape) if signed else y
    low_mask, k32 = g.c(0xFFFFFFFF, a), g.c(32, a)

    def hi(v):
        return g.e("shift-right-logical", v, k32)

    def lo(v):
        return g.e("and", v, low_mask)
    al, ah, bl, bh = lo(a), hi(a), lo(b), hi(b)
    ll, lh = g.e("multiply", al, bl), g.e("multiply", al, bh)
    hl, hh = g.e("multiply", ah, bl), g.e("multiply", ah, bh)
    middle = g.e("add", g.e("add", hi(ll), lo(lh)), lo(hl))
    r = g.e("add", g.e("add", hh, hi(lh)), g.e("add", hi(hl), hi(middle)))
    if not signed:
        return r
    rs = g.e("bitcast-convert", r, shape=x.shape)
    zero = g.c(0, x)
    rs = g.e("subtract", rs, g.e("select", g.cmp(x, zero, "LT"), y, zero))
    return g.e("subtract", rs, g.e("select", g.cmp(y, zero, "LT"), x, zero))


@op_rule("chlo.top_k")
def _top_k(imp, scope, op):
    return imp.emit(scope, "topk", imp.operands(scope, op), results_shape(op),
                    {"k": int_attr(op, "k"), "largest": True}, op)


@op_rule("chlo.ragged_dot")
def _ragged_dot(imp, scope, op):
    text = str(op.attributes["ragged_dot_dimension_numbers"])

    def dims(key: str) -> tuple[int, ...]:
        m = re.search(key + r"\s*=\s*\[([^\]]*)\]", text)
        return tuple(int(v) for v in m.group(1).split(",") if v.strip()) if m else ()
    attrs: dict = {}
    if dims("lhs_batching_dimensions"):
        attrs["lhs_batch_dims"] = dims("lhs_batching_dimensions")
    attrs["lhs_contracting_dims"] = dims("lhs_contracting_dimensions")
    if dims("rhs_batching_dimensions"):
        attrs["rhs_batch_dims"] = dims("rhs_batching_dimensions")
    attrs["rhs_contracting_dims"] = dims("rhs_contracting_dimensions")
    attrs["lhs_ragged_dims"] = dims("lhs_ragged_dimensions")
    attrs["rhs_group_dims"] = dims("rhs_group_dimensions")
    return imp.emit(scope, "ragged-dot", imp.operands(scope, op), result_shape(op), attrs, op)


@op_rule("chlo.scan")
def _scan(imp, scope, op):
    """chlo.scan as XLA lowers a scan: a while loop over the scan dimension. The loop state
    is (i, inputs..., carries..., outputs...); each step slices element ``i`` (from the end
    when ``is_reverse``) of every input, calls the body on (elements..., carries...), and
    writes the returned output elements into the outputs with dynamic-update-slice."""
    from .importer import Scope as _Scope
    from .ops_table import ints
    n_in, n_init = ints(op, "operandSegmentSizes")
    n_out, n_carry = ints(op, "resultSegmentSizes")
    dim = int_attr(op, "dimension")
    reverse = bool_attr(op, "is_reverse")
    ins = imp.operands(scope, op)
    inputs, inits = ins[:n_in], ins[n_in:]
    out_shapes = [result_shape(op, i) for i in range(n_out)]
    if not inputs and not out_shapes:
        raise HloImportError("chlo.scan without inputs or outputs has no length",
                             op=op.operation.name, location=where(op))
    length = (inputs[0].shape if inputs else out_shapes[0]).dims[dim]
    body_fn = imp.region_computation(op.regions[0], "scan_body")
    g = _G(imp, scope, op)
    zeros = []
    for s in out_shapes:
        z = imp.constant(scope, 0, s.dtype, op)
        zeros.append(g.e("broadcast", z, shape=s, dimensions=()) if s.rank else z)
    init = [imp.constant(scope, 0, dt.S32, op)] + inputs + inits + zeros
    state_shape = TupleShape(tuple(x.shape for x in init))

    def unpack(sc, comp):
        p = imp._param(comp, 0, state_shape)
        return [imp.emit(sc, "get-tuple-element", [p], e, {"index": k})
                for k, e in enumerate(state_shape.elements)]

    # condition: i < length
    cond = imp.new_computation("scan_cond")
    cs = _Scope(cond)
    cg = _G(imp, cs, op)
    st = unpack(cs, cond)
    cond.root = cg.cmp(st[0], imp.constant(cs, length, dt.S32, op), "LT")

    # body
    body = imp.new_computation("scan_step")
    bs = _Scope(body)
    bg = _G(imp, bs, op)
    st = unpack(bs, body)
    i, xs = st[0], st[1:1 + n_in]
    carries, outs = st[1 + n_in:1 + n_in + n_init], st[1 + n_in + n_init:]
    pos = bg.e("subtract", imp.constant(bs, length - 1, dt.S32, op), i) if reverse else i
    zero = imp.constant(bs, 0, dt.S32, op)

    def starts(rank):
        return [pos if d == dim else zero for d in range(rank)]
    elems = []
    for x in xs:
        sizes = tuple(1 if d == dim else n for d, n in enumerate(x.shape.dims))
        sl = bg.e("dynamic-slice", x, *starts(x.shape.rank),
                  shape=Shape(x.shape.dtype, sizes, Layout.row_major(len(sizes))),
                  dynamic_slice_sizes=sizes)
        edims = tuple(n for d, n in enumerate(x.shape.dims) if d != dim)
        elems.append(bg.e("reshape", sl, shape=Shape(x.shape.dtype, edims,
                                                     Layout.row_major(len(edims)))))
    called = bg.e("call", *(elems + carries), shape=body_fn.root.shape, to_apply=body_fn)
    n_ret = n_out + n_carry
    rets = [called] if n_ret == 1 else [
        bg.e("get-tuple-element", called, shape=called.shape.elements[k], index=k)
        for k in range(n_ret)]
    new_outs = []
    for o, r in zip(outs, rets[:n_out]):
        udims = tuple(1 if d == dim else n for d, n in enumerate(o.shape.dims))
        upd = bg.e("reshape", r, shape=Shape(r.shape.dtype, udims, Layout.row_major(len(udims))))
        new_outs.append(bg.e("dynamic-update-slice", o, upd, *starts(o.shape.rank),
                             shape=o.shape))
    nxt = bg.e("add", i, imp.constant(bs, 1, dt.S32, op))
    new_state = [nxt] + list(xs) + rets[n_out:] + new_outs
    body.root = imp.emit(bs, "tuple", new_state, state_shape)

    t = imp.emit(scope, "tuple", init, state_shape)
    w = imp.emit(scope, "while", [t], state_shape, {"condition": cond, "body": body}, op)
    res_idx = [1 + n_in + n_init + k for k in range(n_out)] + \
        [1 + n_in + k for k in range(n_carry)]
    return [imp.emit(scope, "get-tuple-element", [w], state_shape.elements[k], {"index": k})
            for k in res_idx]


def _not_yet(imp, scope, op):
    raise HloImportError("this CHLO op is not supported yet", op=op.operation.name, location=where(op))


def _special_rule(fn: Callable[[ExprBuilder, Expr], Expr]):
    def rule(imp, scope, op):
        (x,) = imp.operands(scope, op)
        if not x.shape.dtype.is_float:
            raise HloImportError(f"only real floating-point operands are supported "
                                 f"(got {x.shape.dtype})", op=op.operation.name, location=where(op))
        b = _expr_builder(imp, scope, op, x)
        return fn(b, b.wrap(x)).inst
    return rule


for _name, _fn in SPECIAL_RULES.items():
    op_rule("chlo." + _name)(_special_rule(_fn))


for _n in ("polygamma", "zeta", "constant_like"):
    op_rule("chlo." + _n)(_not_yet)
