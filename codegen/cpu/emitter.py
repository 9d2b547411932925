"""HLO -> numpy lowering for the CPU backend: one Python function per fused computation.

The lowering is a per-backend rule table in JAX's style::

    CPU_RULES[opcode] = fn(emitter, inst, operand_exprs) -> expression text

Each instruction becomes one assignment ``name = <expr>  # %hlo.name``. Values stay in
their storage dtype between statements, so bf16/f16 are rounded after every op exactly
as the interpreter does. Where plain numpy differs from XLA (float flushing, integer
division, converts...) the expression calls ``S`` (codegen/cpu/support.py), which wraps
the interpreter's numerics; ops with no direct lowering call ``S.eval_rule`` (the
interpreter's rule for that instruction) and say so in the trailing comment.

Generated code sees: ``np``, ``S`` (support), the element types (``F32``, ``BF16``, ...),
``C`` (non-scalar constants by instruction name) and ``I`` (instructions by name, for
``eval_rule``). ``C`` and ``I`` are bound when the kernel is loaded, so the source depends
only on the fused computation's text.
"""
from __future__ import annotations

import keyword
import math
import re
from typing import Callable

import numpy as np

from hlo import layout_util
from hlo.errors import InvalidArgumentError
from hlo.evaluator.reductions import simple_binary_reducer
from hlo.ir import Computation, Instruction
from hlo.shape import Shape

from .support import DTYPE_NAMES

Rule = Callable[["Emitter", Instruction, list[str]], str]
CPU_RULES: dict[str, Rule] = {}

# Ops whose lowering may return a view of (or the very array of) an operand or constant.
# A kernel output produced by one of these is copied, so outputs never alias inputs.
VIEW_OPS = frozenset({"parameter", "constant", "broadcast", "reshape", "bitcast", "transpose",
                      "slice", "reverse", "get-tuple-element", "iota", "copy"})

# Ops left out of a kernel's name: they move data, the name should say what it computes.
_NAME_SKIP = frozenset({"parameter", "constant", "broadcast", "bitcast", "reshape", "tuple",
                        "get-tuple-element", "copy"})
_SHORT = {"exponential": "exp", "multiply": "mul", "subtract": "sub", "divide": "div",
          "maximum": "max", "minimum": "min", "compare": "cmp", "negate": "neg",
          "dynamic-slice": "dslice", "dynamic-update-slice": "dus", "concatenate": "concat",
          "transpose": "transpose", "exponential-minus-one": "expm1", "log-plus-one": "log1p",
          "shift-left": "shl", "shift-right-logical": "shrl", "shift-right-arithmetic": "shra",
          "reduce-window": "reduce_window", "bitcast-convert": "bitcast_convert"}
_RESERVED = {"np", "S", "C", "I", *DTYPE_NAMES, *keyword.kwlist, "len", "range", "tuple"}


def kernel_name(comp: Computation, max_ops: int = 4) -> str:
    """``fused_<op>_<op>..._<n>``: the distinct computing ops in program order, then the
    fused computation's number (``fused_computation.3`` -> 3)."""
    seen: list[str] = []
    for inst in comp.instructions:
        short = _SHORT.get(inst.opcode, inst.opcode.replace("-", "_"))
        if inst.opcode not in _NAME_SKIP and short not in seen:
            seen.append(short)
    if not seen:  # a pure data-movement fusion: name it after what it moves with
        seen = [_SHORT.get(i.opcode, i.opcode.replace("-", "_")) for i in comp.instructions
                if i.opcode not in ("parameter", "constant", "tuple")][:1] or ["copy"]
    parts = seen[:max_ops]
    m = re.search(r"(\d+)$", comp.name)
    if m:
        parts.append(m.group(1))
    return "fused_" + "_".join(parts)


class Emitter:
    """Builds the source of one kernel from a fused computation."""

    def __init__(self, comp: Computation):
        self.comp = comp
        self._vars: dict[int, str] = {}
        self._used: set[str] = set()
        self.constants: dict[str, np.ndarray] = {}   # bound as C[...] at load
        self.instructions: dict[str, Instruction] = {}  # bound as I[...] at load
        self.lines: list[str] = []

    # --- naming helpers used by rules ---------------------------------------------------
    def var(self, inst: Instruction) -> str:
        v = self._vars.get(id(inst))
        if v is None:
            base = re.sub(r"\W", "_", inst.name) or "v"
            if base[0].isdigit() or base in _RESERVED:
                base = "v_" + base
            v, n = base, 1
            while v in self._used:
                v, n = f"{base}_{n}", n + 1
            self._used.add(v)
            self._vars[id(inst)] = v
        return v

    def dtype(self, shape: Shape) -> str:
        return shape.dtype.name.upper()

    def const_ref(self, inst: Instruction) -> str:
        self.constants[inst.name] = inst.literal
        return f"C[{inst.name!r}]"

    def eval_rule(self, inst: Instruction, ops: list[str]) -> str:
        self.instructions[inst.name] = inst
        return f"S.eval_rule({', '.join([f'I[{inst.name!r}]'] + ops)})"

    # --- the function -------------------------------------------------------------------
    def emit(self, name: str, header: str) -> str:
        params = sorted(self.comp.parameters, key=lambda p: p.parameter_number)
        body: list[str] = []
        for inst in self.comp.instructions:
            if inst.opcode == "parameter":
                self.var(inst)
                continue
            rule = CPU_RULES.get(inst.opcode)
            ops = [self.var(o) for o in inst.operands]
            if rule is None:
                expr, note = self.eval_rule(inst, ops), " (interpreter rule)"
            else:
                expr = rule(self, inst, ops)
                note = " (interpreter rule)" if expr.startswith("S.eval_rule(") else ""
            body.append(f"{self.var(inst)} = {expr}  # %{inst.name}{note}")
        root = self.comp.root
        assert root is not None
        if root.opcode == "tuple":
            outs = [self._output(o) for o in root.operands]
            ret = "return (" + ", ".join(outs) + ("," if len(outs) == 1 else "") + ")"
        else:
            ret = "return " + self._output(root)
        body.append(ret)
        args = ", ".join(self.var(p) for p in params)
        lines = [header, f"def {name}({args}):",
                 '    with np.errstate(all="ignore"):  # XLA wraps/saturates; never warns']
        lines += ["        " + b for b in body]
        return "\n".join(lines) + "\n"

    def _output(self, inst: Instruction) -> str:
        return f"S.result({self.var(inst)}, copy={inst.opcode in VIEW_OPS})"


def lower(opcodes: str) -> Callable[[Rule], Rule]:
    """Register a CPU lowering rule for one or more (space-separated) opcodes."""
    def deco(fn: Rule) -> Rule:
        for op in opcodes.split():
            CPU_RULES[op] = fn
        return fn
    return deco


def _is_plain_int(shape: Shape) -> bool:
    """Integers numpy computes with XLA's wrapping natively (8 bits and wider)."""
    return shape.dtype.is_integer and shape.dtype.bits >= 8


# --- constants and data movement ---------------------------------------------------------
@lower("constant")
def _constant(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    lit = inst.literal
    if lit is None:
        raise InvalidArgumentError(f"constant %{inst.name} in %{em.comp.name} has no value "
                                   "(its literal was elided as {...}); cannot generate a kernel")
    d = inst.shape.dtype if not inst.shape.is_tuple else None
    if d is not None and not inst.shape.dims and (d.is_integer and d.bits >= 8 or d.is_pred or (
            d.is_float and d.bits >= 16 and math.isfinite(float(lit)))):
        value = bool(lit) if d.is_pred else int(lit) if d.is_integer else float(lit)
        if d.is_float and value == 0.0 and math.copysign(1.0, value) < 0:
            value_text = "-0.0"
        else:
            value_text = repr(value)
        return f"np.asarray({value_text}, {em.dtype(inst.shape)}.np_dtype)"
    return em.const_ref(inst)


@lower("broadcast")
def _broadcast(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    x = ops[0]
    dims = tuple(inst.attrs.get("dimensions", ()))
    src = inst.operands[0].shape.dims
    out = tuple(inst.shape.dims)
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    if order != list(range(len(dims))):
        x = f"np.transpose({x}, {tuple(order)})"
    shape = [1] * len(out)
    for i in order:
        shape[dims[i]] = src[i]
    if tuple(shape) != tuple(src):
        x = f"np.reshape({x}, {tuple(shape)})"
    return f"np.broadcast_to({x}, {out})"


@lower("reshape")
def _reshape(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return f"np.reshape({ops[0]}, {tuple(inst.shape.dims)})"


@lower("bitcast")
def _bitcast(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    src, dst = inst.operands[0].shape, inst.shape
    if src.dtype != dst.dtype:
        if src.dtype.bits != dst.dtype.bits or src.dtype.bits < 8 or not (
                layout_util.is_default(src.layout) and layout_util.is_default(dst.layout)):
            return em.eval_rule(inst, ops)
        return f"S.bitcast_elements({ops[0]}, {em.dtype(dst)}, {tuple(dst.dims)})"
    if layout_util.is_default(src.layout) and layout_util.is_default(dst.layout):
        return f"np.reshape({ops[0]}, {tuple(dst.dims)})"
    # A bitcast reinterprets the physical buffer: go to physical order, reshape, come back.
    src_order = tuple(reversed(src.layout.minor_to_major)) if src.layout else tuple(range(src.rank))
    dst_order = tuple(reversed(dst.layout.minor_to_major)) if dst.layout else tuple(range(dst.rank))
    phys_dims = tuple(dst.dims[d] for d in dst_order)
    x = ops[0] if src_order == tuple(range(src.rank)) else f"np.transpose({ops[0]}, {src_order})"
    x = f"np.reshape({x}, {phys_dims})"
    inverse = tuple(int(i) for i in np.argsort(dst_order))
    return x if inverse == tuple(range(dst.rank)) else f"np.transpose({x}, {inverse})"


@lower("transpose")
def _transpose(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return f"np.transpose({ops[0]}, {tuple(inst.attrs['dimensions'])})"


@lower("reverse")
def _reverse(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return f"np.flip({ops[0]}, axis={tuple(inst.attrs.get('dimensions', ()))})"


@lower("copy")
def _copy(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return ops[0]   # logical values: a layout-changing copy is the identity here


@lower("slice")
def _slice(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    parts = []
    for d in inst.attrs["slice"].dims:
        parts.append(f"{d.start}:{d.limit}" + (f":{d.stride}" if d.stride != 1 else ""))
    return f"{ops[0]}[{', '.join(parts) or '()'}]"


@lower("concatenate")
def _concatenate(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return f"np.concatenate([{', '.join(ops)}], axis={inst.attrs['dimensions'][0]})"


@lower("iota")
def _iota(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    dims = tuple(inst.shape.dims)
    d = int(inst.attrs["iota_dimension"])
    shape = tuple(n if i == d else 1 for i, n in enumerate(dims))
    ramp = f"S.convert(np.arange({dims[d]}), {em.dtype(inst.shape)})"
    return f"np.broadcast_to(np.reshape({ramp}, {shape}), {dims})"


@lower("tuple")
def _tuple(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return "(" + ", ".join(ops) + ("," if len(ops) == 1 else "") + ")"


@lower("get-tuple-element")
def _gte(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return f"{ops[0]}[{int(inst.attrs['index'])}]"


@lower("select")
def _select(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return f"np.where({ops[0]}, {ops[1]}, {ops[2]})"


# --- elementwise arithmetic --------------------------------------------------------------
# opcode -> (float function, integer function or None). Integer functions are numpy ufuncs
# whose fixed-width result is already XLA's (two's complement wrap) for >= 8-bit types.
_BINARY = {
    "add": ("np.add", "np.add"), "subtract": ("np.subtract", "np.subtract"),
    "multiply": ("np.multiply", "np.multiply"), "divide": ("np.divide", None),
    "remainder": ("np.fmod", None), "power": ("np.power", None),
    "atan2": ("np.arctan2", None), "maximum": ("S.float_max", "np.maximum"),
    "minimum": ("S.float_min", "np.minimum"),
}
_UNARY = {
    "exponential": "np.exp", "log": "np.log", "tanh": "np.tanh", "sine": "np.sin",
    "cosine": "np.cos", "tan": "np.tan", "sqrt": "np.sqrt", "exponential-minus-one": "np.expm1",
    "log-plus-one": "np.log1p", "ceil": "np.ceil", "floor": "np.floor",
    "round-nearest-even": "np.rint",
}
_BITWISE = {"and": ("np.bitwise_and", "np.logical_and"), "or": ("np.bitwise_or", "np.logical_or"),
            "xor": ("np.bitwise_xor", "np.logical_xor"), "not": ("np.invert", "np.logical_not")}


def _operand_shape(inst: Instruction) -> Shape:
    return inst.operands[0].shape


@lower(" ".join(_BINARY))
def _binary(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    shape = _operand_shape(inst)
    float_fn, int_fn = _BINARY[inst.opcode]
    if shape.dtype.is_float:
        return f"S.fop({float_fn}, {em.dtype(shape)}, {', '.join(ops)})"
    if int_fn is not None and _is_plain_int(shape):
        return f"{int_fn}({', '.join(ops)})"
    return em.eval_rule(inst, ops)


@lower(" ".join(_UNARY))
def _unary(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    shape = _operand_shape(inst)
    if shape.dtype.is_float:
        return f"S.fop({_UNARY[inst.opcode]}, {em.dtype(shape)}, {ops[0]})"
    return em.eval_rule(inst, ops)


@lower("negate abs")
def _sign_bit(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    shape = _operand_shape(inst)
    fn = "np.negative" if inst.opcode == "negate" else "np.abs"
    if shape.dtype.is_float:   # a sign-bit operation: subnormals survive
        return f"S.fop_exact({fn}, {em.dtype(shape)}, {ops[0]})"
    if shape.dtype.kind == "sint" and shape.dtype.bits >= 8:
        return f"{fn}({ops[0]})"
    return em.eval_rule(inst, ops)


@lower(" ".join(_BITWISE))
def _bitwise(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    shape = _operand_shape(inst)
    int_fn, pred_fn = _BITWISE[inst.opcode]
    if shape.dtype.is_pred:
        return f"{pred_fn}({', '.join(ops)})"
    if _is_plain_int(shape):
        return f"{int_fn}({', '.join(ops)})"
    return em.eval_rule(inst, ops)


@lower("shift-left shift-right-logical shift-right-arithmetic")
def _shift(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    if _is_plain_int(_operand_shape(inst)):
        return f"S.{inst.opcode.replace('-', '_')}({ops[0]}, {ops[1]})"
    return em.eval_rule(inst, ops)


_COMPARE = {"EQ": "np.equal", "NE": "np.not_equal", "LT": "np.less", "LE": "np.less_equal",
            "GT": "np.greater", "GE": "np.greater_equal"}


@lower("compare")
def _compare(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    shape = _operand_shape(inst)
    fn = _COMPARE.get(str(inst.attrs.get("direction", "")))
    cmp_type = str(inst.attrs.get("type", "")) or None
    d = shape.dtype
    if fn is None:
        return em.eval_rule(inst, ops)
    if d.is_float and cmp_type in (None, "FLOAT"):
        # Compared in the compute type with subnormals read as zero (XLA:CPU's DAZ).
        return f"{fn}(S.daz({ops[0]}), S.daz({ops[1]}))"
    natural = {"sint": "SIGNED", "uint": "UNSIGNED", "pred": "UNSIGNED"}.get(d.kind)
    if (d.is_pred or _is_plain_int(shape)) and cmp_type in (None, natural):
        return f"{fn}({ops[0]}, {ops[1]})"
    return em.eval_rule(inst, ops)


@lower("convert")
def _convert(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    return f"S.convert({ops[0]}, {em.dtype(inst.shape)})"


@lower("reduce")
def _reduce(em: Emitter, inst: Instruction, ops: list[str]) -> str:
    body = inst.attrs["to_apply"]
    opcode = simple_binary_reducer(body) if len(ops) == 2 else None
    if opcode is None:
        return em.eval_rule(inst, ops)
    axes = tuple(inst.attrs.get("dimensions", ()))
    return f"S.reduce({opcode!r}, {ops[0]}, {axes}, {ops[1]}, {em.dtype(inst.shape)})"
