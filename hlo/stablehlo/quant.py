"""Uniform quantization (``!quant.uniform``) lowered to plain StableHLO, on the text.

JAX's MLIR context registers no ``quant`` dialect, so a module that mentions
``!quant.uniform<...>`` cannot even be parsed. ``lower_quantized(text)`` rewrites it first:

- every quantized tensor type becomes its storage type (``tensor<2x!quant.uniform<i8:f32,
  0.1:-5>>`` -> ``tensor<2xi8>``): a quantized value *is* its storage integers;
- ``uniform_quantize`` / ``uniform_dequantize`` become float math with the spec's
  ``quantize`` / ``dequantize`` (StableHLO spec, "Quantized element types"):
  quantize: ``x / scale + zero_point``, clamp to the storage range, round to nearest even,
  convert to the storage type; dequantize: ``(storage - zero_point) * scale`` with the
  subtraction in a wider integer (as the reference lowering does) and the product in the
  expressed type. A quantized operand of ``uniform_quantize`` is dequantized first
  (``quantize(dequantize(x))``). Per-tensor and per-axis (``i8:f32:1, {s0:z0, s1:z1}``)
  parameters are supported; per-axis constants are broadcast along the axis;
- ops that only move storage (reshape, transpose, slice, bitcast_convert, ...) keep working
  on the storage integers;
- any other op with quantized operands or results follows ``dequantize_op_quantize``:
  quantized operands are dequantized, the op runs on the expressed type, and a quantized
  result is quantized back.

The lowering keeps each op on one statement and adds ``%__q<N>`` values; statements with
quantized types inside regions (a quantized reduce's block) are rejected with
HloImportError, as are forms the text rewrite cannot read.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Iterator, Optional

from ..errors import HloImportError

# Ops whose quantized result is bit-for-bit a rearrangement of quantized operands with the
# same parameters: they run on the storage integers unchanged.
STORAGE_OPS = frozenset(
    "stablehlo." + n for n in (
        "bitcast_convert", "reshape", "transpose", "broadcast_in_dim", "slice",
        "dynamic_slice", "dynamic_update_slice", "concatenate", "reverse", "pad", "gather",
        "get_tuple_element", "tuple", "optimization_barrier", "constant", "return",
        "all_gather", "all_to_all", "collective_permute", "collective_broadcast",
        "custom_call", "sort")) | {"func.return", "return", "func.call", "call"}


@dataclass(frozen=True)
class QuantType:
    """One ``!quant.uniform`` element type."""
    storage: str                 # "i8", "u8", "i4", ...
    expressed: str               # "f32", "f16", "bf16", ...
    scales: tuple[float, ...]    # one per tensor, or one per slice along ``axis``
    zero_points: tuple[int, ...]
    axis: Optional[int] = None   # None: per-tensor
    storage_min: Optional[int] = None
    storage_max: Optional[int] = None

    @property
    def bits(self) -> int:
        return int(self.storage[1:])

    @property
    def signed(self) -> bool:
        return self.storage.startswith("i")

    @property
    def qmin(self) -> int:
        if self.storage_min is not None:
            return self.storage_min
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        if self.storage_max is not None:
            return self.storage_max
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def storage_mlir(self) -> str:
        """The MLIR integer type holding the storage (signless for signed storage)."""
        return self.storage if self.signed else "ui" + self.storage[1:]


_QUANT_RE = re.compile(
    r"^\s*(?P<storage>[iu]\d+)(?:<(?P<min>[-+]?\d+)\s*:\s*(?P<max>[-+]?\d+)>)?\s*:\s*"
    r"(?P<expressed>\w+)(?:\s*:\s*(?P<axis>\d+))?\s*,\s*(?P<params>.+?)\s*$", re.S)
_PARAM_RE = re.compile(r"^\s*([-+]?[0-9.]+(?:[eE][-+]?\d+)?|[-+]?0x[0-9a-fA-F]+)"
                       r"(?:\s*:\s*([-+]?\d+))?\s*$")


def parse_quant_type(text: str) -> QuantType:
    """Parse ``!quant.uniform<...>`` (or just its ``<...>`` body)."""
    body = text.strip()
    if body.startswith("!quant.uniform"):
        body = body[len("!quant.uniform"):].strip()
        if not (body.startswith("<") and body.endswith(">")):
            raise HloImportError(f"malformed quantized type {text!r}")
        body = body[1:-1]
    m = _QUANT_RE.match(body)
    if not m:
        raise HloImportError(f"unsupported quantized type !quant.uniform<{body}>")
    params = m.group("params").strip()
    per_axis = m.group("axis") is not None
    if per_axis:
        if not (params.startswith("{") and params.endswith("}")):
            raise HloImportError(f"per-axis quantized type needs {{scale:zp, ...}}: {text!r}")
        items = [p for p in params[1:-1].split(",") if p.strip()]
    else:
        items = [params]
    scales, zps = [], []
    for item in items:
        pm = _PARAM_RE.match(item)
        if not pm:
            raise HloImportError(f"cannot read quantization parameter {item.strip()!r} of "
                                 f"{text!r}")
        s = pm.group(1)
        scales.append(float.fromhex(s) if "0x" in s.lower() else float(s))
        zps.append(int(pm.group(2) or 0))
    return QuantType(m.group("storage"), m.group("expressed"), tuple(scales), tuple(zps),
                     int(m.group("axis")) if per_axis else None,
                     int(m.group("min")) if m.group("min") is not None else None,
                     int(m.group("max")) if m.group("max") is not None else None)


# --- tensor types ------------------------------------------------------------------------
def _match_angle(text: str, i: int) -> int:
    """Index just past the ``>`` matching the ``<`` at ``text[i]`` (``->`` is no bracket)."""
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "<":
            depth += 1
        elif c == ">" and text[j - 1] != "-":
            depth -= 1
            if depth == 0:
                return j + 1
    raise HloImportError(f"unbalanced '<' in {text[i:i + 60]!r}")


@dataclass(frozen=True)
class TensorType:
    dims: tuple[int, ...]
    element: str                      # MLIR element text
    quant: Optional[QuantType] = None

    def with_element(self, element: str) -> "TensorType":
        return TensorType(self.dims, element)

    @property
    def storage(self) -> "TensorType":
        assert self.quant is not None
        return self.with_element(self.quant.storage_mlir)

    @property
    def expressed(self) -> "TensorType":
        assert self.quant is not None
        return self.with_element(self.quant.expressed)

    def text(self) -> str:
        return "tensor<" + "".join(f"{d}x" for d in self.dims) + self.element + ">"


def parse_tensor_type(text: str) -> TensorType:
    t = text.strip()
    if not (t.startswith("tensor<") and t.endswith(">")):
        raise HloImportError(f"expected a tensor type, got {text!r}")
    body = t[len("tensor<"):-1]
    dims: list[int] = []
    while True:
        m = re.match(r"(\d+|\?)x", body)
        if not m or body.startswith("!"):
            break
        if m.group(1) == "?":
            raise HloImportError(f"dynamic quantized tensor {text!r} is not supported")
        dims.append(int(m.group(1)))
        body = body[m.end():]
    quant = parse_quant_type(body) if body.startswith("!quant.") else None
    if body.startswith("!quant.") and not body.startswith("!quant.uniform"):
        raise HloImportError(f"unsupported quantized type {body!r}")
    return TensorType(tuple(dims), body, quant)


def _tensor_spans(text: str) -> Iterator[tuple[int, int]]:
    for m in re.finditer(r"tensor<", text):
        yield m.start(), _match_angle(text, m.end() - 1)


def storage_types(text: str) -> str:
    """``text`` with every quantized tensor type replaced by its storage type."""
    out, pos = [], 0
    for a, b in _tensor_spans(text):
        if a < pos or "!quant." not in text[a:b]:
            continue
        out.append(text[pos:a])
        out.append(parse_tensor_type(text[a:b]).storage.text())
        pos = b
    out.append(text[pos:])
    rest = "".join(out)
    if "!quant." in rest:
        raise HloImportError("quantized types outside tensor<> are not supported: "
                             f"{rest.strip()[:120]!r}")
    return rest


# --- statements ----------------------------------------------------------------------------
def _depth_delta(line: str) -> int:
    if line.lstrip().startswith("//"):
        return 0
    d, in_str = 0, False
    for i, c in enumerate(line):
        if c == '"' and (i == 0 or line[i - 1] != "\\"):
            in_str = not in_str
        elif not in_str:
            if c in "([{<":
                d += 1
            elif c in ")]}" or (c == ">" and (i == 0 or line[i - 1] != "-")):
                d -= 1
    return d


def _statements(text: str) -> Iterator[str]:
    """Lines, with an op spanning several lines joined (a region opener ends a statement)."""
    buf: list[str] = []
    depth = 0
    for line in text.split("\n"):
        buf.append(line)
        depth += _depth_delta(line)
        stripped = line.rstrip()
        if depth <= 0 or stripped.endswith("{") or stripped.endswith("({"):
            yield "\n".join(buf)
            buf, depth = [], 0
    if buf:
        yield "\n".join(buf)


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for i, c in enumerate(s):
        if c in "([{<":
            depth += 1
        elif c in ")]}" or (c == ">" and (i == 0 or s[i - 1] != "-")):
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _type_colon(s: str) -> int:
    """Index of the ``:`` that starts the op's trailing type signature, or -1."""
    depth, in_str, last = 0, False, -1
    for i, c in enumerate(s):
        if c == '"' and (i == 0 or s[i - 1] != "\\"):
            in_str = not in_str
        elif not in_str:
            if c in "([{<":
                depth += 1
            elif c in ")]}" or (c == ">" and s[i - 1] != "-"):
                depth -= 1
            elif c == ":" and depth == 0:
                last = i
    return last


_OP_RE = re.compile(r"^(?P<indent>\s*)(?P<lhs>%[\w.$\-]+(?::\d+)?\s*=\s*)?"
                    r"(?P<op>\"[\w.]+\"|[a-z_][\w.]*)(?P<rest>.*)$", re.S)
_VALUE_RE = re.compile(r"%[\w.$\-]+(?:#\d+)?")


class _Lowering:
    def __init__(self) -> None:
        self._ids = itertools.count()

    def fresh(self) -> str:
        return f"%__q{next(self._ids)}"

    # --- constants -------------------------------------------------------------------
    def _const(self, out: list[str], ind: str, values: tuple, ty: TensorType,
               axis: Optional[int], is_float: bool) -> str:
        fmt = (lambda v: "%.17e" % v) if is_float else (lambda v: str(int(v)))
        name = self.fresh()
        if axis is None or len(set(values)) == 1:
            out.append(f"{ind}{name} = stablehlo.constant dense<{fmt(values[0])}> : "
                       f"{ty.text()}")
            return name
        if axis >= len(ty.dims) or ty.dims[axis] != len(values):
            raise HloImportError(f"per-axis quantization along dimension {axis} with "
                                 f"{len(values)} parameters does not fit {ty.text()}")
        vec = TensorType((len(values),), ty.element)
        out.append(f"{ind}{name} = stablehlo.constant dense<[{', '.join(map(fmt, values))}]>"
                   f" : {vec.text()}")
        b = self.fresh()
        out.append(f"{ind}{b} = stablehlo.broadcast_in_dim {name}, dims = [{axis}] : "
                   f"({vec.text()}) -> {ty.text()}")
        return b

    # --- the spec's quantize / dequantize -----------------------------------------------
    def quantize(self, out: list[str], ind: str, x: str, ftype: TensorType,
                 q: QuantType, result: str) -> None:
        f = ftype.with_element(q.expressed)
        if ftype.element != q.expressed:
            raise HloImportError(f"uniform_quantize of {ftype.element} into a quantized type "
                                 f"expressed in {q.expressed}")
        t = f.text()
        scale = self._const(out, ind, q.scales, f, q.axis, True)
        zp = self._const(out, ind, tuple(float(z) for z in q.zero_points), f, q.axis, True)
        lo = self._const(out, ind, (float(q.qmin),), f, None, True)
        hi = self._const(out, ind, (float(q.qmax),), f, None, True)
        a, b, c, d = (self.fresh() for _ in range(4))
        out.append(f"{ind}{a} = stablehlo.divide {x}, {scale} : {t}")
        out.append(f"{ind}{b} = stablehlo.add {a}, {zp} : {t}")
        out.append(f"{ind}{c} = stablehlo.clamp {lo}, {b}, {hi} : {t}")
        out.append(f"{ind}{d} = stablehlo.round_nearest_even {c} : {t}")
        out.append(f"{ind}{result} = stablehlo.convert {d} : ({t}) -> "
                   f"{f.with_element(q.storage_mlir).text()}")

    def dequantize(self, out: list[str], ind: str, x: str, qtype: TensorType,
                   result: str) -> None:
        q = qtype.quant
        assert q is not None
        wide = qtype.with_element("i64" if q.bits >= 32 else "i32")
        f = qtype.expressed
        a, b, c, r = self.fresh(), self.fresh(), self.fresh(), result
        out.append(f"{ind}{a} = stablehlo.convert {x} : ({qtype.storage.text()}) -> "
                   f"{wide.text()}")
        zp = self._const(out, ind, q.zero_points, wide, q.axis, False)
        out.append(f"{ind}{b} = stablehlo.subtract {a}, {zp} : {wide.text()}")
        out.append(f"{ind}{c} = stablehlo.convert {b} : ({wide.text()}) -> {f.text()}")
        scale = self._const(out, ind, q.scales, f, q.axis, True)
        out.append(f"{ind}{r} = stablehlo.multiply {c}, {scale} : {f.text()}")

    # --- one statement ---------------------------------------------------------------------
    def statement(self, stmt: str) -> str:
        head = stmt.lstrip()
        if "!quant." not in stmt or head.startswith("//"):
            return stmt
        if head.startswith("^"):
            raise HloImportError("quantized values inside regions (block arguments) are not "
                                 f"supported: {head.splitlines()[0][:100]!r}")
        if head.startswith(("func.func", "module", "})", "}")):
            if head.startswith(("})", "}")):
                raise HloImportError("quantized ops with regions are not supported: "
                                     f"{head[:100]!r}")
            return storage_types(stmt)
        m = _OP_RE.match(stmt)
        if not m:
            raise HloImportError(f"cannot read quantized statement {head[:100]!r}")
        ind, lhs, op, rest = m.group("indent"), m.group("lhs") or "", m.group("op"), \
            m.group("rest")
        ind = ind.split("\n")[-1]
        op = op.strip('"')
        if "." not in op and op in ("return",):
            op = "func.return"
        if rest.rstrip().endswith("{"):
            raise HloImportError(f"quantized ops with regions are not supported ({op})")
        colon = _type_colon(rest)
        if colon < 0:
            raise HloImportError(f"{op}: cannot find the type signature of a quantized op")
        body, sig = rest[:colon], rest[colon + 1:].strip()
        ins, outs = self._signature(op, body, sig)
        operands = self._operands(op, body)
        if op == "stablehlo.uniform_quantize" or op == "stablehlo.uniform_dequantize":
            return self._qdq(op, ind, lhs, operands, ins, outs)
        if op in STORAGE_OPS:
            return storage_types(stmt)
        return self._dequantize_op_quantize(stmt, ind, lhs, op, body, sig, operands, ins,
                                            outs)

    def _signature(self, op: str, body: str, sig: str) -> tuple[list[str], list[str]]:
        fm = re.match(r"^\((.*)\)\s*->\s*(.+)$", sig, re.S)
        if fm:
            ins = _split_top(fm.group(1))
            res = fm.group(2).strip()
            outs = _split_top(res[1:-1]) if res.startswith("(") else [res]
            return ins, outs
        types = _split_top(sig)
        if len(types) != 1:
            return types, []
        n = len(self._operands(op, body))
        return [types[0]] * n, [types[0]]

    @staticmethod
    def _operands(op: str, body: str) -> list[str]:
        b = body.strip()
        if b.startswith("("):   # generic form: the operand list in parentheses
            depth = 0
            for i, c in enumerate(b):
                depth += c == "("
                depth -= c == ")"
                if depth == 0:
                    return _VALUE_RE.findall(b[:i])
        return _VALUE_RE.findall(b)

    def _qdq(self, op: str, ind: str, lhs: str, operands: list[str], ins: list[str],
             outs: list[str]) -> str:
        if len(operands) != 1 or len(ins) != 1 or len(outs) != 1 or not lhs:
            raise HloImportError(f"{op}: expected one operand and one result")
        result = lhs.split("=")[0].strip()
        tin, tout = parse_tensor_type(ins[0]), parse_tensor_type(outs[0])
        lines: list[str] = []
        if op == "stablehlo.uniform_dequantize":
            if tin.quant is None:
                raise HloImportError(f"{op}: operand type {ins[0]} is not quantized")
            self.dequantize(lines, ind, operands[0], tin, result)
            return "\n".join(lines)
        if tout.quant is None:
            raise HloImportError(f"{op}: result type {outs[0]} is not quantized")
        x, ftype = operands[0], tin
        if tin.quant is not None:   # requantize: quantize(dequantize(x))
            x = self.fresh()
            self.dequantize(lines, ind, operands[0], tin, x)
            ftype = tin.expressed
        self.quantize(lines, ind, x, ftype, tout.quant, result)
        return "\n".join(lines)

    def _dequantize_op_quantize(self, stmt: str, ind: str, lhs: str, op: str, body: str,
                                sig: str, operands: list[str], ins: list[str],
                                outs: list[str]) -> str:
        if len(ins) != len(operands):
            raise HloImportError(f"{op}: cannot match {len(operands)} operands with the "
                                 f"types {ins}")
        lines: list[str] = []
        renamed = dict()
        for v, t in zip(operands, ins):
            tt = parse_tensor_type(t) if t.startswith("tensor<") else None
            if tt is not None and tt.quant is not None and v not in renamed:
                renamed[v] = self.fresh()
                self.dequantize(lines, ind, v, tt, renamed[v])
        new_body = _VALUE_RE.sub(lambda mm: renamed.get(mm.group(0), mm.group(0)), body)
        new_sig = _expressed_types(sig)
        quant_outs = [parse_tensor_type(t) for t in outs
                      if t.startswith("tensor<") and "!quant." in t]
        name = f'"{op}"' if f'"{op}"' in stmt else op
        if not quant_outs:
            lines.append(f"{ind}{lhs}{name}{new_body}: {new_sig}")
            return "\n".join(lines)
        if len(outs) != 1 or not lhs or ":" in lhs.split("=")[0]:
            raise HloImportError(f"{op}: quantized ops with several results are not supported")
        result = lhs.split("=")[0].strip()
        tmp = self.fresh()
        lines.append(f"{ind}{tmp} = {name}{new_body}: {new_sig}")
        qt = quant_outs[0]
        assert qt.quant is not None
        self.quantize(lines, ind, tmp, qt.expressed, qt.quant, result)
        return "\n".join(lines)


def _expressed_types(text: str) -> str:
    out, pos = [], 0
    for a, b in _tensor_spans(text):
        if a < pos or "!quant." not in text[a:b]:
            continue
        out.append(text[pos:a])
        out.append(parse_tensor_type(text[a:b]).expressed.text())
        pos = b
    out.append(text[pos:])
    return "".join(out)


def lower_quantized(text: str) -> str:
    """``text`` with quantized types and ops lowered to plain StableHLO (see module doc).
    Text without ``!quant.`` comes back unchanged."""
    if "!quant." not in text:
        return text
    low = _Lowering()
    return "\n".join(low.statement(s) for s in _statements(text))
