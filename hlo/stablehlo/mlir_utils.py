"""Small helpers over JAX's MLIR Python bindings: context, types, literals, locations.

Everything here reads MLIR objects and returns hlotk values (``Shape``, numpy arrays,
``Metadata``); nothing builds HLO.
"""
from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from .. import dtypes as dt
from ..attrs import Metadata
from ..errors import HloImportError
from ..shape import AnyShape, Layout, Shape, TupleShape


def make_context(allow_unregistered: bool = False):
    """An MLIR context with the dialects JAX registers (stablehlo, chlo, func, sdy, ...)."""
    from jax._src.interpreters import mlir as jax_mlir
    ctx = jax_mlir.make_ir_context()
    if allow_unregistered:
        ctx.allow_unregistered_dialects = True
    return ctx


def isa(x: Any, cls: Any) -> bool:
    """isinstance on MLIR bindings objects, which may come back not yet downcast."""
    if isinstance(x, cls):
        return True
    try:
        return isinstance(x.maybe_downcast(), cls)
    except Exception:
        return False


# --- types ------------------------------------------------------------------------------
def element_dtype(elem_type: Any, where: str = "") -> dt.DType:
    name = str(elem_type)
    if name.startswith("!quant") or "quant." in name:
        raise HloImportError(f"quantized element type {name} is not supported", location=where)
    try:
        return dt.from_mlir(name)
    except dt.DTypeError:
        raise HloImportError(f"unsupported element type {name}", location=where) from None


# MLIR type text -> its HLO shape: a program's values have few distinct types (the Adam
# step: ~6,000 results of a few dozen), and a shape is immutable, so instructions share
# one. The text names the whole type (element type, dimensions, encoding).
_SHAPES: dict[str, AnyShape] = {}


def to_shape(ty: Any, where: str = "") -> AnyShape:
    """The HLO shape of an MLIR type, with XLA's default row-major layout."""
    text = str(ty)
    shape = _SHAPES.get(text)
    if shape is None:
        shape = _to_shape(ty, text, where)
        if len(_SHAPES) > 4096:
            _SHAPES.clear()
        _SHAPES[text] = shape
    return shape


def _to_shape(ty: Any, text: str, where: str) -> AnyShape:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as sh
    if text == "!stablehlo.token" or isa(ty, sh.TokenType):
        return Shape(dt.TOKEN, ())
    if isa(ty, ir.TupleType):
        tt = ty if isinstance(ty, ir.TupleType) else ty.maybe_downcast()
        return TupleShape(tuple(to_shape(tt.get_type(i), where) for i in range(tt.num_types)))
    if isa(ty, ir.RankedTensorType):
        rt = ty if isinstance(ty, ir.RankedTensorType) else ty.maybe_downcast()
        if not rt.has_static_shape:
            raise HloImportError(f"dynamic shapes are not supported (type {ty})", location=where)
        if rt.encoding is not None:
            # Bounded dynamism (`#stablehlo.bounds`) is a dynamic shape too.
            raise HloImportError(f"dynamic shapes are not supported (type {ty})", location=where)
        dims = tuple(rt.shape)
        return Shape(element_dtype(rt.element_type, where), dims, Layout.row_major(len(dims)))
    if isa(ty, ir.UnrankedTensorType):
        raise HloImportError(f"dynamic shapes are not supported (unranked type {ty})",
                             location=where)
    raise HloImportError(f"unsupported MLIR type {ty}", location=where)


# --- literals ---------------------------------------------------------------------------
_TOKEN_RE = re.compile(r"\s*(\[|\]|\(|\)|,|true|false|[-+]?0x[0-9A-Fa-f]+|"
                       r"[-+]?(?:inf|nan)|[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)")


def attr_text(op: Any, name: str) -> str:
    """``str()`` of an op attribute, even for kinds the bindings cannot downcast (complex)."""
    try:
        return str(op.attributes[name])
    except TypeError as e:  # "Can't cast unknown element type ... (Attribute(<text>))"
        m = re.search(r"\(Attribute\((.*)\)\)\s*$", str(e), re.S)
        if m:
            return m.group(1)
        raise


def dense_body(text: str, where: str = "") -> str:
    """The part between ``dense<`` and its matching ``>``."""
    start = text.find("dense<")
    if start < 0:
        raise HloImportError(f"unsupported constant attribute {text[:80]!r} (expected dense<...>)",
                             location=where)
    i = start + len("dense<")
    depth = 1
    j = i
    in_str = False
    while j < len(text):
        c = text[j]
        if c == '"':
            in_str = not in_str
        elif not in_str and c == "<":
            depth += 1
        elif not in_str and c == ">":
            depth -= 1
            if depth == 0:
                return text[i:j]
        j += 1
    raise HloImportError(f"malformed dense attribute {text[:80]!r}", location=where)


def _uint_for_bits(bits: int):
    return {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}.get(bits, np.uint8)


def _scalar_values(dtype: dt.DType, toks: list[str]) -> np.ndarray:
    """Numpy array (1-D) of dtype from printed scalar tokens."""
    if dtype.is_pred:
        return np.array([t in ("true", "1") for t in toks], dtype=np.bool_)
    if dtype.is_integer:
        vals = [int(t, 16) if "0x" in t.lower() else int(t) for t in toks]
        # MLIR prints signless/unsigned values in range; wrap defensively.
        bits = dtype.bits
        out = []
        for v in vals:
            v &= (1 << bits) - 1
            if dtype.kind == "sint" and v >= 1 << (bits - 1):
                v -= 1 << bits
            out.append(v)
        if dtype.bits < 8:
            return np.array(out, dtype=np.int64).astype(dtype.np_dtype)
        return np.array(out, dtype=object).astype(dtype.np_dtype)
    if dtype.is_float:
        out = np.empty(len(toks), dtype=dtype.np_dtype)
        for k, t in enumerate(toks):
            if t.lower().lstrip("+-").startswith("0x"):
                bits = int(t, 16)
                container = _uint_for_bits(dtype.bits if dtype.bits >= 8 else 8)
                out[k] = np.array(bits, dtype=container).view(dtype.np_dtype)
            else:
                out[k] = np.float64(float(t)).astype(dtype.np_dtype)
        return out
    raise HloImportError(f"cannot build a literal of type {dtype}")


def parse_dense(text: str, shape: Shape, where: str = "") -> np.ndarray:
    """The numpy literal of a printed ``dense<...>`` attribute for ``shape``."""
    body = dense_body(text, where).strip()
    dtype = shape.dtype
    n = shape.size
    if body.startswith('"0x'):
        raw = bytes.fromhex(body[3:-1])
        if dtype.is_complex or dtype.is_pred or dtype.bits >= 8:
            arr = np.frombuffer(raw, dtype=dtype.np_dtype)
        else:  # sub-byte types: one byte per element
            arr = np.frombuffer(raw, dtype=np.uint8).view(dtype.np_dtype)
        arr = arr.copy()
    else:
        toks = []
        pos = 0
        while pos < len(body):
            m = _TOKEN_RE.match(body, pos)
            if not m:
                raise HloImportError(f"cannot parse dense literal near {body[pos:pos + 30]!r}",
                                     location=where)
            pos = m.end()
            tok = m.group(1)
            if tok not in "[](),":
                toks.append(tok)
            while pos < len(body) and body[pos].isspace():
                pos += 1
        if dtype.is_complex:
            parts = _scalar_values(dtype.component, toks)
            arr = np.empty(len(parts) // 2, dtype=dtype.np_dtype)
            arr.real = parts[0::2]   # set parts separately: inf * 1j would make NaNs
            arr.imag = parts[1::2]
        else:
            arr = _scalar_values(dtype, toks)
    if arr.size == 1 and n != 1:
        from ..limits import ResourceLimitError, check_shape
        try:
            check_shape("dense splat", shape)
        except ResourceLimitError as e:
            raise HloImportError(str(e), location=where) from None
        arr = np.full(shape.dims, arr.reshape(()), dtype=dtype.np_dtype)
    if arr.size != n:
        raise HloImportError(f"dense literal has {arr.size} elements, type {shape} needs {n}",
                             location=where)
    return arr.reshape(shape.dims)


# --- locations ----------------------------------------------------------------------------
_NAME_RE = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"')
_FILE_RE = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')


def location_text(loc: Any) -> str:
    return str(loc)


def short_location(loc: Any) -> str:
    """``file:line:col`` (or the name) of a location, for error messages."""
    s = str(loc)
    m = _FILE_RE.search(s)
    if m:
        return f"{m.group(1)}:{m.group(2)}:{m.group(3)}"
    m = _NAME_RE.match(s)
    return m.group(1) if m else s


class LazyLocation:
    """``short_location(loc)`` made when an error message asks for it (``str``): shapes
    are read with a location for their errors, and ``str`` of an MLIR location costs a
    call into MLIR per op (issue 13: ~0.01 s of importing the Adam step)."""
    __slots__ = ("loc",)

    def __init__(self, loc: Any):
        self.loc = loc

    def __str__(self) -> str:
        return short_location(self.loc)


def location_metadata(loc: Any) -> Optional[Metadata]:
    """XLA's metadata from a JAX location: op_name from the outermost name, and the source
    file/line of the first (innermost-callee) file location, as XLA's translator does."""
    s = str(loc)
    if s in _METADATA:
        return _METADATA[s]
    md = _METADATA[s] = _location_metadata(s)
    if len(_METADATA) > 4096:
        _METADATA.clear()
    return md


# location text -> metadata (immutable; ops of one line of a program share a location)
_METADATA: dict[str, Optional[Metadata]] = {}


def _location_metadata(s: str) -> Optional[Metadata]:
    if s == "loc(unknown)":
        return None
    fields: list[tuple[str, Any]] = []
    m = _NAME_RE.match(s)
    if m and not _FILE_RE.match(s[4:]):
        fields.append(("op_name", _unescape(m.group(1))))
    m = _FILE_RE.search(s)
    if m:
        fields.append(("source_file", _unescape(m.group(1))))
        fields.append(("source_line", int(m.group(2))))
    return Metadata(tuple(fields)) if fields else None


def _unescape(s: str) -> str:
    return s.replace('\\"', '"').replace("\\\\", "\\")
