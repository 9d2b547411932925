"""The elemental emitter: Triton expressions for "the value of instruction X at index I".

This is XLA's elemental IR emitter in Python-source form. An index is a tuple of Triton
expressions, one per logical dimension of the instruction; each may be a scalar or a
tensor of any broadcastable shape ([BLOCK], [BM, 1], [1, BN], ...). Asking for a value
emits one line per HLO instruction (named after it, its HLO in a trailing comment) and
memoizes it per (instruction, index), inside the current loop scope.

Index arithmetic keeps every index in range (callers clamp the tile's own indices; pad,
concatenate, dynamic slices and gathers clamp theirs), so parameter loads need no mask:
only stores and reductions look at masks. (A flat loop kernel, ``flat_loop.py``, has no
coordinates to clamp: its loads take the store's mask.)

Numerics: values live in their HLO element type; an elementwise op on bf16/f16 computes in
f32 and rounds back after each op (``round_narrow_each_op=True``, what our reference
interpreter does); with False, narrow floats stay in f32 between ops and are rounded only
by explicit converts and stores.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Optional, Sequence, Union

import numpy as np

from hlo.dtypes import DType
from hlo.errors import HlotkError, UnimplementedError
from hlo.ir import Computation, Instruction

Index = tuple[str, ...]
Value = Union[str, tuple]   # an expression name, or a tuple of them (variadic reduce)


class TritonCodegenError(UnimplementedError):
    """A fusion (or an op inside one) the Triton code generator cannot turn into a kernel."""


TL_TYPES = {
    "pred": "tl.int1", "s8": "tl.int8", "s16": "tl.int16", "s32": "tl.int32", "s64": "tl.int64",
    "u8": "tl.uint8", "u16": "tl.uint16", "u32": "tl.uint32", "u64": "tl.uint64",
    "f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32", "f64": "tl.float64",
}


def tl_type(dtype: DType, where: str = "") -> str:
    try:
        return TL_TYPES[dtype.name]
    except KeyError:
        raise TritonCodegenError(f"element type {dtype.name} is not supported by the Triton "
                                 f"code generator{where}") from None


def is_narrow_float(dtype: DType) -> bool:
    return dtype.name in ("bf16", "f16")


def float_literal(x: float) -> str:
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else '-float("inf")'
    return repr(float(x))


def scalar_literal(value: np.generic, dtype: DType) -> str:
    if dtype.is_pred:
        return "1" if bool(value) else "0"
    if dtype.is_integer:
        return str(int(value))
    return float_literal(float(np.float64(value)))


def int_range(dtype: DType) -> tuple[int, int]:
    if dtype.kind == "uint":
        return 0, (1 << dtype.bits) - 1
    return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1


# Elementwise ops whose Triton spelling is a format string over the operand expressions.
# Floats: operands are f32/f64 here (narrow floats were widened by the caller).
_FLOAT_UNARY = {
    "negate": "-{0}", "abs": "tl.abs({0})", "exponential": "tl.exp({0})", "log": "tl.log({0})",
    "sqrt": "tl.sqrt({0})", "rsqrt": "tl.math.rsqrt({0})", "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})", "cosine": "tl.cos({0})", "sine": "tl.sin({0})",
    "erf": "tl.math.erf({0})", "logistic": "1.0 / (1.0 + tl.exp(-{0}))",
    "tanh": "_hl_tanh({0})", "exponential-minus-one": "_hl_expm1({0})",
    "log-plus-one": "_hl_log1p({0})", "tan": "(tl.sin({0}) / tl.cos({0}))",
    "cbrt": "_hl_cbrt({0})", "round-nearest-even": "_hl_rint({0})",
    "round-nearest-afz": "_hl_round_afz({0})",
    "sign": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, {0}))",
}
_FLOAT_BINARY = {
    "add": "{0} + {1}", "subtract": "{0} - {1}", "multiply": "{0} * {1}", "divide": "{0} / {1}",
    "remainder": "{0} % {1}", "power": "_hl_pow({0}, {1})", "atan2": "_hl_atan2({0}, {1})",
    "maximum": "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    "minimum": "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
}
_INT_BINARY = {
    "add": "{0} + {1}", "subtract": "{0} - {1}", "multiply": "{0} * {1}",
    "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})",
    "and": "{0} & {1}", "or": "{0} | {1}", "xor": "{0} ^ {1}",
}
_COMPARE = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}

# Math helpers every generated file carries. On the GPU they are libdevice calls; Triton's
# interpreter has no libdevice, so there they are written with core math (slightly less
# accurate: fine for tests, never used for timing).
HELPERS_GPU = '''
@triton.jit
def _hl_tanh(x):
    return libdevice.tanh(x)


@triton.jit
def _hl_expm1(x):
    return libdevice.expm1(x)


@triton.jit
def _hl_log1p(x):
    return libdevice.log1p(x)


@triton.jit
def _hl_cbrt(x):
    return libdevice.cbrt(x)


@triton.jit
def _hl_rint(x):
    return libdevice.rint(x)


@triton.jit
def _hl_round_afz(x):
    return libdevice.round(x)


@triton.jit
def _hl_pow(x, y):
    return libdevice.pow(x, y)


@triton.jit
def _hl_atan2(y, x):
    return libdevice.atan2(y, x)

'''

HELPERS_INTERPRET = '''
@triton.jit
def _hl_tanh(x):
    # tanh(|x|) = (1 - e) / (1 + e), e = exp(-2|x|); a cubic near 0 avoids cancellation.
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(ax < 0.005, ax - ax * ax * ax / 3.0, t)
    return tl.where(x < 0, -t, t)


@triton.jit
def _hl_expm1(x):
    return tl.where(tl.abs(x) < 1e-5, x + 0.5 * x * x, tl.exp(x) - 1.0)


@triton.jit
def _hl_log1p(x):
    return tl.where(tl.abs(x) < 1e-5, x - 0.5 * x * x, tl.log(1.0 + x))


@triton.jit
def _hl_cbrt(x):
    r = tl.exp(tl.log(tl.abs(x)) / 3.0)
    return tl.where(x < 0, -r, r)


@triton.jit
def _hl_rint(x):
    f = tl.floor(x)
    d = x - f
    even = (f - 2.0 * tl.floor(f * 0.5)) == 0.0
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(even, f, f + 1.0)))


@triton.jit
def _hl_round_afz(x):
    r = tl.floor(tl.abs(x) + 0.5)
    return tl.where(x < 0, -r, r)


@triton.jit
def _hl_pow(x, y):
    return tl.exp(y * tl.log(x))


@triton.jit
def _hl_atan2(y, x):
    # Only used by tests in the interpreter; a rough atan2 through a series is not worth it.
    return tl.where(x > 0, y / x, y / x)

'''

# Bit counting in core ops (popcnt, count-leading-zeros): the same on the GPU and in the
# interpreter.
_BIT_HELPERS = '''
@triton.jit
def _hl_popc32(x):
    # x: uint32. Bits counted in pairs, nibbles, bytes, then the bytes summed by a multiply.
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _hl_clz32(x):
    # x: uint32. Its bit length by binary search; clz = 32 - length.
    n = tl.zeros(x.shape, tl.int32)
    big = x >= 65536
    x = tl.where(big, x >> 16, x)
    n = tl.where(big, n + 16, n)
    big = x >= 256
    x = tl.where(big, x >> 8, x)
    n = tl.where(big, n + 8, n)
    big = x >= 16
    x = tl.where(big, x >> 4, x)
    n = tl.where(big, n + 4, n)
    big = x >= 4
    x = tl.where(big, x >> 2, x)
    n = tl.where(big, n + 2, n)
    big = x >= 2
    x = tl.where(big, x >> 1, x)
    n = tl.where(big, n + 1, n)
    return 32 - (n + x.to(tl.int32))
'''
HELPERS_GPU += _BIT_HELPERS
HELPERS_INTERPRET += _BIT_HELPERS
_HELPER_DEF = re.compile(r"@triton\.jit\ndef (_hl_\w+)\(")
_HELPER_CALL = re.compile(r"\b(_hl_\w+)\(")


def _split_helpers(text: str) -> dict[str, str]:
    """Helper name -> its definition (decorator to the next helper), in file order."""
    starts = [(m.start(), m.group(1)) for m in _HELPER_DEF.finditer(text)]
    ends = [s for s, _ in starts[1:]] + [len(text)]
    return {name: text[s:e].rstrip() + "\n" for (s, name), e in zip(starts, ends)}


_HELPER_DEFS = {False: _split_helpers(HELPERS_GPU), True: _split_helpers(HELPERS_INTERPRET)}


def helpers_for(code: str, interpret: bool) -> str:
    """The math helpers ``code`` calls, and only those (issue 13): each ``@triton.jit``
    function a generated file defines is a JITFunction built when the file is imported
    (Triton reads and tokenizes its source then, ~0.3 ms each), and Triton's key of a
    kernel covers only the functions it calls, so the ten unused ones cost every warm
    process their construction and change no compiled binary."""
    used = set(_HELPER_CALL.findall(code))
    defs = _HELPER_DEFS[bool(interpret)]
    return "\n\n".join(src for name, src in defs.items() if name in used)


def _is_int_literal(e: str) -> bool:
    return e.lstrip("-").isdigit()


class Emitter:
    """Accumulates source lines for one kernel body and memoizes values per loop scope."""

    def __init__(self, fusion_name: str, round_narrow_each_op: bool = True):
        self.fusion_name = fusion_name
        self.round_narrow = round_narrow_each_op
        self.lines: list[str] = []
        self.indent = 1
        self.scopes: list[dict] = [{}]
        self.counter = 0
        self.params: dict[int, str] = {}          # parameter_number -> pointer arg name
        self.param_strides: dict[int, list[str]] = {}
        # Output number -> stride expressions a template substitutes for so{k}_{d} (a
        # column kernel's copy of its loop with strides known to be aligned).
        self.out_strides: dict[int, list[str]] = {}
        self.bound: list[dict] = [{}]             # values a template pre-binds (dot accs, reduces)
        self.combine_fns: dict[str, str] = {}     # name -> source of @triton.jit combiners
        self.reduce_handler: Optional[Callable[[Instruction, Index], Value]] = None
        self.dot_handler: Optional[Callable[[Instruction, Index], Value]] = None
        self.extra_constants: list[np.ndarray] = []   # array constants passed as inputs
        # The name of a [BLOCK] index tensor when every index of this kernel is a scalar or
        # [BLOCK]-shaped (the loop template): parameter reads at a constant position of a
        # small minor dim then load the whole minor row as one tile (``minor_tiles.py``).
        self.tile_rows: Optional[str] = None
        self.tiles_used = False
        # (offsets, mask) of a flat loop kernel (``flat_loop.py``): every full-size parameter
        # is read at ``ptr + offsets`` under the mask, a one-element one at ``ptr``.
        self.flat: Optional[tuple[str, str]] = None

    # --- lines and scopes ------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.counter += 1
        base = "".join(c if c.isalnum() else "_" for c in base).strip("_") or "v"
        return f"{base}_{self.counter}"

    def line(self, text: str, comment: str = "") -> None:
        pad = "    " * self.indent
        self.lines.append(f"{pad}{text}" + (f"  # {comment}" if comment else ""))

    def assign(self, base: str, expr: str, comment: str = "") -> str:
        name = self.fresh(base)
        self.line(f"{name} = {expr}", comment)
        return name

    def push_scope(self) -> None:
        self.scopes.append({})
        self.indent += 1

    def pop_scope(self) -> None:
        self.scopes.pop()
        self.indent -= 1

    def lookup(self, key) -> Optional[Value]:
        for s in reversed(self.scopes):
            if key in s:
                return s[key]
        return None

    def bind(self, inst: Instruction, idx: Index, value: Value, outer: bool = False) -> None:
        (self.scopes[0] if outer else self.scopes[-1])[(id(inst), idx)] = value

    # --- dtypes ----------------------------------------------------------------------------
    def repr_type(self, dtype: DType) -> str:
        """The Triton type a value of ``dtype`` is held in between ops."""
        if is_narrow_float(dtype) and not self.round_narrow:
            return "tl.float32"
        return tl_type(dtype, f" (fusion %{self.fusion_name})")

    def compute_type(self, dtype: DType) -> str:
        return "tl.float32" if is_narrow_float(dtype) else tl_type(dtype)

    def widen(self, expr: str, dtype: DType) -> str:
        if is_narrow_float(dtype) and self.round_narrow:
            return f"{expr}.to(tl.float32)"
        return expr

    def narrow(self, expr: str, dtype: DType) -> str:
        if is_narrow_float(dtype) and self.round_narrow:
            return f"({expr}).to({tl_type(dtype)})"
        return expr

    # --- the elemental emitter ---------------------------------------------------------------
    def value(self, inst: Instruction, idx: Index) -> Value:
        key = (id(inst), tuple(idx))
        hit = self.lookup(key)
        if hit is not None:
            return hit
        v = self._generate(inst, tuple(idx))
        self.scopes[-1][key] = v
        return v

    def _unsupported(self, inst: Instruction, why: str = "") -> TritonCodegenError:
        return TritonCodegenError(
            f"fusion %{self.fusion_name}: cannot generate Triton code for %{inst.name} "
            f"({inst.opcode}){': ' + why if why else ''}")

    def _comment(self, inst: Instruction) -> str:
        from hlo.text.printer import print_instruction
        text = print_instruction(inst, print_metadata=False, print_large_constants=False,
                                 print_backend_config=False).strip().replace("\n", " ")
        return text if len(text) <= 160 else text[:157] + "..."

    def _generate(self, inst: Instruction, idx: Index) -> Value:
        op = inst.opcode
        c = self._comment(inst)
        if op == "parameter":
            return self._load_param(inst, idx, c)
        if op == "constant":
            return self._constant(inst, idx, c)
        if op == "iota":
            d = inst.attrs["iota_dimension"]
            return self.assign(inst.name, f"({idx[d]} + tl.zeros([1], tl.int32)).to("
                                          f"{self.repr_type(inst.shape.dtype)})", c)
        if op in ("broadcast",):
            return self.value(inst.operands[0], tuple(idx[d] for d in inst.attrs["dimensions"]))
        if op in ("copy",):
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
                if _is_int_literal(i):
                    # A constant position stays a literal: the memo then sees two slices
                    # reading the same element as one load, and minor_tiles sees a constant.
                    src.append(str(int(i) * sd.stride + sd.start))
                    continue
                e = i if sd.stride == 1 else f"{i} * {sd.stride}"
                src.append(e if sd.start == 0 else f"({e} + {sd.start})")
            return self.value(inst.operands[0], tuple(self._name_index(inst, src)))
        if op == "reverse":
            dims = inst.operands[0].shape.dims
            src = [f"({dims[d] - 1} - {i})" if d in inst.attrs["dimensions"] else i
                   for d, i in enumerate(idx)]
            return self.value(inst.operands[0], tuple(self._name_index(inst, src)))
        if op == "pad":
            return self._pad(inst, idx, c)
        if op == "concatenate":
            return self._concatenate(inst, idx, c)
        if op == "dynamic-slice":
            return self._dynamic_slice(inst, idx)
        if op == "gather":
            from .gather import emit_gather
            return emit_gather(self, inst, idx)
        if op == "dynamic-update-slice":
            return self._dynamic_update_slice(inst, idx, c)
        if op == "get-tuple-element":
            src = inst.operands[0]
            if src.opcode == "tuple":
                return self.value(src.operands[inst.attrs["index"]], idx)
            v = self.value(src, idx)
            if not isinstance(v, tuple):
                raise self._unsupported(inst, "tuple operand did not produce a tuple")
            return v[inst.attrs["index"]]
        if op == "reduce":
            if self.reduce_handler is None:
                raise self._unsupported(inst, "no reduction strategy in this template")
            return self.reduce_handler(inst, idx)
        if op == "dot":
            if self.dot_handler is None:
                raise self._unsupported(inst, "no dot strategy in this template")
            return self.dot_handler(inst, idx)
        if op == "map":
            args = [self.value(o, idx) for o in inst.operands]
            return self.inline_scalar(inst.attrs["to_apply"], list(args))
        # Elementwise: every operand at the same index (scalars of clamp at index ()).
        args = []
        for o in inst.operands:
            oi = () if (o.shape.rank == 0 and inst.shape.rank > 0) else idx
            v = self.value(o, oi)
            if isinstance(v, tuple):
                raise self._unsupported(inst, "tuple-valued operand")
            args.append(v)
        return self.elementwise(inst, args, c)

    # --- leaves --------------------------------------------------------------------------------
    def _load_param(self, inst: Instruction, idx: Index, comment: str) -> str:
        if self.flat is not None:
            # No coordinates: the flat offsets (masked, as the last block runs past the
            # runtime element count) or, for one element, its only address.
            offs, mask = self.flat
            ptr = self.params[inst.parameter_number]
            load = (f"tl.load({ptr})" if math.prod(inst.shape.dims) == 1
                    else f"tl.load({ptr} + {offs}, mask={mask})")
            if is_narrow_float(inst.shape.dtype) and not self.round_narrow:
                load += ".to(tl.float32)"
            return self.assign(inst.name, load, comment)
        if self.tile_rows is not None:
            from .minor_tiles import tile_column
            col = tile_column(self, inst, idx, comment)
            if col is not None:
                return col
        n = inst.parameter_number
        ptr = self.params[n]
        strides = self.param_strides[n]
        terms = [f"{i} * {s}" for i, s in zip(idx, strides)]
        addr = ptr + (" + " + " + ".join(terms) if terms else "")
        load = f"tl.load({addr})"
        if is_narrow_float(inst.shape.dtype) and not self.round_narrow:
            load += ".to(tl.float32)"
        return self.assign(inst.name, load, comment)

    def _constant(self, inst: Instruction, idx: Index, comment: str) -> str:
        lit = inst.literal
        dtype = inst.shape.dtype
        if lit is None:
            raise self._unsupported(inst, "elided constant literal {...}")
        arr = np.asarray(lit)
        if arr.size and np.all(arr.reshape(-1) == arr.reshape(-1)[0]) or arr.size == 1:
            first = arr.reshape(-1)[0]
            if dtype.is_float and np.isnan(np.float64(first)):
                pass
            return self.assign(inst.name, f"tl.full([1], {scalar_literal(first, dtype)}, "
                                          f"{self.repr_type(dtype)})", comment)
        # A non-uniform array constant travels as a hidden input (a device copy made once).
        k = len(self.extra_constants)
        self.extra_constants.append(arr)
        ptr, strides = f"const{k}", [f"sc{k}_{d}" for d in range(arr.ndim)]
        terms = [f"{i} * {s}" for i, s in zip(idx, strides)]
        load = f"tl.load({ptr} + {' + '.join(terms)})"
        if is_narrow_float(dtype) and not self.round_narrow:
            load += ".to(tl.float32)"
        return self.assign(inst.name, load, comment)

    # --- index arithmetic --------------------------------------------------------------------
    def _name_index(self, inst: Instruction, exprs: Sequence[str]) -> list[str]:
        out = []
        for e in exprs:
            if e.isidentifier() or e.lstrip("-").isdigit():
                out.append(e)
            else:
                out.append(self.assign(f"i_{inst.name}", e))
        return out

    def linearize(self, idx: Sequence[str], dims: Sequence[int]) -> str:
        expr = "0"
        for i, d in zip(idx, dims):
            expr = i if expr == "0" else f"({expr}) * {d} + {i}"
        return expr

    def delinearize(self, base: str, lin: str, dims: Sequence[int]) -> list[str]:
        """Row-major per-dim indices of the linear index ``lin`` over ``dims``."""
        out: list[str] = []
        stride = 1
        strides = []
        for d in reversed(dims):
            strides.append(stride)
            stride *= d
        strides.reverse()
        for d, (size, st) in enumerate(zip(dims, strides)):
            if size == 1:
                out.append("0")
                continue
            e = lin if st == 1 else f"{lin} // {st}"
            if d > 0 and size * st != stride:
                e = f"({e}) % {size}"
            elif d > 0:
                e = f"({e}) % {size}"
            out.append(self.assign(f"{base}_d{d}", e))
        return out

    def _reshape_index(self, inst: Instruction, idx: Index) -> Index:
        src_shape = inst.operands[0].shape
        dst_shape = inst.shape
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
            # Only size-1 dims differ: map the others one to one.
            out = ["0"] * src_shape.rank
            for a, b in zip(sq_src, sq_dst):
                out[a] = idx[b]
            return tuple(out)
        lin = self.linearize([idx[d] for d in dst_order], [dst_shape.dims[d] for d in dst_order])
        lin_name = self.assign(f"lin_{inst.name}", lin)
        phys = self.delinearize(f"i_{inst.name}", lin_name, [src_shape.dims[d] for d in src_order])
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
            t = i if pd.low == 0 else self.assign(f"t_{inst.name}", f"{i} - {pd.low}")
            q = t if step == 1 else self.assign(f"q_{inst.name}", f"{t} // {step}")
            cond = f"({t} >= 0) & ({q} < {dims[d]})"
            if step != 1:
                cond += f" & ({t} % {step} == 0)"
            conds.append(f"({cond})")
            src.append(self.assign(f"i_{inst.name}", f"tl.minimum(tl.maximum({q}, 0), {dims[d] - 1})"))
        inside = self.assign(f"in_{inst.name}", " & ".join(conds) if conds else "1")
        v = self.value(operand, tuple(src))
        pv = self.value(pad_value, ())
        return self.assign(inst.name, f"tl.where({inside}, {v}, {pv})", comment)

    def _concatenate(self, inst: Instruction, idx: Index, comment: str) -> str:
        (d,) = inst.attrs["dimensions"]
        offsets, off = [], 0
        for o in inst.operands:
            offsets.append(off)
            off += o.shape.dims[d]
        vals = []
        for o, start in zip(inst.operands, offsets):
            n = o.shape.dims[d]
            e = f"tl.minimum(tl.maximum({idx[d]} - {start}, 0), {n - 1})"
            src = list(idx)
            src[d] = self.assign(f"i_{inst.name}", e)
            vals.append(self.value(o, tuple(src)))
        expr = vals[-1]
        for v, start in reversed(list(zip(vals[:-1], offsets[1:]))):
            expr = f"tl.where({idx[d]} < {start}, {v}, {expr})"
        return self.assign(inst.name, expr, comment)

    def _starts(self, inst: Instruction, first: int, sizes: Sequence[int]) -> list[str]:
        operand_dims = inst.operands[0].shape.dims
        from .gather import clamped_start
        starts = []
        for d, s in enumerate(inst.operands[first:first + len(operand_dims)]):
            raw = self.value(s, ())
            if isinstance(raw, tuple):
                raise self._unsupported(inst, "tuple-valued start index")
            starts.append(clamped_start(self, inst, raw, s.shape.dtype, operand_dims[d] - sizes[d]))
        return starts

    def _dynamic_slice(self, inst: Instruction, idx: Index) -> Value:
        starts = self._starts(inst, 1, inst.attrs["dynamic_slice_sizes"])
        src = [self.assign(f"i_{inst.name}", f"{i} + {s}") for i, s in zip(idx, starts)]
        return self.value(inst.operands[0], tuple(src))

    def _dynamic_update_slice(self, inst: Instruction, idx: Index, comment: str) -> str:
        operand, update = inst.operands[0], inst.operands[1]
        usz = update.shape.dims
        starts = self._starts(inst, 2, usz)
        conds, src = [], []
        for i, s, n in zip(idx, starts, usz):
            conds.append(f"({i} >= {s}) & ({i} < {s} + {n})")
            src.append(self.assign(f"i_{inst.name}", f"tl.minimum(tl.maximum({i} - {s}, 0), {n - 1})"))
        inside = self.assign(f"in_{inst.name}", " & ".join(conds) if conds else "1")
        uv = self.value(update, tuple(src))
        ov = self.value(operand, idx)
        return self.assign(inst.name, f"tl.where({inside}, {uv}, {ov})", comment)

    # --- elementwise ---------------------------------------------------------------------------
    def elementwise(self, inst: Instruction, args: list[str], comment: str) -> str:
        return self.assign(inst.name, self.elementwise_expr(inst, args), comment)

    def elementwise_expr(self, inst: Instruction, args: list[str]) -> str:
        op = inst.opcode
        out = inst.shape.dtype
        src = inst.operands[0].shape.dtype if inst.operands else out
        if op == "convert":
            return self.convert_expr(args[0], src, out)
        if op == "bitcast-convert":
            if src.bits != out.bits:
                raise self._unsupported(inst, "bitcast-convert between different widths")
            return f"{self._to_storage(args[0], src)}.to({tl_type(out)}, bitcast=True)"
        if op == "select":
            return f"tl.where({args[0]} != 0, {args[1]}, {args[2]})"
        if op == "clamp":
            lo, x, hi = args
            if src.is_float or is_narrow_float(src):
                return (f"tl.minimum(tl.maximum({x}, {lo}, propagate_nan=tl.PropagateNan.ALL), "
                        f"{hi}, propagate_nan=tl.PropagateNan.ALL)")
            return f"tl.minimum(tl.maximum({x}, {lo}), {hi})"
        if op == "compare":
            direction = str(inst.attrs["direction"])
            ctype = str(inst.attrs.get("type", "") or "")
            if ctype == "TOTALORDER":
                raise self._unsupported(inst, "compare type=TOTALORDER")
            a, b = (self.widen(x, src) for x in args)
            if src.is_pred:
                a, b = f"{a}.to(tl.int8)", f"{b}.to(tl.int8)"
            return f"{a} {_COMPARE[direction]} {b}"
        if op == "is-finite":
            a = self.widen(args[0], src)
            return f"({a} == {a}) & (tl.abs({a}) != float(\"inf\"))"
        if op == "not":
            return f"{args[0]} == 0" if src.is_pred else f"~{args[0]}"
        if op in ("shift-left", "shift-right-logical", "shift-right-arithmetic"):
            return self._shift(inst, args)
        if op in ("popcnt", "count-leading-zeros") and out.is_integer:
            return self._bit_count(inst, args[0])
        if op == "reduce-precision" and out.is_float and not out.is_complex:
            return self.narrow(self._reduce_precision(inst, self.widen(args[0], src)), out)
        if out.is_float and not out.is_complex:
            w = [self.widen(a, src) for a in args]
            if op in _FLOAT_UNARY and len(args) == 1:
                return self.narrow(_FLOAT_UNARY[op].format(*w), out)
            if op in _FLOAT_BINARY and len(args) == 2:
                return self.narrow(_FLOAT_BINARY[op].format(*w), out)
        if out.is_integer:
            if op in _INT_BINARY:
                return _INT_BINARY[op].format(*args)
            if op == "divide":
                return self._int_divide(inst, args)
            if op == "remainder":
                a, b = args
                return f"tl.where({b} == 0, {a}, {a} % tl.where({b} == 0, 1, {b}))" if \
                    out.kind == "uint" else \
                    f"tl.where({b} == 0, {a}, {a} % tl.where(({b} == 0) | ({b} == -1), 1, {b}))"
            if op == "negate":
                return f"-{args[0]}"
            if op == "abs":
                return f"tl.where({args[0]} < 0, -{args[0]}, {args[0]})"
            if op == "sign":
                return f"tl.where({args[0]} > 0, 1, tl.where({args[0]} < 0, -1, 0)).to({tl_type(out)})"
        if out.is_pred:
            if op in ("and", "multiply", "minimum"):
                return f"{args[0]} & {args[1]}"
            if op in ("or", "add", "maximum"):
                return f"{args[0]} | {args[1]}"
            if op == "xor":
                return f"{args[0]} ^ {args[1]}"
        raise self._unsupported(inst, f"no Triton lowering for {op} on {out.name}")

    def _int_divide(self, inst: Instruction, args: list[str]) -> str:
        a, b = args
        dtype = inst.shape.dtype
        if dtype.kind == "uint":
            return f"tl.where({b} == 0, {int_range(dtype)[1]}, {a} // tl.where({b} == 0, 1, {b}))"
        lo = int_range(dtype)[0]
        # XLA: x / 0 = -1, INT_MIN / -1 = INT_MIN, truncation toward zero (Triton's // too).
        safe = f"tl.where(({b} == 0) | (({a} == {lo}) & ({b} == -1)), 1, {b})"
        return f"tl.where({b} == 0, -1, {a} // {safe})"

    def _bit_count(self, inst: Instruction, x: str) -> str:
        """popcnt / count-leading-zeros on the bits of ``x`` (zero-extended to 32 bits for
        narrower types; 64-bit values as two 32-bit halves)."""
        dtype = inst.shape.dtype
        bits = dtype.bits
        ut = "tl.uint%d" % bits
        u = f"{x}.to({ut}, bitcast=True)" if dtype.kind == "sint" else x
        if bits == 64:
            lo = self.assign(f"lo_{inst.name}", f"({u}).to(tl.uint32)")
            hi = self.assign(f"hi_{inst.name}", f"(({u}) >> 32).to(tl.uint32)")
            expr = (f"_hl_popc32({lo}) + _hl_popc32({hi})" if inst.opcode == "popcnt" else
                    f"tl.where({hi} != 0, _hl_clz32({hi}), 32 + _hl_clz32({lo}))")
        else:
            w = self.assign(f"u_{inst.name}", f"({u}).to(tl.uint32)")
            expr = (f"_hl_popc32({w})" if inst.opcode == "popcnt" else
                    f"_hl_clz32({w}) - {32 - bits}")
        return f"({expr}).to({tl_type(dtype)})"

    def _reduce_precision(self, inst: Instruction, x: str) -> str:
        """XLA's reduce-precision on f32 (narrow floats widened first) or f64 bits: mantissa
        rounded to nearest even, exponents above the format's range to +-inf, below its
        normal range to +-0, NaN kept (hlo/evaluator/numerics.reduce_precision)."""
        e_bits, m_bits = int(inst.attrs["exponent_bits"]), int(inst.attrs["mantissa_bits"])
        wide = inst.operands[0].shape.dtype.bits > 32
        ut, src_m, src_e, total = ("tl.uint64", 52, 11, 64) if wide else ("tl.uint32", 23, 8, 32)
        ft = "tl.float64" if wide else "tl.float32"
        xv = self.assign(f"x_{inst.name}", f"({x}).to({ft})")
        b = self.assign(f"b_{inst.name}", f"{xv}.to({ut}, bitcast=True)")
        full = (1 << total) - 1
        if m_bits < src_m:
            shift = src_m - m_bits
            b = self.assign(f"b_{inst.name}",
                            f"{b} + ((({b} >> {shift}) & 1) + {(1 << (shift - 1)) - 1})")
            b = self.assign(f"b_{inst.name}", f"{b} & {full ^ ((1 << shift) - 1)}")
        if e_bits < src_e:
            exp_mask = ((1 << src_e) - 1) << src_m
            src_bias, dst_bias = (1 << (src_e - 1)) - 1, (1 << (e_bits - 1)) - 1
            sign = self.assign(f"sg_{inst.name}", f"{b} & {1 << (total - 1)}")
            ex = self.assign(f"ex_{inst.name}", f"{b} & {exp_mask}")
            b = self.assign(f"b_{inst.name}", f"tl.where({ex} > {(src_bias + dst_bias) << src_m}, "
                                              f"{sign} | {exp_mask}, {b})")
            b = self.assign(f"b_{inst.name}",
                            f"tl.where({ex} <= {(src_bias - dst_bias) << src_m}, {sign}, {b})")
        return f"tl.where({xv} != {xv}, {xv}, {b}.to({ft}, bitcast=True))"

    def _shift(self, inst: Instruction, args: list[str]) -> str:
        a, b = args
        dtype = inst.shape.dtype
        bits = dtype.bits
        ut = tl_type(dtype).replace("tl.int", "tl.uint")
        big = f"({b}.to({ut}, bitcast=True) >= {bits})" if dtype.kind == "sint" else f"({b} >= {bits})"
        if inst.opcode == "shift-left":
            return f"tl.where({big}, 0, {a} << tl.where({big}, 0, {b}))"
        if inst.opcode == "shift-right-arithmetic":
            if dtype.kind == "uint":
                st = tl_type(dtype).replace("tl.uint", "tl.int")
                sa = f"{a}.to({st}, bitcast=True)"
                return (f"tl.where({big}, ({sa} >> {bits - 1}), {sa} >> tl.where({big}, 0, {b}))"
                        f".to({tl_type(dtype)}, bitcast=True)")
            return f"tl.where({big}, {a} >> {bits - 1}, {a} >> tl.where({big}, 0, {b}))"
        # logical: shift the unsigned view
        if dtype.kind == "sint":
            ua = f"{a}.to({ut}, bitcast=True)"
            return (f"tl.where({big}, 0, ({ua} >> tl.where({big}, 0, {b}).to({ut}))"
                    f".to({tl_type(dtype)}, bitcast=True))")
        return f"tl.where({big}, 0, {a} >> tl.where({big}, 0, {b}))"

    def _to_storage(self, expr: str, dtype: DType) -> str:
        if is_narrow_float(dtype) and not self.round_narrow:
            return f"{expr}.to({tl_type(dtype)})"
        return expr

    def convert_expr(self, x: str, src: DType, dst: DType) -> str:
        """XLA's convert: RNE between floats, saturating float->int (NaN -> 0), wrap int->int."""
        if src == dst:
            return x
        if dst.is_pred:
            return f"{self.widen(x, src)} != 0"
        if src.is_pred:
            return f"{x}.to({self.repr_type(dst)})"
        if dst.is_float:
            xs = x
            if src.is_integer and is_narrow_float(dst):
                # Through an exact wider float (one rounding); Triton's interpreter also
                # mis-converts ints straight to bf16.
                xs = f"{x}.to({'tl.float32' if src.bits <= 16 else 'tl.float64'})"
                if not self.round_narrow:
                    return f"{xs}.to({tl_type(dst)}).to(tl.float32)"
                return f"{xs}.to({tl_type(dst)})"
            if src.is_float and is_narrow_float(dst) and not self.round_narrow:
                return f"{x}.to({tl_type(dst)}).to(tl.float32)"   # explicit rounding stays
            if is_narrow_float(src) and not self.round_narrow:
                return f"{xs}.to({self.repr_type(dst)})"
            return f"{xs}.to({self.repr_type(dst)})"
        if dst.is_integer and src.is_float:
            lo, hi = int_range(dst)
            w = self.widen(x, src) if self.round_narrow else x
            if src.name == "f64":
                w = w
            else:
                w = f"{w}.to(tl.float64)" if dst.bits >= 32 else w
            t = tl_type(dst)
            return (f"tl.where({w} != {w}, 0, tl.where({w} >= {float(hi) + 1.0!r}, {hi}, "
                    f"tl.where({w} <= {float(lo)!r}, {lo}, {w}.to({t})))).to({t})")
        return f"{x}.to({tl_type(dst)})"

    # --- called computations inlined on scalars ------------------------------------------------
    def inline_scalar(self, comp: Computation, args: list[str]) -> Value:
        """Emit ``comp`` (a scalar computation: a reducer or a map body) on expressions."""
        env: dict[int, Value] = {}
        for p, a in zip(comp.parameters, args):
            env[id(p)] = a
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                continue
            if inst.opcode == "constant":
                env[id(inst)] = self._constant(inst, (), self._comment(inst))
                continue
            if inst.opcode == "tuple":
                env[id(inst)] = tuple(env[id(o)] for o in inst.operands)
                continue
            if inst.opcode == "get-tuple-element":
                env[id(inst)] = env[id(inst.operands[0])][inst.attrs["index"]]
                continue
            if inst.shape.rank != 0 if hasattr(inst.shape, "rank") else True:
                raise self._unsupported(inst, "non-scalar instruction inside a called computation")
            ops = [env[id(o)] for o in inst.operands]
            env[id(inst)] = self.elementwise(inst, ops, self._comment(inst))
        return env[id(comp.root)]


__all__ = ["Emitter", "TritonCodegenError", "tl_type", "Index", "Value", "HlotkError"]
