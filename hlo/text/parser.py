"""HLO text parser: XLA's text format back into a ``Module``.

Reads both styles XLA prints:
- long (``compile().as_text()``): ``%`` names, computation signatures, layouts, metadata,
  ``FileNames``/``StackFrames`` sections, ``/*index=5*/`` comments;
- short (``lower().as_text(dialect="hlo")``): bare names, ``ENTRY main.2 {``.

A recursive-descent parser over ``lexer.Lexer``. Attribute values are typed by
``attrs.ATTR_KINDS``; unknown attributes stay ``attrs.Raw`` with their exact text. Every
error is an ``hlo.ParseError`` with ``file:line:col`` and what was expected/found.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from .. import dtypes as dt
from ..attrs import (ATTR_KINDS, ConvDimLabels, FrontendAttributes, IotaReplicaGroups,
                     MeshReplicaGroups,
                     Metadata, PadDim, PaddingConfig, Raw, ReplicaGroups, SliceDim,
                     SliceSpec, Window, WindowDim)
from ..errors import HlotkError
from ..ir import Computation, Instruction, Module
from ..ops import OPS
from ..shape import AnyShape, Layout, Shape, TupleShape
from ..sharding import parse_sharding
from .lexer import EOF, NAME, NUMBER, STRING, Lexer, unquote


@dataclass(frozen=True)
class ComputationLayout:
    """The module header's ``entry_computation_layout={(p0, p1)->result}``."""
    parameters: tuple[AnyShape, ...]
    result: AnyShape

    def __str__(self) -> str:
        from .printer import format_shape
        params = _join_indexed([format_shape(s) for s in self.parameters])
        return "{(" + params + ")->" + format_shape(self.result) + "}"


def _join_indexed(items: list[str]) -> str:
    """``a, b, c, d, e, /*index=5*/f``: XLA marks every fifth item of long lists."""
    return "".join((f", /*index={i}*/" if i % 5 == 0 else ", ") + s if i else s
                   for i, s in enumerate(items))


def parse_hlo(text: str, filename: Optional[str] = None) -> Module:
    """Parse an HLO module in XLA's text format."""
    p = _Parser(text, filename)
    with _nesting_limit(p):
        return p.module()


def parse_shape(text: str) -> AnyShape:
    """Parse one shape: ``f32[2,3]{1,0}``, ``(s32[], token[])``, ``bf16[8]{0:T(128)}``."""
    p = _Parser(text, None)
    with _nesting_limit(p):
        shape = p.shape()
    if p.lx.peek().kind != EOF:
        p.lx.fail_expected("end of shape")
    return shape


@contextlib.contextmanager
def _nesting_limit(p: "_Parser") -> Iterator[None]:
    """Tuples and literals nest by recursion: input nested past Python's recursion limit
    is a ParseError where the parser stopped, not a RecursionError."""
    try:
        yield
    except RecursionError:
        raise p.lx.error("nesting too deep (tuples, literals or braces thousands of levels "
                         "deep)", min(p.lx.pos, len(p.lx.text))) from None


# Header attributes with a known value type; others are kept Raw.
_BOOL_CONFIG = {"is_scheduled", "is_dynamic"}
_INT_CONFIG = {"replica_count", "num_partitions"}
_BOOLS_CONFIG = {"allow_spmd_sharding_propagation_to_parameters",
                 "allow_spmd_sharding_propagation_to_output"}
_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")

_DIMS_X = re.compile(r"-?\d+(?:x-?\d+)*")                  # 3x3, 2x2
_PAD_X = re.compile(r"-?\d+_-?\d+(?:_-?\d+)?(?:x-?\d+_-?\d+(?:_-?\d+)?)*")
_DIM_LABELS = re.compile(r"[0-9a-z?]+_[0-9a-z?]+->[0-9a-z?]+")
_INT = re.compile(r"-?\d+$")
# mesh['x'=2,'y'=4][, device_ids=([2,4]T(1,0))] {'y'}
_MESH_GROUPS = re.compile(r"mesh\[(?P<axes>[^\]]*)\]"
                          r"(?:,\s*device_ids=\(\[(?P<dims>[\d,\s]+)\](?:T\((?P<perm>[\d,\s]+)\))?\))?"
                          r"\s*\{(?P<group>[^}]*)\}")


@dataclass
class _ComputationRef:
    """A computation named before it is defined; resolved when the module is complete."""
    name: str
    pos: int


class _Parser:
    def __init__(self, text: str, filename: Optional[str]):
        self.lx = Lexer(text, filename)
        self.module_: Optional[Module] = None
        self.computations: dict[str, Computation] = {}
        self.pending: list[tuple[Instruction, str, int]] = []

    # --- module ---------------------------------------------------------------------------
    def module(self) -> Module:
        lx = self.lx
        lx.expect("HloModule")
        name = self.name("a module name")
        m = self.module_ = Module(name)
        layout_pos = None
        while lx.accept(","):
            key_tok = lx.expect_kind(NAME, "a module attribute name")
            lx.expect("=")
            if key_tok.text == "entry_computation_layout":
                layout_pos = key_tok.pos
            m.config[key_tok.text] = self.config_value(key_tok.text)
        self.sections(m)
        entry: Optional[Computation] = None
        while lx.peek().kind != EOF:
            comp, is_entry = self.computation()
            if is_entry:
                if entry is not None:
                    raise lx.error(f"second ENTRY computation %{comp.name}; "
                                   f"%{entry.name} is already the entry")
                entry = comp
        if entry is None:
            if not m.computations:
                raise lx.error("expected a computation but found end of input")
            entry = m.computations[-1]   # XLA also takes the last one when none says ENTRY
        m.entry = entry
        m.computations.remove(entry)
        m.computations.append(entry)
        self.resolve_pending()
        if layout_pos is not None:
            # The header against the entry it describes, reported where the header says it.
            from ..errors import VerifierError
            from ..verifier import _check_entry_layout
            try:
                _check_entry_layout(m)
            except VerifierError as e:
                raise lx.error(str(e), layout_pos) from None
        return m

    def config_value(self, key: str) -> Any:
        lx = self.lx
        if key in _BOOL_CONFIG:
            return self.boolean(key)
        if key in _INT_CONFIG:
            return self.integer(key)
        if key in _BOOLS_CONFIG:
            lx.expect("{")
            vals = []
            if not lx.at("}"):
                vals.append(self.boolean(key))
                while lx.accept(","):
                    vals.append(self.boolean(key))
            lx.expect("}")
            return tuple(vals)
        if key == "entry_computation_layout":
            lx.expect("{")
            lx.expect("(")
            params = self.shape_list(")")
            lx.expect("->")
            result = self.shape()
            lx.expect("}")
            return ComputationLayout(tuple(params), result)
        if key == "frontend_attributes":
            return self.frontend_attributes()
        return Raw(lx.balanced())

    def sections(self, m: Module) -> None:
        lx = self.lx
        while lx.peek().kind == NAME and lx.peek().text in _SECTIONS:
            title = lx.next().text
            entries: list[tuple[int, str]] = []
            while lx.peek().kind == NUMBER and _INT.match(lx.peek().text):
                ident = int(lx.next().text)
                text = lx.rest_of_line()
                if not text:
                    lx.fail_expected(f"a {title} entry")
                entries.append((ident, text))
            m.sections[title] = entries

    # --- computations -------------------------------------------------------------------------
    def computation(self) -> tuple[Computation, bool]:
        lx = self.lx
        is_entry = lx.accept("ENTRY")
        name_tok = lx.peek()
        name = self.name("a computation name")
        if name in self.computations:
            raise lx.error(f"computation %{name} is defined twice", name_tok.pos)
        comp = Computation(name)
        signature: Optional[list[tuple[str, AnyShape, int]]] = None
        if lx.at("("):
            signature = self.signature()
        if lx.accept(","):
            # ``, execution_thread="host"``: kept verbatim.
            start = lx.token_start()
            while not lx.at("{") and lx.peek().kind != EOF:
                lx.next()
            comp.extra_attrs = lx.text[start:lx.pos].strip()
        lx.expect("{")
        # Add the computation first so instruction names register with the module.
        self.computations[name] = comp
        self.module_.add_computation(comp)
        scope: dict[str, Instruction] = {}
        root: Optional[Instruction] = None
        while not lx.at("}"):
            if lx.peek().kind == EOF:
                lx.fail_expected("an instruction or '}'")
            inst, is_root = self.instruction(comp, scope)
            if is_root:
                if root is not None:
                    raise lx.error(f"computation %{name} has two ROOT instructions")
                root = inst
        lx.expect("}")
        if not comp.instructions:
            raise lx.error(f"computation %{name} has no instructions", name_tok.pos)
        comp.root = root if root is not None else comp.instructions[-1]
        if any(p is None for p in comp.parameters):
            missing = [i for i, p in enumerate(comp.parameters) if p is None]
            raise lx.error(f"computation %{name} lacks parameter({missing[0]})", name_tok.pos)
        if signature is not None:
            self.check_signature(comp, signature, name_tok.pos)
        return comp, is_entry

    def signature(self) -> list[tuple[str, AnyShape, int]]:
        lx = self.lx
        lx.expect("(")
        params = []
        if not lx.at(")"):
            while True:
                pos = lx.token_start()
                pname = self.name("a parameter name")
                lx.expect(":")
                params.append((pname, self.shape(), pos))
                if not lx.accept(","):
                    break
        lx.expect(")")
        lx.expect("->")
        self.shape()
        return params

    def check_signature(self, comp: Computation, params, pos: int) -> None:
        if len(params) != len(comp.parameters):
            raise self.lx.error(f"signature of %{comp.name} lists {len(params)} parameters "
                                f"but the body has {len(comp.parameters)}", pos)
        for (pname, shape, ppos), inst in zip(params, comp.parameters):
            if pname != inst.name or not shape.compatible(inst.shape):
                raise self.lx.error(f"signature parameter {pname}: {shape} does not match "
                                    f"%{inst.name} = {inst.shape} parameter("
                                    f"{inst.parameter_number})", ppos)

    def _parameter_count(self) -> int:
        if getattr(self, "_parameters_in_text", None) is None:
            self._parameters_in_text = len(re.findall(r"\bparameter\s*\(", self.lx.text))
        return self._parameters_in_text

    # --- instructions ----------------------------------------------------------------------
    def instruction(self, comp: Computation, scope: dict[str, Instruction]):
        lx = self.lx
        is_root = lx.accept("ROOT")
        name_tok = lx.peek()
        name = self.name("an instruction name")
        if name in scope or name in self.module_._names:
            raise lx.error(f"instruction name %{name} is already used", name_tok.pos)
        lx.expect("=")
        shape = self.shape()
        op_tok = lx.expect_kind(NAME, "an opcode")
        opcode = op_tok.text
        if opcode not in OPS:
            raise lx.error(f"unknown opcode {opcode!r}", op_tok.pos)
        lx.expect("(")
        literal = None
        parameter_number = None
        operands: list[Instruction] = []
        if opcode == "constant":
            literal = self.literal(shape)
        elif opcode == "parameter":
            parameter_number = self.integer("parameter")
            if parameter_number < 0:
                raise lx.error("parameter number must be >= 0", op_tok.pos)
            # Numbers are dense from 0, so none can reach the count of parameter
            # instructions in the text (the computation would reserve that many slots).
            available = self._parameter_count()
            if parameter_number >= available:
                raise lx.error(f"parameter({parameter_number}) but the text has only "
                               f"{available} parameter instructions", op_tok.pos)
        else:
            operands = self.operands(scope)
        lx.expect(")")
        inst = Instruction(opcode, operands, shape, literal=literal,
                           parameter_number=parameter_number, name=name)
        while lx.accept(","):
            self.attribute(inst, scope)
        try:
            comp.add_instruction(inst)
        except HlotkError as e:
            raise lx.error(str(e), name_tok.pos) from None
        if inst.name != name:  # pragma: no cover - guarded by the uniqueness check
            raise lx.error(f"instruction name %{name} is already used", name_tok.pos)
        scope[name] = inst
        return inst, is_root

    def operands(self, scope: dict[str, Instruction]) -> list[Instruction]:
        lx = self.lx
        out: list[Instruction] = []
        if lx.at(")"):
            return out
        while True:
            tok = lx.peek()
            # Older XLA writes operands with their shapes: ``add(f32[] %a, f32[] %b)``.
            typed = tok.kind == NAME and lx.text.startswith("[", tok.pos + len(tok.text))
            if typed or tok.text == "(":
                self.shape()
                tok = lx.peek()
            name = self.name("an operand name")
            if name not in scope:
                raise lx.error(f"unknown operand %{name}", tok.pos)
            out.append(scope[name])
            if not lx.accept(","):
                return out

    # --- attributes -------------------------------------------------------------------------
    def attribute(self, inst: Instruction, scope: dict[str, Instruction]) -> None:
        lx = self.lx
        key_tok = lx.expect_kind(NAME, "an attribute name")
        key = key_tok.text
        lx.expect("=")
        if key in inst.attrs or (key == "control-predecessors" and inst.control_predecessors):
            raise lx.error(f"attribute {key} given twice", key_tok.pos)
        kind = ATTR_KINDS.get(key, "raw")
        if kind == "instructions":
            for pname, pos in self.name_list():
                if pname not in scope:
                    raise lx.error(f"unknown instruction %{pname} in {key}", pos)
                inst.control_predecessors.append(scope[pname])
            return
        inst.attrs[key] = self.attr_value(key, kind, inst)

    def attr_value(self, key: str, kind: str, inst: Instruction) -> Any:
        lx = self.lx
        if kind == "ints":
            return self.int_list(key)
        if kind == "int":
            return self.integer(key)
        if kind == "bool":
            return self.boolean(key)
        if kind == "ident":
            return lx.expect_kind(NAME, f"an identifier for {key}").text
        if kind == "string":
            return unquote(lx.expect_kind(STRING, f"a quoted string for {key}").text)
        if kind == "float":
            tok = lx.peek()
            if tok.kind not in (NUMBER, NAME):
                lx.fail_expected(f"a number for {key}")
            try:
                value = float(tok.text)
            except ValueError:
                lx.fail_expected(f"a number for {key}")
            lx.next()
            return value
        if kind == "computation":
            tok = lx.peek()
            return self.computation_ref(self.name(f"a computation name for {key}"), tok.pos)
        if kind == "computations":
            return tuple(self.computation_ref(n, pos) for n, pos in self.name_list())
        if kind == "window":
            return self.window()
        if kind == "slice":
            return self.slice_spec()
        if kind == "padding":
            return self.padding_config()
        if kind == "dim_labels":
            pos = lx.token_start()
            text = lx.match(_DIM_LABELS)
            if text is None:
                lx.fail_expected("dim_labels like b01f_01io->b01f")
            try:
                return ConvDimLabels.parse(text)
            except ValueError as e:
                raise lx.error(str(e), pos) from None
        if kind == "replica_groups":
            return self.replica_groups()
        if kind == "int_pairs":
            return self.int_pairs(key)
        if kind == "idents":
            lx.expect("{")
            vals = []
            if not lx.at("}"):
                while True:
                    vals.append(lx.expect_kind(NAME, f"an identifier for {key}").text)
                    if not lx.accept(","):
                        break
            lx.expect("}")
            return tuple(vals)
        if kind == "metadata":
            return self.metadata()
        if kind == "frontend_attributes":
            return self.frontend_attributes()
        if kind == "sharding":
            pos = lx.token_start()
            if not lx.at("{"):
                lx.fail_expected("'{' starting a sharding")
            text = lx.balanced()
            line, col = lx.line_col(pos)
            return parse_sharding(text, lx.filename, line, col)
        return Raw(lx.balanced())

    def computation_ref(self, name: str, pos: int) -> Any:
        comp = self.computations.get(name)
        return comp if comp is not None else _ComputationRef(name, pos)

    def resolve_pending(self) -> None:
        """Replace forward computation references; link fusion bodies to their fusion."""
        def resolve(v: Any) -> Any:
            if isinstance(v, _ComputationRef):
                comp = self.computations.get(v.name)
                if comp is None:
                    raise self.lx.error(f"unknown computation %{v.name}", v.pos)
                return comp
            if isinstance(v, tuple) and any(isinstance(x, _ComputationRef) for x in v):
                return tuple(resolve(x) for x in v)
            return v

        for inst in self.module_.all_instructions():
            for key, v in list(inst.attrs.items()):
                inst.attrs[key] = resolve(v)
            if inst.opcode == "fusion" and isinstance(inst.attrs.get("calls"), Computation):
                inst.attrs["calls"].fusion_instruction = inst

    # --- attribute value forms ----------------------------------------------------------------
    def window(self) -> Window:
        lx = self.lx
        lx.expect("{")
        fields: dict[str, list] = {}
        while not lx.at("}"):
            key_tok = lx.expect_kind(NAME, "a window field (size, stride, pad, ...)")
            key = key_tok.text
            if key not in ("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
                raise lx.error(f"unknown window field {key!r}", key_tok.pos)
            lx.expect("=")
            if key == "pad":
                text = lx.match(_PAD_X)
                if text is None:
                    lx.fail_expected("window padding like 0_1x1_1")
                fields[key] = [tuple(int(v) for v in d.split("_")) for d in text.split("x")]
            else:
                text = lx.match(_DIMS_X)
                if text is None:
                    lx.fail_expected(f"window {key} like 3x3")
                fields[key] = [int(v) for v in text.split("x")]
        close = lx.expect("}")
        if not fields:
            return Window(())
        if "size" not in fields:
            raise lx.error("window has no size", close.pos)
        n = len(fields["size"])
        for key, vals in fields.items():
            if len(vals) != n:
                raise lx.error(f"window {key} has {len(vals)} dims but size has {n}", close.pos)
        dims = []
        for i in range(n):
            lo, hi = fields["pad"][i][:2] if "pad" in fields else (0, 0)
            dims.append(WindowDim(
                size=fields["size"][i],
                stride=fields.get("stride", [1] * n)[i],
                padding_low=lo, padding_high=hi,
                window_dilation=fields.get("rhs_dilate", [1] * n)[i],
                base_dilation=fields.get("lhs_dilate", [1] * n)[i],
                window_reversal=bool(fields.get("rhs_reversal", [0] * n)[i])))
        return Window(tuple(dims))

    def slice_spec(self) -> SliceSpec:
        lx = self.lx
        lx.expect("{")
        dims = []
        while not lx.at("}"):
            lx.expect("[")
            start = self.integer("slice start")
            lx.expect(":")
            limit = self.integer("slice limit")
            stride = 1
            if lx.accept(":"):
                stride = self.integer("slice stride")
            lx.expect("]")
            dims.append(SliceDim(start, limit, stride))
            if not lx.accept(","):
                break
        lx.expect("}")
        return SliceSpec(tuple(dims))

    def padding_config(self) -> PaddingConfig:
        lx = self.lx
        if lx.peek().kind != NUMBER:   # rank 0: ``padding=`` with nothing after it
            return PaddingConfig(())
        text = lx.match(_PAD_X)
        if text is None:
            lx.fail_expected("padding like 0_1x2_2_1")
        dims = []
        for d in text.split("x"):
            parts = [int(v) for v in d.split("_")]
            dims.append(PadDim(*parts))
        return PaddingConfig(tuple(dims))

    def replica_groups(self):
        lx = self.lx
        if lx.at("mesh"):
            return self.mesh_replica_groups()
        if lx.at("["):
            lx.expect("[")
            group_dims = self.int_seq("]", "replica group dims")
            lx.expect("<=")
            lx.expect("[")
            reshape = self.int_seq("]", "iota dims")
            transpose = None
            if lx.at("T"):
                lx.next()
                lx.expect("(")
                transpose = self.int_seq(")", "transpose permutation")
            if len(group_dims) != 2:
                lx.fail_expected("two replica group dims [groups,size]")
            return IotaReplicaGroups(tuple(group_dims), tuple(reshape), transpose)
        return ReplicaGroups(tuple(tuple(g) for g in self.int_pairs("replica_groups", 0)))

    def mesh_replica_groups(self) -> MeshReplicaGroups:
        """``mesh['x'=2,'y'=4][, device_ids=([2,4]T(1,0))] {'y'}``."""
        lx = self.lx
        start = lx.token_start()
        text = lx.match(_MESH_GROUPS)
        if text is None:
            raise lx.error("expected replica groups mesh['axis'=size,...] {'axis',...}", start)
        m = _MESH_GROUPS.match(text)
        assert m is not None
        axes = tuple((a, int(n)) for a, n in re.findall(r"'([^']+)'\s*=\s*(\d+)", m["axes"]))
        groups = tuple(re.findall(r"'([^']+)'", m["group"]))
        unknown = [g for g in groups if g not in dict(axes)]
        if unknown:
            raise lx.error(f"replica groups name axis '{unknown[0]}', which the mesh "
                           f"{[a for a, _ in axes]} does not have", start)
        ids = None
        if m["dims"] is not None:
            perm = tuple(int(v) for v in m["perm"].split(",")) if m["perm"] else None
            ids = (tuple(int(v) for v in m["dims"].split(",")), perm)
        return MeshReplicaGroups(axes, groups, ids)

    def int_pairs(self, key: str, arity: int = 2) -> tuple[tuple[int, ...], ...]:
        """``{{0,1},{1,0}}``; ``arity`` 0 allows any group length."""
        lx = self.lx
        lx.expect("{")
        groups = []
        while lx.at("{"):
            pos = lx.token_start()
            g = self.int_list(key)
            if arity and len(g) != arity:
                raise lx.error(f"expected {arity} integers in each group of {key}", pos)
            groups.append(g)
            if not lx.accept(","):
                break
        lx.expect("}")
        return tuple(groups)

    def metadata(self) -> Metadata:
        lx = self.lx
        lx.expect("{")
        fields = []
        while not lx.at("}"):
            key = lx.expect_kind(NAME, "a metadata field name").text
            lx.expect("=")
            tok = lx.peek()
            if tok.kind == STRING:
                value: Any = unquote(lx.next().text)
            elif tok.kind == NUMBER and _INT.match(tok.text):
                value = int(lx.next().text)
            elif tok.text in ("true", "false") and tok.kind == NAME:
                value = lx.next().text == "true"
            else:
                value = Raw(lx.balanced_word())
            fields.append((key, value))
            lx.accept(",")
        lx.expect("}")
        return Metadata(tuple(fields))

    def frontend_attributes(self) -> FrontendAttributes:
        lx = self.lx
        lx.expect("{")
        items = []
        while not lx.at("}"):
            tok = lx.peek()
            if tok.kind == STRING:
                key = unquote(lx.next().text)
            else:
                key = lx.expect_kind(NAME, "a frontend attribute name").text
            lx.expect("=")
            tok = lx.peek()
            if tok.kind == STRING:
                value = unquote(lx.next().text)
            else:
                value = lx.expect_kind(NAME, "a frontend attribute value").text
            items.append((key, value))
            if not lx.accept(","):
                break
        lx.expect("}")
        return FrontendAttributes(tuple(items))

    # --- shapes ---------------------------------------------------------------------------------
    def shape(self) -> AnyShape:
        lx = self.lx
        if lx.accept("("):
            return TupleShape(tuple(self.shape_list(")")))
        tok = lx.peek()
        if tok.kind != NAME or tok.text not in dt.BY_NAME:
            lx.fail_expected("a shape")
        lx.next()
        dtype = dt.BY_NAME[tok.text]
        if not lx.adjacent("["):
            lx.fail_expected(f"'[' after element type {tok.text}")
        lx.expect("[")
        dims: list[int] = []
        if not lx.at("]"):
            while True:
                t = lx.peek()
                if t.text in ("<=", "?", "<"):
                    raise lx.error("dynamic dimensions are not supported", t.pos)
                if t.kind != NUMBER or not _INT.match(t.text) or int(t.text) < 0:
                    lx.fail_expected("a dimension size")
                if int(t.text) >= 1 << 63:
                    raise lx.error(f"dimension size {t.text} does not fit in s64", t.pos)
                dims.append(int(lx.next().text))
                if not lx.accept(","):
                    break
        lx.expect("]")
        layout = None
        if lx.adjacent("{"):
            layout = self.layout(len(dims))
        if layout is not None and not dims and not layout.extra:
            layout = None   # scalars have no layout to keep
        try:
            return Shape(dtype, tuple(dims), layout)
        except HlotkError as e:
            raise lx.error(str(e), tok.pos) from None

    def layout(self, rank: int) -> Layout:
        lx = self.lx
        open_tok = lx.expect("{")
        m2m: list[int] = []
        while lx.peek().kind == NUMBER:
            m2m.append(self.integer("layout"))
            if not lx.accept(","):
                break
        extra = ""
        if lx.adjacent(":") or lx.at(":"):
            lx.expect(":")
            start = lx.pos
            depth = 0
            while lx.pos < len(lx.text):
                ch = lx.text[lx.pos]
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    depth -= 1
                elif ch == "}" and depth == 0:
                    break
                lx.pos += 1
            extra = lx.text[start:lx.pos].strip()
        lx.expect("}")
        if sorted(m2m) != list(range(rank)):
            raise lx.error(f"layout {{{','.join(map(str, m2m))}}} is not a permutation of "
                           f"{rank} dimensions", open_tok.pos)
        return Layout(tuple(m2m), extra)

    def shape_list(self, close: str) -> list[AnyShape]:
        lx = self.lx
        out: list[AnyShape] = []
        if not lx.at(close):
            while True:
                out.append(self.shape())
                if not lx.accept(","):
                    break
        lx.expect(close)
        return out

    # --- literals -------------------------------------------------------------------------------
    def literal(self, shape: AnyShape):
        lx = self.lx
        if lx.at("{") and self._elided():
            return None
        if shape.is_tuple:
            lx.expect("(")
            parts = []
            for i, el in enumerate(shape.elements):
                if i:
                    lx.expect(",")
                parts.append(self.literal(el))
            lx.expect(")")
            return tuple(parts)
        if not shape.is_array:
            return None
        dtype = shape.dtype
        if not shape.dims:
            return np.asarray(self.scalar_value(dtype), dtype=dtype.np_dtype).reshape(())
        values: list = []
        self.nested(shape.dims, 0, values, dtype)
        return np.asarray(values, dtype=dtype.np_dtype).reshape(shape.dims)

    def _elided(self) -> bool:
        """``{...}``: XLA left the value out."""
        lx = self.lx
        save = lx.pos
        lx.expect("{")
        if lx.text.startswith("...", lx.token_start()):
            lx.pos += 3
            lx.expect("}")
            return True
        lx.pos = save
        return False

    def nested(self, dims: tuple[int, ...], level: int, out: list, dtype: dt.DType) -> None:
        lx = self.lx
        lx.expect("{")
        n = 0
        if not lx.at("}"):
            while True:
                if level + 1 < len(dims):
                    self.nested(dims, level + 1, out, dtype)
                else:
                    out.append(self.scalar_value(dtype))
                n += 1
                if not lx.accept(","):
                    break
        close = lx.peek()
        if n != dims[level]:
            raise lx.error(f"literal has {n} elements in dimension {level} but the shape "
                           f"says {dims[level]}", close.pos)
        lx.expect("}")

    def scalar_value(self, dtype: dt.DType):
        lx = self.lx
        tok = lx.peek()
        if dtype.is_complex:
            lx.expect("(")
            re_ = self.scalar_value(dtype.component)
            lx.expect(",")
            im = self.scalar_value(dtype.component)
            lx.expect(")")
            return complex(float(re_), float(im))
        if dtype.is_pred:
            if tok.text in ("true", "1"):
                lx.next()
                return True
            if tok.text in ("false", "0"):
                lx.next()
                return False
            lx.fail_expected("a pred value (true, false, 1 or 0)")
        if tok.kind not in (NUMBER, NAME) or tok.text in ("{", "}"):
            lx.fail_expected(f"a {dtype.name} value")
        text = tok.text
        if dtype.is_integer:
            if not _INT.match(text):
                lx.fail_expected(f"an integer {dtype.name} value")
            value = int(text)
            info = np.iinfo(dtype.np_dtype) if dtype.bits >= 8 else None
            lo, hi = ((int(info.min), int(info.max)) if info is not None else
                      ((-(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1) if dtype.is_signed
                       else (0, (1 << dtype.bits) - 1)))
            if not lo <= value <= hi:
                raise lx.error(f"{text} is out of range for {dtype.name}", tok.pos)
            lx.next()
            return value
        try:
            value = float(text)
        except ValueError:
            lx.fail_expected(f"a {dtype.name} value")
        lx.next()
        return value

    # --- small pieces -----------------------------------------------------------------------------
    def name(self, what: str) -> str:
        tok = self.lx.peek()
        if tok.kind != NAME:
            self.lx.fail_expected(what, tok)
        self.lx.next()
        return tok.text[1:] if tok.text.startswith("%") else tok.text

    def name_list(self) -> list[tuple[str, int]]:
        lx = self.lx
        lx.expect("{")
        out = []
        if not lx.at("}"):
            while True:
                pos = lx.token_start()
                out.append((self.name("a name"), pos))
                if not lx.accept(","):
                    break
        lx.expect("}")
        return out

    def integer(self, what: str) -> int:
        tok = self.lx.peek()
        if tok.kind != NUMBER or not _INT.match(tok.text):
            self.lx.fail_expected(f"an integer for {what}", tok)
        self.lx.next()
        return int(tok.text)

    def boolean(self, what: str) -> bool:
        tok = self.lx.peek()
        if tok.text not in ("true", "false") or tok.kind != NAME:
            self.lx.fail_expected(f"true or false for {what}", tok)
        self.lx.next()
        return tok.text == "true"

    def int_list(self, what: str) -> tuple[int, ...]:
        self.lx.expect("{")
        return self.int_seq("}", what)

    def int_seq(self, close: str, what: str) -> tuple[int, ...]:
        lx = self.lx
        out = []
        if not lx.at(close):
            while True:
                out.append(self.integer(what))
                if not lx.accept(","):
                    break
        lx.expect(close)
        return tuple(out)
