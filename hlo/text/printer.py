"""HLO text printer: a ``Module`` in XLA's long text style (``compile().as_text()``).

    HloModule m, entry_computation_layout={(f32[2]{0})->f32[2]{0}}

    %add (a: f32[], b: f32[]) -> f32[] { ... }

    ENTRY %main (p0: f32[2]) -> f32[2] {
      %p0 = f32[2]{0} parameter(0)
      ROOT %neg = f32[2]{0} negate(%p0), metadata={op_name="neg"}
    }

Options: ``print_layout`` (True), ``print_metadata`` (True), ``print_large_constants``
(True: every literal is printed so the text reloads exactly; False elides literals of more
than 10 elements as ``{...}``, as XLA's default does), ``print_backend_config`` (True).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..attrs import ATTR_KINDS, SliceSpec, format_attr, quote
from ..ir import Computation, Instruction, Module
from ..shape import AnyShape

# XLA prints control-predecessors after the opcode's own attributes, before these.
_AFTER_CONTROL_PREDECESSORS = ("metadata", "backend_config", "statistics", "origin",
                               "original_value", "result_accuracy")
_LARGE_CONSTANT = 10   # XLA elides literals with more elements than this by default


def _join_indexed(items: list[str]) -> str:
    """``a, b, c, d, e, /*index=5*/f``: XLA marks every fifth item of long lists."""
    return "".join((f", /*index={i}*/" if i % 5 == 0 else ", ") + s if i else s
                   for i, s in enumerate(items))


def format_shape(shape: AnyShape, print_layout: bool = True) -> str:
    """A shape as XLA prints it, with ``/*index=5*/`` markers in long tuples."""
    if shape.is_tuple:
        return "(" + _join_indexed([format_shape(e, print_layout) for e in shape.elements]) + ")"
    return shape.to_text(print_layout)


# --- literals ------------------------------------------------------------------------------

def _max_digits10(dtype: dt.DType) -> int:
    """Significant digits that always round-trip a value of ``dtype`` (C++ max_digits10)."""
    import ml_dtypes
    nmant = int(ml_dtypes.finfo(dtype.np_dtype).nmant)
    return math.ceil((nmant + 1) * math.log10(2)) + 1


def format_float(value: Any, dtype: dt.DType) -> str:
    """One floating-point element in XLA's spelling for ``dtype``.

    f32/f64 print with 6/15 significant digits when that reads back exactly, else 9/17
    (tsl's FloatToBuffer/DoubleToBuffer); narrower types always use their max_digits10
    (XLA's RoundTripFpToString), so bf16 ``0.1`` prints ``0.1001``.
    """
    x = float(value)
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    if dtype.name == "f32":
        s = "%.6g" % x
        return s if np.float32(float(s)) == np.float32(x) else "%.9g" % x
    if dtype.name == "f64":
        s = "%.15g" % x
        return s if float(s) == x else "%.17g" % x
    return "%.*g" % (_max_digits10(dtype), x)


def _element(value: Any, dtype: dt.DType, scalar: bool) -> str:
    if dtype.is_pred:
        # XLA spells a scalar pred true/false but array elements 1/0.
        return ("true" if value else "false") if scalar else ("1" if value else "0")
    if dtype.is_complex:
        c = complex(value)
        comp = dtype.component
        return f"({format_float(c.real, comp)}, {format_float(c.imag, comp)})"
    if dtype.is_float:
        return format_float(value, dtype)
    return str(int(value))


def format_literal(literal: Any, shape: AnyShape, print_large_constants: bool = True) -> str:
    """The text inside ``constant(...)``; ``{...}`` for an elided (None) literal."""
    if literal is None:
        return "{...}"
    if shape.is_tuple:
        if not print_large_constants:
            return "{...}"
        parts = [format_literal(v, s, True) for v, s in zip(literal, shape.elements)]
        return "( " + ", ".join(parts) + " )"
    arr = np.asarray(literal)
    dtype = shape.dtype
    if not shape.dims:
        return _element(arr.reshape(()).item() if not dtype.is_float else arr.reshape(())[()],
                        dtype, scalar=True)
    if not print_large_constants and arr.size > _LARGE_CONSTANT:
        return "{...}"
    rank = len(shape.dims)
    flat = [_element(v, dtype, scalar=False) for v in arr.reshape(-1)]
    if rank == 1:
        return "{" + ", ".join(flat) + "}"
    # XLA builds a multi-line picture and then joins its lines with spaces; this writes the
    # joined form directly: inner rows ``{ 1, 2 }`` (``{1}`` for one element), outer levels
    # ``{ row, row }``, and for rank > 3 a ``/*iN=k*/`` index comment on nested levels.
    it = iter(flat)

    def level(depth: int, index: tuple[int, ...]) -> str:
        n = shape.dims[depth]
        if depth == rank - 1:
            items = ", ".join(next(it) for _ in range(n))
            return "{" + items + "}" if n <= 1 else "{ " + items + " }"
        head = "{"
        if rank > 3 and index:
            head += f" /*i{len(index) - 1}={index[-1]}*/"
        children = ", ".join(level(depth + 1, index + (i,)) for i in range(n))
        return head + " " + children + " }"
    return level(0, ())


# --- instructions, computations, modules ---------------------------------------------------

def print_instruction(inst: Instruction, print_layout: bool = True, print_metadata: bool = True,
                      print_large_constants: bool = True, print_backend_config: bool = True,
                      **_: Any) -> str:
    """``%name = shape opcode(operands), attr=value, ...`` (no ``ROOT``, no indent)."""
    head = f"%{inst.name} = {format_shape(inst.shape, print_layout)} {inst.opcode}("
    if inst.opcode == "constant":
        head += format_literal(inst.literal, inst.shape, print_large_constants)
    elif inst.opcode == "parameter":
        head += str(inst.parameter_number)
    else:
        head += _join_indexed(["%" + o.name for o in inst.operands])
    head += ")"
    parts = []
    control = ""
    if inst.control_predecessors:
        control = "control-predecessors={" + ", ".join(
            "%" + p.name for p in inst.control_predecessors) + "}"
    for key, value in inst.attrs.items():
        if control and key in _AFTER_CONTROL_PREDECESSORS:
            parts.append(control)
            control = ""
        if key == "metadata" and not print_metadata:
            continue
        if key == "backend_config" and not print_backend_config:
            continue
        parts.append(_format_attr(key, value))
    if control:
        parts.append(control)
    return head + "".join(", " + p for p in parts)


def _format_attr(key: str, value: Any) -> str:
    if isinstance(value, SliceSpec):
        # XLA writes every stride once any dimension has a stride other than 1.
        strided = any(d.stride != 1 for d in value.dims)
        return f"{key}={{" + ", ".join(
            f"[{d.start}:{d.limit}:{d.stride}]" if strided else f"[{d.start}:{d.limit}]"
            for d in value.dims) + "}"
    if ATTR_KINDS.get(key) == "string" and isinstance(value, str):
        return f"{key}={quote(value)}"
    if ATTR_KINDS.get(key) in ("idents", "ints") and isinstance(value, (tuple, list)):
        return f"{key}={{{','.join(str(v) for v in value)}}}"
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, bool) for v in value):
        return f"{key}={{{','.join('true' if v else 'false' for v in value)}}}"
    return format_attr(key, value)


def print_computation(comp: Computation, print_layout: bool = True, **options: Any) -> str:
    """``[ENTRY ]%name (p: shape, ...) -> shape {`` instructions ``}``."""
    params = ", ".join(f"{p.name}: {format_shape(p.shape, False)}" for p in comp.parameters
                       if p is not None)
    result = format_shape(comp.root.shape, False) if comp.root is not None else "()"
    head = ("ENTRY " if comp.is_entry else "") + f"%{comp.name} ({params}) -> {result}"
    if comp.extra_attrs:
        head += ", " + comp.extra_attrs
    lines = [head + " {"]
    for inst in comp.instructions:
        prefix = "  ROOT " if inst is comp.root else "  "
        lines.append(prefix + print_instruction(inst, print_layout=print_layout, **options))
    lines.append("}")
    return "\n".join(lines)


def _format_config(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "{" + ",".join(_format_config(v) for v in value) + "}"
    return str(value)


def print_module(m: Module, **options: Any) -> str:
    """The whole module: header, stack-frame sections, computations (entry last)."""
    out = [f"HloModule {m.name}"]
    for key, value in m.config.items():
        out.append(f", {key}={_format_config(value)}")
    out.append("\n\n")
    if m.sections:
        for title, entries in m.sections.items():
            out.append(title + "\n")
            out.extend(f"{i} {text}\n" for i, text in entries)
            out.append("\n")
        out.append("\n")
    comps = [c for c in m.computations if c is not m.entry]
    if m.entry is not None:
        comps.append(m.entry)
    for comp in comps:
        out.append(print_computation(comp, **options) + "\n\n")
    return "".join(out)
