"""CUDA C for a loop fusion: one thread per output element.

``emit_loop_kernel(fusion)`` turns a loop fusion (elementwise ops and the index ops around
them: broadcast, reshape, transpose, slice, reverse, pad, concatenate, iota, ...) into one
``extern "C" __global__`` function. Thread ``t`` of the launch owns output element ``t``
(row-major over the output's logical dims); it delinearizes ``t`` into a logical index and
asks for the value of each output at that index. As in ``codegen/triton/elemental.py``
(the reference for each op's meaning, mirrored here op by op), asking for the value of an
instruction at an index emits one line (named after the instruction, its HLO in a
trailing comment) and memoizes it per (instruction, index), so a value read twice at one
index is computed once.

Index arithmetic keeps every index in range (pad and concatenate clamp theirs), so loads
need no guard. Parameters are read through their strides (kernel arguments, in elements),
so a view with any layout reads right, as the Triton kernel's does.

Numerics (the Triton path's, ``round_narrow_each_op=True`` by default): bf16/f16 values
are held in a ``float`` and rounded back to their type after each op; the CUDA math
library's accurate functions (``expf``, not ``__expf``), IEEE division and square root
(NVRTC's defaults), ``rsqrtf`` as Triton's ``tl.math.rsqrt``; max/min propagate NaN.

What it does not take (reductions, dots, gathers, scatters, dynamic slices, element types
without a C spelling) raises ``CudaCDeclined`` with the reason: the fusion keeps Triton.
Purely elementwise fusions get the flat form instead (``flat.py``: no coordinates, the
element count an argument, 16-byte vectors), unless ``emit_loop_kernel(flat=False)``.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from hlo.dtypes import DType
from hlo.errors import UnimplementedError
from hlo.ir import Computation, Instruction

from .prelude import prelude_for

GENERATOR_VERSION = "cuda-c-1"
THREADS = 256                   # threads per block; ceil(n / THREADS) blocks
MAX_ARRAY_CONSTANT = 4096       # a non-uniform constant up to this many elements is inlined

Index = tuple[str, ...]


class CudaCodegenError(UnimplementedError):
    """The CUDA C code generator could not make (or NVRTC could not compile) a kernel."""


class CudaCDeclined(CudaCodegenError):
    """A fusion the CUDA C emitter does not take (it keeps the Triton kernel): the message
    says which op or type and why."""


# Held (between ops) and stored (in memory) C types of each element type.
C_HELD = {"pred": "bool", "s8": "signed char", "s16": "short", "s32": "int", "s64": "long long",
          "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int",
          "u64": "unsigned long long", "f16": "float", "bf16": "float", "f32": "float",
          "f64": "double"}
C_STORED = dict(C_HELD, pred="unsigned char", f16="unsigned short", bf16="unsigned short")
_UNSIGNED = {"s8": "unsigned char", "s16": "unsigned short", "s32": "unsigned int",
             "s64": "unsigned long long"}
_SIGNED = {v: k for k, v in _UNSIGNED.items()}

# The ops a loop kernel takes besides the elementwise ones below.
INDEX_OPS = {"parameter", "constant", "iota", "broadcast", "copy", "transpose", "reshape",
             "bitcast", "slice", "reverse", "pad", "concatenate", "get-tuple-element", "tuple",
             "map"}
# f32 spelling, f64 spelling (None: the f32 one), of the float ops.
_FLOAT_UNARY = {
    "negate": ("(-{0})", None), "abs": ("fabsf({0})", "fabs({0})"),
    "exponential": ("expf({0})", "exp({0})"), "log": ("logf({0})", "log({0})"),
    "sqrt": ("sqrtf({0})", "sqrt({0})"), "rsqrt": ("rsqrtf({0})", "rsqrt({0})"),
    "floor": ("floorf({0})", "floor({0})"), "ceil": ("ceilf({0})", "ceil({0})"),
    "cosine": ("cosf({0})", "cos({0})"), "sine": ("sinf({0})", "sin({0})"),
    "tan": ("tanf({0})", "tan({0})"), "erf": ("erff({0})", "erf({0})"),
    "tanh": ("tanhf({0})", "tanh({0})"), "exponential-minus-one": ("expm1f({0})", "expm1({0})"),
    "log-plus-one": ("log1pf({0})", "log1p({0})"), "cbrt": ("cbrtf({0})", "cbrt({0})"),
    "round-nearest-even": ("rintf({0})", "rint({0})"),
    "round-nearest-afz": ("roundf({0})", "round({0})"),
    "logistic": ("(1.0f / (1.0f + expf(-{0})))", "(1.0 / (1.0 + exp(-{0})))"),
    "sign": ("({0} > 0.0f ? 1.0f : ({0} < 0.0f ? -1.0f : {0}))",
             "({0} > 0.0 ? 1.0 : ({0} < 0.0 ? -1.0 : {0}))"),
}
_FLOAT_BINARY = {
    "add": ("({0} + {1})", None), "subtract": ("({0} - {1})", None),
    "multiply": ("({0} * {1})", None), "divide": ("({0} / {1})", None),
    "remainder": ("fmodf({0}, {1})", "fmod({0}, {1})"), "power": ("powf({0}, {1})", "pow({0}, {1})"),
    "atan2": ("atan2f({0}, {1})", "atan2({0}, {1})"),
    "maximum": ("hl_maxf({0}, {1})", "hl_max({0}, {1})"),
    "minimum": ("hl_minf({0}, {1})", "hl_min({0}, {1})"),
}
_COMPARE = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
ELEMENTWISE = set(_FLOAT_UNARY) | set(_FLOAT_BINARY) | {
    "convert", "bitcast-convert", "select", "clamp", "compare", "is-finite", "not", "and", "or",
    "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic", "popcnt",
    "count-leading-zeros"}


def c_held(dtype: DType, where: str = "") -> str:
    try:
        return C_HELD[dtype.name]
    except KeyError:
        raise CudaCDeclined(f"element type {dtype.name} has no CUDA C spelling here{where}") from None


def is_narrow(dtype: DType) -> bool:
    return dtype.name in ("bf16", "f16")


def int_range(dtype: DType) -> tuple[int, int]:
    if dtype.kind == "uint":
        return 0, (1 << dtype.bits) - 1
    return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1


def int_literal(v: int, dtype: DType) -> str:
    """A C literal of ``v`` in ``dtype``'s held type (INT64_MIN has no literal: spelled as
    an expression)."""
    ct = C_HELD[dtype.name]
    if dtype.kind == "sint" and v == int_range(dtype)[0] and dtype.bits >= 32:
        return f"(({ct})({v + 1}LL - 1LL))"
    suffix = "ULL" if dtype.kind == "uint" and dtype.bits == 64 else "LL"
    return f"(({ct}){v}{suffix})"


def float_literal(x: float, dtype: DType) -> str:
    """A C literal equal to ``x`` held in ``dtype`` (f32 for narrow floats); non-finite
    values through their bits."""
    wide = dtype.name == "f64"
    if math.isnan(x) or math.isinf(x):
        if wide:
            bits = 0x7FF8000000000000 if math.isnan(x) else \
                (0x7FF0000000000000 if x > 0 else 0xFFF0000000000000)
            return f"__longlong_as_double((long long){bits:#x}ULL)"
        bits = 0x7FC00000 if math.isnan(x) else (0x7F800000 if x > 0 else 0xFF800000)
        return f"__uint_as_float({bits:#x}u)"
    if wide:
        return repr(float(x))
    v = float(np.float32(x))
    return repr(v) + "f"


@dataclass
class KernelSource:
    """One generated kernel: its source, entry name and the parameter list (C type, name)."""
    name: str
    source: str
    params: list[tuple[str, str]]
    n_inputs: int
    n_outputs: int
    input_shapes: list
    output_shapes: list
    threads: int
    elements: int        # the largest output's element count
    per_thread: int = 1  # output elements per thread: ceil(elements / (threads * this)) blocks
    # The flat form (flat.py): arguments are pointers and the element count; ``per_thread``
    # is the chunk (consecutive elements a thread takes at a time).
    flat: bool = False

    @property
    def blocks(self) -> int:
        return max(1, -(-self.elements // (self.threads * self.per_thread)))


class CEmitter:
    """Source lines of one kernel body, with values memoized per (instruction, index)."""

    def __init__(self, fusion_name: str, round_narrow_each_op: bool = True):
        self.fusion_name = fusion_name
        self.round_narrow = round_narrow_each_op
        self.lines: list[str] = []
        self.indent = 1
        self.scopes: list[dict] = [{}]
        self.counter = 0
        self.param_strides: dict[int, list[str]] = {}
        self.constants: list[str] = []          # definitions of inlined array constants
        self.hoist_scalars = False              # memoize index-() values at function scope
        # id(instruction) -> its comment: a flat kernel generates each instruction once per
        # element of a chunk (4-8 times), and printing it was ~40% of an emit (issue 13)
        self._comments: dict[int, str] = {}

    # --- lines and scopes ----------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.counter += 1
        base = "".join(c if c.isalnum() else "_" for c in base).strip("_") or "v"
        return f"{base}_{self.counter}"

    def line(self, text: str, comment: str = "") -> None:
        comment = comment.replace("*/", "* /")
        self.lines.append("  " * self.indent + text + (f"  /* {comment} */" if comment else ""))

    def assign(self, ctype: str, base: str, expr: str, comment: str = "") -> str:
        name = self.fresh(base)
        self.line(f"const {ctype} {name} = {expr};", comment)
        return name

    def index(self, base: str, expr: str) -> str:
        """An index expression as a named ``long long`` (a literal or a name stays as is)."""
        if expr.isidentifier() or expr.lstrip("-").isdigit():
            return expr
        return self.assign("long long", base, expr)

    def value(self, inst: Instruction, idx: Index) -> str:
        key = (id(inst), tuple(idx))
        for s in reversed(self.scopes):
            if key in s:
                return s[key]
        v = self._generate(inst, tuple(idx))
        # A scalar (index ()) is the same for every element of the thread: computed once,
        # at function scope (a step's bias correction, powf of a scalar, is not redone
        # for each of a thread's elements).
        (self.scopes[0] if self.hoist_scalars and not idx else self.scopes[-1])[key] = v
        return v

    def declined(self, inst: Instruction, why: str) -> CudaCDeclined:
        return CudaCDeclined(f"fusion %{self.fusion_name}: %{inst.name} ({inst.opcode}): {why}")

    def _comment(self, inst: Instruction) -> str:
        """The instruction's HLO text (a line's trailing comment), printed once per kernel."""
        text = self._comments.get(id(inst))
        if text is None:
            from hlo.text.printer import print_instruction
            text = print_instruction(inst, print_metadata=False, print_large_constants=False,
                                     print_backend_config=False).strip().replace("\n", " ")
            text = self._comments[id(inst)] = text if len(text) <= 140 else text[:137] + "..."
        return text

    # --- numerics helpers --------------------------------------------------------------------
    def held(self, dtype: DType) -> str:
        return c_held(dtype, f" (fusion %{self.fusion_name})")

    def narrow(self, expr: str, dtype: DType) -> str:
        """``expr`` (an f32 result) rounded to ``dtype`` when narrow values round per op."""
        if is_narrow(dtype) and self.round_narrow:
            return f"hl_round_{dtype.name}({expr})"
        return expr

    def round_to(self, expr: str, dtype: DType) -> str:
        """An explicit rounding of an f32 value to a narrow ``dtype`` (converts, stores)."""
        return f"hl_round_{dtype.name}({expr})"

    # --- the elemental emitter -----------------------------------------------------------------
    def _generate(self, inst: Instruction, idx: Index) -> str:
        op = inst.opcode
        # the comment only for ops that write a line (index ops pass their operand through)
        if op == "parameter":
            return self._load(inst, idx, self._comment(inst))
        if op == "constant":
            return self._constant(inst, idx, self._comment(inst))
        if op == "iota":
            d = inst.attrs["iota_dimension"]
            return self.assign(self.held(inst.shape.dtype), _base(inst),
                               self.convert_expr(idx[d], _S64, inst.shape.dtype),
                               self._comment(inst))
        if op == "broadcast":
            return self.value(inst.operands[0], tuple(idx[d] for d in inst.attrs["dimensions"]))
        if op == "copy":
            return self.value(inst.operands[0], idx)
        if op == "transpose":
            perm = inst.attrs["dimensions"]
            src = [""] * len(perm)
            for i, p in enumerate(perm):
                src[p] = idx[i]
            return self.value(inst.operands[0], tuple(src))
        if op in ("reshape", "bitcast"):
            return self.value(inst.operands[0], self._reshape_index(inst, idx))
        if op == "slice":
            src = []
            for i, sd in zip(idx, inst.attrs["slice"].dims):
                if i.lstrip("-").isdigit():     # a constant position stays a literal
                    src.append(str(int(i) * sd.stride + sd.start))
                    continue
                e = i if sd.stride == 1 else f"{i} * {sd.stride}LL"
                src.append(self.index(f"i_{_base(inst)}", e if sd.start == 0 else f"{e} + {sd.start}LL"))
            return self.value(inst.operands[0], tuple(src))
        if op == "reverse":
            dims = inst.operands[0].shape.dims
            src = [self.index(f"i_{_base(inst)}", f"{dims[d] - 1}LL - {i}")
                   if d in inst.attrs["dimensions"] else i for d, i in enumerate(idx)]
            return self.value(inst.operands[0], tuple(src))
        if op == "pad":
            return self._pad(inst, idx, self._comment(inst))
        if op == "concatenate":
            return self._concatenate(inst, idx, self._comment(inst))
        if op == "get-tuple-element":
            src = inst.operands[0]
            if src.opcode != "tuple":
                raise self.declined(inst, "a tuple element of something other than a tuple")
            return self.value(src.operands[inst.attrs["index"]], idx)
        if op == "map":
            args = [self.value(o, idx) for o in inst.operands]
            return self._inline_scalar(inst.attrs["to_apply"], args)
        if op not in ELEMENTWISE:
            raise self.declined(inst, "not an elementwise or index op (a loop kernel takes "
                                      "no reductions, dots, gathers, scatters or dynamic slices)")
        args = []
        for o in inst.operands:
            args.append(self.value(o, () if (o.shape.rank == 0 and inst.shape.rank > 0) else idx))
        return self.assign(self.held(inst.shape.dtype), _base(inst),
                           self.elementwise_expr(inst, args), self._comment(inst))

    def _load(self, inst: Instruction, idx: Index, comment: str) -> str:
        n = inst.parameter_number
        strides = self.param_strides[n]
        terms = [_term(i, s) for i, s in zip(idx, strides)]
        terms = [t for t in terms if t != "0"]
        addr = f"p{n}[{' + '.join(terms) if terms else '0'}]"
        return self.assign(self.held(inst.shape.dtype), _base(inst),
                           self.from_stored(addr, inst.shape.dtype), comment)

    def from_stored(self, expr: str, dtype: DType) -> str:
        if dtype.name == "bf16":
            return f"hl_bf16_to_f32({expr})"
        if dtype.name == "f16":
            return f"hl_f16_to_f32({expr})"
        if dtype.is_pred:
            return f"({expr} != 0)"
        return expr

    def to_stored(self, expr: str, dtype: DType) -> str:
        if dtype.name == "bf16":
            return f"hl_f32_to_bf16({expr})"
        if dtype.name == "f16":
            return f"hl_f32_to_f16({expr})"
        if dtype.is_pred:
            return f"(unsigned char)({expr} ? 1 : 0)"
        return expr

    def scalar_literal(self, value: np.generic, dtype: DType) -> str:
        if dtype.is_pred:
            return "true" if bool(value) else "false"
        if dtype.is_integer:
            return int_literal(int(value), dtype)
        return float_literal(float(np.float64(value)), dtype)

    def _constant(self, inst: Instruction, idx: Index, comment: str) -> str:
        lit = inst.literal
        dtype = inst.shape.dtype
        ct = self.held(dtype)
        if lit is None:
            raise self.declined(inst, "an elided constant literal {...}")
        arr = np.asarray(lit)
        flat = arr.reshape(-1)
        if arr.size == 1 or (arr.size and np.all(flat == flat[0])):
            return self.scalar_literal(flat[0], dtype)
        if dtype.is_float and arr.size and np.all(np.isnan(flat.astype(np.float64))):
            return self.scalar_literal(flat[0], dtype)
        if arr.size > MAX_ARRAY_CONSTANT:
            raise self.declined(inst, f"an array constant of {arr.size} elements (more than "
                                      f"{MAX_ARRAY_CONSTANT} are not inlined)")
        # A non-uniform array constant: a static array in the source, read row-major. Floats
        # are kept as their bits (an initializer must be a constant expression: no
        # __uint_as_float for a NaN or an infinity).
        name = f"c{len(self.constants)}"
        st = C_STORED[dtype.name]
        load = self.from_stored
        if is_narrow(dtype):
            words = [str(int(w)) for w in np.ascontiguousarray(arr).view(np.uint16).reshape(-1)]
        elif dtype.name == "f32":
            st = "unsigned int"
            words = [f"{int(w):#x}u" for w in np.ascontiguousarray(arr).view(np.uint32).reshape(-1)]
            load = lambda e, _: f"__uint_as_float({e})"   # noqa: E731
        elif dtype.name == "f64":
            st = "unsigned long long"
            words = [f"{int(w):#x}ULL" for w in np.ascontiguousarray(arr).view(np.uint64).reshape(-1)]
            load = lambda e, _: f"__longlong_as_double((long long){e})"   # noqa: E731
        elif dtype.is_pred:
            words = ["1" if bool(w) else "0" for w in flat]
        else:
            words = [self.scalar_literal(w, dtype) for w in flat]
        self.constants.append(f"__device__ const {st} {name}[{arr.size}] = {{{', '.join(words)}}};")
        lin = "0"
        for i, d in zip(idx, arr.shape):
            lin = i if lin == "0" else f"({lin}) * {d}LL + {i}"
        return self.assign(ct, _base(inst), load(f"{name}[{lin}]", dtype), comment)

    # --- index arithmetic ------------------------------------------------------------------------
    def delinearize(self, base: str, lin: str, dims: Sequence[int]) -> list[str]:
        """Row-major per-dim indices of the linear index ``lin`` over ``dims``."""
        out: list[str] = []
        stride = math.prod(dims)
        for d, size in enumerate(dims):
            stride //= max(size, 1)
            if size == 1:
                out.append("0")
                continue
            e = lin if stride == 1 else f"{lin} / {stride}LL"
            if d > 0:
                e = f"({e}) % {size}LL"
            out.append(self.index(f"{base}_d{d}", e))
        return out

    def _reshape_index(self, inst: Instruction, idx: Index) -> Index:
        src_shape, dst_shape = inst.operands[0].shape, inst.shape
        if inst.opcode == "bitcast":
            # A bitcast reinterprets physical memory: linearize in physical order.
            from hlo.layout_util import major_to_minor
            dst_order = major_to_minor(dst_shape.layout, dst_shape.rank)
            src_order = major_to_minor(src_shape.layout, src_shape.rank)
        else:
            dst_order = tuple(range(dst_shape.rank))
            src_order = tuple(range(src_shape.rank))
        sq_dst = [d for d in dst_order if dst_shape.dims[d] != 1]
        sq_src = [d for d in src_order if src_shape.dims[d] != 1]
        if [dst_shape.dims[d] for d in sq_dst] == [src_shape.dims[d] for d in sq_src]:
            out = ["0"] * src_shape.rank       # only size-1 dims differ: one to one
            for a, b in zip(sq_src, sq_dst):
                out[a] = idx[b]
            return tuple(out)
        lin = "0"
        for d in dst_order:
            lin = idx[d] if lin == "0" else f"({lin}) * {dst_shape.dims[d]}LL + {idx[d]}"
        lin_name = self.index(f"lin_{_base(inst)}", lin)
        phys = self.delinearize(f"i_{_base(inst)}", lin_name, [src_shape.dims[d] for d in src_order])
        out = ["0"] * src_shape.rank
        for pos, d in enumerate(src_order):
            out[d] = phys[pos]
        return tuple(out)

    def _pad(self, inst: Instruction, idx: Index, comment: str) -> str:
        operand, pad_value = inst.operands
        dims = operand.shape.dims
        conds, src = [], []
        for d, (i, pd) in enumerate(zip(idx, inst.attrs["padding"].dims)):
            step = pd.interior + 1
            t = i if pd.low == 0 else self.index(f"t_{_base(inst)}", f"{i} - ({pd.low}LL)")
            q = t if step == 1 else self.index(f"q_{_base(inst)}", f"{t} / {step}LL")
            cond = f"{t} >= 0 && {q} < {dims[d]}LL"
            if step != 1:
                cond += f" && {t} % {step}LL == 0"
            conds.append(f"({cond})")
            src.append(self.index(f"i_{_base(inst)}", f"{q} < 0 ? 0LL : ({q} > {dims[d] - 1}LL ? "
                                                   f"{dims[d] - 1}LL : {q})"))
        inside = self.assign("bool", f"in_{_base(inst)}", " && ".join(conds) if conds else "true")
        v = self.value(operand, tuple(src))
        pv = self.value(pad_value, ())
        return self.assign(self.held(inst.shape.dtype), _base(inst), f"{inside} ? {v} : {pv}", comment)

    def _concatenate(self, inst: Instruction, idx: Index, comment: str) -> str:
        (d,) = inst.attrs["dimensions"]
        offsets, off = [], 0
        for o in inst.operands:
            offsets.append(off)
            off += o.shape.dims[d]
        vals = []
        for o, start in zip(inst.operands, offsets):
            n = o.shape.dims[d]
            e = f"{idx[d]} - {start}LL"
            src = list(idx)
            src[d] = self.index(f"i_{_base(inst)}", f"{e} < 0 ? 0LL : ({e} > {n - 1}LL ? "
                                                 f"{n - 1}LL : {e})")
            vals.append(self.value(o, tuple(src)))
        expr = vals[-1]
        for v, start in reversed(list(zip(vals[:-1], offsets[1:]))):
            expr = f"({idx[d]} < {start}LL ? {v} : {expr})"
        return self.assign(self.held(inst.shape.dtype), _base(inst), expr, comment)

    # --- elementwise ---------------------------------------------------------------------------
    def elementwise_expr(self, inst: Instruction, args: list[str]) -> str:
        op = inst.opcode
        out = inst.shape.dtype
        src = inst.operands[0].shape.dtype if inst.operands else out
        if out.is_complex or src.is_complex:
            raise self.declined(inst, "complex numbers")
        if op == "convert":
            return self.convert_expr(args[0], src, out)
        if op == "bitcast-convert":
            return self._bitcast_convert(inst, args[0], src, out)
        if op == "select":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        if op == "clamp":
            lo, x, hi = args
            if out.is_float:
                f = ("hl_max", "hl_min") if out.name == "f64" else ("hl_maxf", "hl_minf")
                return f"{f[1]}({f[0]}({x}, {lo}), {hi})"
            m = self.assign(self.held(out), f"m_{_base(inst)}", f"{x} < {lo} ? {lo} : {x}")
            return f"({m} > {hi} ? {hi} : {m})"
        if op == "compare":
            ctype = str(inst.attrs.get("type", "") or "")
            if ctype == "TOTALORDER":
                raise self.declined(inst, "compare type=TOTALORDER")
            return f"({args[0]} {_COMPARE[str(inst.attrs['direction'])]} {args[1]})"
        if op == "is-finite":
            zero = "0.0" if src.name == "f64" else "0.0f"
            return f"({args[0]} - {args[0]} == {zero})"      # inf - inf and NaN - NaN: NaN
        if op == "not":
            return f"(!{args[0]})" if src.is_pred else f"(({self.held(out)})~{args[0]})"
        if op in ("shift-left", "shift-right-logical", "shift-right-arithmetic"):
            return self._shift(inst, args)
        if op in ("popcnt", "count-leading-zeros") and out.is_integer:
            return self._bit_count(inst, args[0])
        if out.is_float:
            f64 = out.name == "f64"
            table = _FLOAT_UNARY if len(args) == 1 else _FLOAT_BINARY
            if op in table:
                f32_form, f64_form = table[op]
                form = (f64_form or f32_form) if f64 else f32_form
                return self.narrow(form.format(*args), out)
        if out.is_integer:
            return self._int_op(inst, args)
        if out.is_pred:
            a = args
            if op in ("and", "multiply", "minimum"):
                return f"({a[0]} && {a[1]})"
            if op in ("or", "add", "maximum"):
                return f"({a[0]} || {a[1]})"
            if op in ("xor", "subtract"):
                return f"({a[0]} != {a[1]})"
        raise self.declined(inst, f"no CUDA C lowering for {op} on {out.name}")

    def _int_op(self, inst: Instruction, args: list[str]) -> str:
        op, dtype = inst.opcode, inst.shape.dtype
        ct = self.held(dtype)
        # Arithmetic in the unsigned type of the same width: wraps (signed overflow is
        # undefined in C), then cast back.
        ut = _UNSIGNED.get(dtype.name, ct)
        lo, hi = int_range(dtype)
        a = args
        wrap = {"add": "+", "subtract": "-", "multiply": "*", "and": "&", "or": "|", "xor": "^"}
        if op in wrap:
            return f"(({ct})(({ut}){a[0]} {wrap[op]} ({ut}){a[1]}))"
        if op == "maximum":
            return f"({a[0]} > {a[1]} ? {a[0]} : {a[1]})"
        if op == "minimum":
            return f"({a[0]} < {a[1]} ? {a[0]} : {a[1]})"
        if op == "negate":
            return f"(({ct})(({ut})0 - ({ut}){a[0]}))"
        if op == "abs":
            return f"({a[0]} < 0 ? ({ct})(({ut})0 - ({ut}){a[0]}) : {a[0]})"
        if op == "sign":
            return f"(({ct})({a[0]} > 0 ? 1 : ({a[0]} < 0 ? -1 : 0)))"
        if op == "divide":
            # XLA: x / 0 = -1 (unsigned: all ones), INT_MIN / -1 = INT_MIN, truncation.
            if dtype.kind == "uint":
                return f"({a[1]} == 0 ? {int_literal(hi, dtype)} : ({ct})({a[0]} / {a[1]}))"
            return (f"({a[1]} == 0 ? ({ct})-1 : ({a[0]} == {int_literal(lo, dtype)} && "
                    f"{a[1]} == -1 ? {a[0]} : ({ct})({a[0]} / {a[1]})))")
        if op == "remainder":
            if dtype.kind == "uint":
                return f"({a[1]} == 0 ? {a[0]} : ({ct})({a[0]} % {a[1]}))"
            return f"({a[1]} == 0 ? {a[0]} : ({a[1]} == -1 ? ({ct})0 : ({ct})({a[0]} % {a[1]})))"
        raise self.declined(inst, f"no CUDA C lowering for {op} on {dtype.name}")

    def _shift(self, inst: Instruction, args: list[str]) -> str:
        a, b = args
        dtype = inst.shape.dtype
        ct = self.held(dtype)
        bits = dtype.bits
        ut = _UNSIGNED.get(dtype.name, ct)
        st = _SIGNED.get(ct, ct)
        big = f"(({ut}){b} >= {bits}u)"      # a negative count is huge unsigned: out of range
        if inst.opcode == "shift-left":
            return f"({big} ? ({ct})0 : ({ct})(({ut}){a} << {b}))"
        if inst.opcode == "shift-right-logical":
            return f"({big} ? ({ct})0 : ({ct})(({ut}){a} >> {b}))"
        sa = f"(({C_HELD[st]}){a})" if dtype.kind == "uint" else a
        return f"(({ct})({big} ? ({sa} >> {bits - 1}) : ({sa} >> {b})))"

    def _bit_count(self, inst: Instruction, x: str) -> str:
        dtype = inst.shape.dtype
        ct = self.held(dtype)
        ut = _UNSIGNED.get(dtype.name, ct)
        bits = dtype.bits
        if bits == 64:
            e = (f"__popcll((unsigned long long)({ut}){x})" if inst.opcode == "popcnt" else
                 f"__clzll((long long)({ut}){x})")
        else:
            w = f"(unsigned int)({ut}){x}"
            e = f"__popc({w})" if inst.opcode == "popcnt" else f"(__clz((int)({w})) - {32 - bits})"
        return f"(({ct})({e}))"

    def _bitcast_convert(self, inst: Instruction, x: str, src: DType, dst: DType) -> str:
        if src.bits != dst.bits:
            raise self.declined(inst, "bitcast-convert between different widths")
        if src == dst:
            return x
        # to the bits (an unsigned integer of the width), then to the destination
        if src.name == "f32":
            bits = f"__float_as_uint({x})"
        elif src.name == "f64":
            bits = f"(unsigned long long)__double_as_longlong({x})"
        elif is_narrow(src):
            bits = self.to_stored(x, src)
        elif src.is_integer:
            bits = f"({_UNSIGNED.get(src.name, C_HELD[src.name])}){x}"
        else:
            raise self.declined(inst, f"bitcast-convert from {src.name}")
        if dst.name == "f32":
            return f"__uint_as_float((unsigned int)({bits}))"
        if dst.name == "f64":
            return f"__longlong_as_double((long long)({bits}))"
        if is_narrow(dst):
            return self.from_stored(f"(unsigned short)({bits})", dst)
        if dst.is_integer:
            return f"(({C_HELD[dst.name]})({bits}))"
        raise self.declined(inst, f"bitcast-convert to {dst.name}")

    def convert_expr(self, x: str, src: DType, dst: DType) -> str:
        """XLA's convert: RNE between floats, saturating float -> int (NaN -> 0), wrapping
        int -> int, != 0 to pred."""
        if src == dst:
            return x
        ct = self.held(dst)
        if dst.is_pred:
            return f"({x} != 0)"
        if src.is_pred:
            return f"(({ct})({x} ? 1 : 0))"
        if dst.is_float:
            if not is_narrow(dst):
                return f"(({ct}){x})"
            if src.name in ("f32", "bf16", "f16"):
                return self.round_to(x, dst)     # held as f32: exact, then one rounding
            if src.is_integer and src.bits <= 16:
                return self.round_to(f"(float){x}", dst)      # exact in f32
            wide = x if src.name == "f64" else f"(double){x}"
            return self.round_to(f"hl_f64_to_f32_odd({wide})", dst)
        if dst.is_integer and src.is_float:
            lo, hi = int_range(dst)
            w = f"(double){x}" if dst.bits >= 32 or src.name == "f64" else f"(float){x}"
            fx = "" if dst.bits >= 32 or src.name == "f64" else "f"
            return (f"({x} != {x} ? ({ct})0 : ({w} >= {float(hi) + 1.0!r}{fx} ? "
                    f"{int_literal(hi, dst)} : ({w} <= {float(lo)!r}{fx} ? {int_literal(lo, dst)} "
                    f": ({ct}){x})))")
        return f"(({ct}){x})"

    # --- called computations inlined on scalars ------------------------------------------------
    def _inline_scalar(self, comp: Computation, args: list[str]) -> str:
        env: dict[int, str] = {}
        for p, a in zip(comp.parameters, args):
            env[id(p)] = a
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                continue
            if inst.opcode == "constant":
                env[id(inst)] = self._constant(inst, (), self._comment(inst))
                continue
            if inst.shape.is_tuple or inst.shape.rank != 0 or inst.opcode not in ELEMENTWISE:
                raise self.declined(inst, "a map body with more than scalar elementwise ops")
            ops = [env[id(o)] for o in inst.operands]
            env[id(inst)] = self.assign(self.held(inst.shape.dtype), _base(inst),
                                        self.elementwise_expr(inst, ops), self._comment(inst))
        return env[id(comp.root)]


def _base(inst: Instruction) -> str:
    """A variable's base name: its op (a parameter: its number), never the HLO name (that
    is in the line's comment), so fusions computing the same thing emit the same code
    apart from comments, and share one compile (``compile_text``)."""
    if inst.opcode == "parameter":
        return f"param{inst.parameter_number}"
    return inst.opcode.replace("-", "_")


_COMMENT = re.compile(r"/\*.*?\*/", re.S)


def compile_text(source: str) -> str:
    """What NVRTC compiles (and the cubin cache keys on): ``source`` without its comments
    (the HLO names and text), each comment's line breaks kept so NVRTC's line numbers are
    the file's."""
    return _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), source)


def _term(i: str, stride: str) -> str:
    if i == "0":
        return "0"
    if i == "1":
        return stride
    return f"{i} * {stride}"


from hlo.dtypes import by_name as _by_name  # noqa: E402
_S64 = _by_name("s64")


# --- whole kernels ---------------------------------------------------------------------------
def decline_reason(fusion: Instruction) -> str:
    """"" where ``emit_loop_kernel`` takes this fusion, else why not (cheap: no emitting)."""
    if fusion.opcode != "fusion":
        return f"%{fusion.name} is a {fusion.opcode}, not a fusion"
    from codegen.triton.kernel import classify
    kind = classify(fusion)
    if kind != "loop":
        return f"a {kind} fusion (the CUDA C emitter takes loop fusions)"
    comp: Computation = fusion.attrs["calls"]
    for inst in comp.instructions:
        if inst.opcode not in INDEX_OPS and inst.opcode not in ELEMENTWISE:
            return f"%{inst.name} is a {inst.opcode}"
        if inst.shape.is_tuple:
            if inst is not comp.root and inst.opcode != "tuple":
                return f"%{inst.name} has a tuple shape"
            continue
        if inst.shape.dtype.name not in C_HELD:
            return f"%{inst.name} has element type {inst.shape.dtype.name}"
    if comp.root.opcode == "tuple" and any(o.shape.is_tuple for o in comp.root.operands):
        return "a nested tuple result"
    return ""


def kernel_name(comp: Computation) -> str:
    from codegen.triton.kernel import kernel_name as triton_name
    return triton_name(comp)


def _header(fusion: Instruction, comp: Computation, name: str,
            form: str = "one thread per output element,") -> str:
    text = comp.to_text(print_metadata=False, print_large_constants=False)
    lines = [f"{name}: CUDA C kernel generated by hlotk (codegen/cuda_c, {GENERATOR_VERSION}),",
             f"{form} for fusion %{fusion.name}:", ""]
    lines += ["  " + ln for ln in text.splitlines()]
    return "/*\n" + "\n".join(" * " + ln.replace("*/", "* /") for ln in lines) + "\n */"


def per_thread_for(n: int, groups: int) -> int:
    """Output elements each thread computes. One f32 element and one 4-byte load per operand
    a thread left the H200's memory system short of requests: an Adam step over 18.9M
    parameters ran at 45% of copy bandwidth where Triton's kernels (8 elements a thread)
    reached 60% (benchmarks/NOTES.md, i13-nvrtc). Four elements, their loads issued before
    any store, for outputs of 2^19 elements or more; small outputs keep one (more blocks)."""
    if groups != 1:
        return 1
    forced = os.environ.get(PER_THREAD_ENV, "").strip()
    if forced:
        if not forced.isdigit() or not 1 <= int(forced) <= 16:
            raise CudaCodegenError(f"{PER_THREAD_ENV}={forced!r}: expected 1 to 16")
        return int(forced)
    return 4 if n >= PER_THREAD_FROM else 1


PER_THREAD_FROM = 1 << 19
PER_THREAD_ENV = "HLOTK_CUDA_C_PER_THREAD"    # a fixed count, to compare on a GPU


def _emit_stores(em: CEmitter, outs: list, ks: list[int], idx: Index, values: dict,
                 guard: str = "") -> None:
    for k in ks:
        o, v = outs[k], values[k]
        terms = [_term(i, f"so{k}_{d}") for d, i in enumerate(idx)]
        terms = [x for x in terms if x != "0"]
        em.line(f"{guard}out{k}[{' + '.join(terms) if terms else '0'}] = "
                f"{em.to_stored(v, o.shape.dtype)};", f"output {k}: %{o.name}")


def emit_loop_kernel(fusion: Instruction, round_narrow_each_op: bool = True,
                     per_thread: Optional[int] = None,
                     flat: Optional[bool] = None) -> KernelSource:
    """CUDA C for one loop fusion; raises ``CudaCDeclined`` for a fusion it does not take.
    ``flat``: the flat form (``flat.py``: element count as an argument, 16-byte vectors)
    where the fusion has one and no ``per_thread`` is asked for (None, the default), always
    (True: CudaCodegenError where it has none) or never (False: the strided form).
    ``per_thread``: the strided form's output elements per thread (``per_thread_for``'s
    choice by default; more than one only where every output has the same shape)."""
    why = decline_reason(fusion)
    if why:
        raise CudaCDeclined(f"fusion %{fusion.name}: {why}")
    if flat or (flat is None and per_thread is None):
        from .flat import emit_flat_kernel, flat_reason
        if flat or not flat_reason(fusion):
            return emit_flat_kernel(fusion, round_narrow_each_op)
    comp: Computation = fusion.attrs["calls"]
    em = CEmitter(fusion.name, round_narrow_each_op)
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    root = comp.root
    outs = list(root.operands) if root.opcode == "tuple" else [root]
    for p in params:
        em.param_strides[p.parameter_number] = [f"s{p.parameter_number}_{d}"
                                                for d in range(p.shape.rank)]
    n_max = max(math.prod(o.shape.dims) for o in outs)
    groups: dict[tuple, list[int]] = {}
    for k, o in enumerate(outs):
        groups.setdefault(tuple(o.shape.dims), []).append(k)
    per = per_thread or per_thread_for(n_max, len(groups))
    em.hoist_scalars = len(groups) == 1      # no nested C blocks: one scope for the body
    if per > 1 and len(groups) > 1:
        raise CudaCodegenError(f"fusion %{fusion.name}: {per} elements a thread needs outputs "
                               "of one shape")
    if per > 1:
        # Element j of this thread: t0 + j * THREADS (a warp's accesses stay adjacent).
        # Each element's values (its loads) come first, the stores last: the loads of all
        # of them are in flight together, and no store can change what the thread reads
        # (an output may share an input's buffer). An element past the end reads at the
        # last element (in range) and stores nothing.
        (dims, ks), = groups.items()
        n = n_max
        em.line(f"const long long t0 = (long long)blockIdx.x * {per * THREADS}LL + threadIdx.x;",
                f"this thread's first output element of {per}, {THREADS} apart")
        em.line(f"if (t0 >= {n}LL) return;")
        per_idx, per_values = [], []
        for j in range(per):
            t = "t0"
            if j:
                em.line(f"const long long u{j} = t0 + {j * THREADS}LL;")
                t = f"t{j}"
                em.line(f"const long long {t} = u{j} < {n}LL ? u{j} : {n - 1}LL;")
            em.scopes.append({})
            idx = tuple(em.delinearize(f"i{j}", t, dims))
            per_values.append({k: em.value(outs[k], idx) for k in ks})
            per_idx.append(idx)
            em.scopes.pop()
        for j in range(per):
            _emit_stores(em, outs, ks, per_idx[j], per_values[j],
                         guard=f"if (u{j} < {n}LL) " if j else "")
    else:
        em.line("const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
                "this thread's output element")
    for dims, ks in (groups.items() if per == 1 else ()):
        n = math.prod(dims)
        one = len(groups) == 1
        if one:
            em.line(f"if (t >= {n}LL) return;")
        else:     # outputs of other shapes: each its own guarded block and memo scope
            em.line(f"if (t < {n}LL) {{")
            em.indent += 1
            em.scopes.append({})
        idx = tuple(em.delinearize("i", "t", dims))
        # Every value before any store: an output written over an input's buffer (buffer
        # assignment's sharing) cannot change what this thread reads afterwards.
        values = {k: em.value(outs[k], idx) for k in ks}
        _emit_stores(em, outs, ks, idx, values)
        if not one:
            em.scopes.pop()
            em.indent -= 1
            em.line("}")
    name = kernel_name(comp)
    args: list[tuple[str, str]] = []
    for p in params:
        args.append((f"const {C_STORED[p.shape.dtype.name]}*", f"p{p.parameter_number}"))
    for k, o in enumerate(outs):
        args.append((f"{C_STORED[o.shape.dtype.name]}*", f"out{k}"))
    for p in params:
        args += [("long long", s) for s in em.param_strides[p.parameter_number]]
    for k, o in enumerate(outs):
        args += [("long long", f"so{k}_{d}") for d in range(o.shape.rank)]
    body = "\n".join(em.lines)
    sig = ",\n    ".join(f"{t} {n}" for t, n in args)
    parts = [_header(fusion, comp, name), "", prelude_for(body + "\n".join(em.constants))]
    parts += em.constants
    parts += ["", f'extern "C" __global__ void {name}(\n    {sig}) {{', body, "}"]
    source = "\n".join(p for p in parts if p is not None) + "\n"
    return KernelSource(name=name, source=source, params=args, n_inputs=len(params),
                        n_outputs=len(outs), input_shapes=[p.shape for p in params],
                        output_shapes=[o.shape for o in outs], threads=THREADS,
                        elements=n_max, per_thread=per)
