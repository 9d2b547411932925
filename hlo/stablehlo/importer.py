"""StableHLO (as JAX exports it) -> hlotk's HLO ``Module``.

Entry points: ``from_jax(fn, *args)``, ``from_exported(exported)`` and
``from_stablehlo(text_or_bytes)``. The MLIR is read with the bindings JAX ships; nothing
goes through XLA. The per-op rules live in ``ops_table.py`` (StableHLO) and ``chlo.py``
(CHLO decompositions); this module owns the walk: functions, regions, implicit captures,
multi-result values, names, metadata and the module config.
"""
from __future__ import annotations

import itertools
import re
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..attrs import FrontendAttributes, Raw
from ..errors import HloImportError
from ..ir import Computation, Instruction, Module
from ..shape import AnyShape, Shape, TupleShape
from .mlir_utils import (isa, location_metadata, make_context, short_location, to_shape)

# op name -> rule(importer, scope, op) -> Instruction | list[Instruction] | None
OP_RULES: dict[str, Callable] = {}


def op_rule(*names: str):
    def deco(fn):
        for n in names:
            OP_RULES[n] = fn
        return fn
    return deco


class _Pending:
    """Result ``index`` of a tuple-shaped instruction; a get-tuple-element on first use."""
    __slots__ = ("tuple_inst", "index")

    def __init__(self, tuple_inst: Instruction, index: int):
        self.tuple_inst = tuple_inst
        self.index = index


class Scope:
    """One computation being built and the MLIR values visible in it."""

    def __init__(self, comp: Computation):
        self.comp = comp
        self.values: dict[Any, Any] = {}


class Importer:
    def __init__(self, module_name: str, options: Optional[dict] = None):
        self.module = Module(module_name)
        self._ids = itertools.count(1)
        self.funcs: dict[str, Any] = {}
        self.func_comps: dict[str, Computation] = {}
        self._building: set[str] = set()
        self.sdy_meshes: dict[str, Any] = {}   # sdy.mesh symbol -> shardy.Mesh
        self.options = options or {}

    # --- naming and emitting -------------------------------------------------------------
    def next_id(self) -> int:
        return next(self._ids)

    def new_computation(self, base: str) -> Computation:
        comp = Computation(f"{_sanitize(base)}.{self.next_id()}")
        self.module.add_computation(comp)
        return comp

    def emit(self, scope: Scope, opcode: str, operands: Sequence[Instruction], shape: AnyShape,
             attrs: Optional[dict] = None, op: Any = None, literal: Any = None,
             name: Optional[str] = None) -> Instruction:
        attrs = dict(attrs or {})
        if op is not None:
            md = _metadata(self, op.location)
            if md is not None and "metadata" not in attrs:
                attrs["metadata"] = md
            self._common_attrs(op, attrs)
        inst = Instruction(opcode, list(operands), shape, attrs, literal=literal)
        return scope.comp.add_instruction(inst, name=name or f"{opcode}.{self.next_id()}")

    def _common_attrs(self, op: Any, attrs: dict) -> None:
        a = op.attributes
        if "mhlo.sharding" in a and "sharding" not in attrs:
            attrs["sharding"] = parse_sharding_text(_string_value(a["mhlo.sharding"]))
        elif "sdy.sharding" in a and "sharding" not in attrs:
            from .shardy import sharding_attr
            attrs["sharding"] = sharding_attr(self, a["sdy.sharding"], op.operation.name)
        if "mhlo.frontend_attributes" in a:
            attrs["frontend_attributes"] = dict_to_frontend(a["mhlo.frontend_attributes"])

    def constant(self, scope: Scope, value: Any, dtype, op: Any = None) -> Instruction:
        arr = np.asarray(value).astype(dtype.np_dtype)
        return self.emit(scope, "constant", [], Shape(dtype, arr.shape, _layout(arr.ndim)),
                         literal=arr, op=op)

    # --- values ------------------------------------------------------------------------
    def get(self, scope: Scope, value: Any) -> Instruction:
        try:
            v = scope.values[value]
        except KeyError:
            raise HloImportError(f"value {value.get_name() if hasattr(value, 'get_name') else value}"
                                 f" is not visible in computation %{scope.comp.name}") from None
        if isinstance(v, _Pending):
            t = v.tuple_inst
            gte = self.emit(scope, "get-tuple-element", [t], t.shape.elements[v.index],
                            {"index": v.index})
            scope.values[value] = gte
            return gte
        return v

    def operands(self, scope: Scope, op: Any) -> list[Instruction]:
        return [self.get(scope, v) for v in op.operands]

    def bind_results(self, scope: Scope, op: Any, result: Any) -> None:
        results = list(op.results)
        if result is None:
            if results:
                raise HloImportError("rule produced no value", op=op.operation.name,
                                     location=short_location(op.location))
            return
        if isinstance(result, (list, tuple)):
            if len(result) != len(results):
                raise HloImportError(f"rule produced {len(result)} values for "
                                     f"{len(results)} results", op=op.operation.name)
            for r, inst in zip(results, result):
                scope.values[r] = inst
        elif len(results) == 1:
            scope.values[results[0]] = result
        else:
            # One tuple-shaped instruction for several results (XLA's way).
            for i, r in enumerate(results):
                scope.values[r] = _Pending(result, i)

    def tuple_or_single(self, scope: Scope, insts: list[Instruction]) -> Instruction:
        if len(insts) == 1:
            return insts[0]
        return self.emit(scope, "tuple", insts, TupleShape(tuple(i.shape for i in insts)))

    # --- blocks, regions, functions ---------------------------------------------------
    def import_block(self, scope: Scope, block: Any) -> list[Instruction]:
        """Import the ops of ``block``; return the terminator's operands."""
        for op in block.operations:
            name = op.operation.name
            if name in ("stablehlo.return", "func.return", "mhlo.return", "sdy.return"):
                return self.operands(scope, op)
            rule = OP_RULES.get(name) or _late_rule(name)
            if rule is None:
                raise HloImportError("unsupported operation", op=name,
                                     location=short_location(op.location))
            try:
                result = rule(self, scope, op)
            except HloImportError:
                raise
            except (ValueError, TypeError, KeyError, IndexError) as e:
                raise HloImportError(f"cannot import: {type(e).__name__}: {e}", op=name,
                                     location=short_location(op.location)) from e
            self.bind_results(scope, op, result)
        return []

    def region_computation(self, region: Any, base: str, tuple_params: bool = False,
                           captures: Sequence[Any] = (), outer: Optional[Scope] = None,
                           extra_results: bool = False, force_tuple: bool = False) -> Computation:
        """A computation from a one-block region.

        Flat (default): one parameter per block argument. ``tuple_params``: one tuple
        parameter holding the block arguments then ``captures`` (values the region uses from
        outside, which XLA passes explicitly). ``extra_results``: append the captures to the
        returned tuple unchanged (a while body must return its whole loop state).
        """
        comp = self.new_computation(base)
        scope = Scope(comp)
        block = region.blocks[0]
        args = list(block.arguments)
        # Constants a region uses from outside are re-created inside it (as XLA does), so
        # they need not travel as operands.
        constants = [v for v in free_values([region]) if _is_constant(v)]
        captures = [c for c in captures if not _is_constant(c)]
        for v in constants:
            owner = v.owner
            self.bind_results(scope, owner, OP_RULES["stablehlo.constant"](self, scope, owner))
        if tuple_params:
            elems = [to_shape(a.type) for a in args] + [to_shape(c.type) for c in captures]
            all_vals = args + list(captures)
            if len(all_vals) == 1 and not force_tuple:
                p = self._param(comp, 0, elems[0])
                scope.values[all_vals[0]] = p
            else:
                p = self._param(comp, 0, TupleShape(tuple(elems)))
                for i, v in enumerate(all_vals):
                    scope.values[v] = _Pending(p, i)
        else:
            for i, a in enumerate(args):
                scope.values[a] = self._param(comp, i, to_shape(a.type))
        outs = self.import_block(scope, block)
        if extra_results:
            outs = outs + [self.get(scope, c) for c in captures]
        comp.root = self._root(scope, outs)
        return comp

    def _root(self, scope: Scope, outs: list[Instruction]) -> Instruction:
        if len(outs) == 1:
            return outs[0]
        return self.emit(scope, "tuple", outs, TupleShape(tuple(o.shape for o in outs)))

    def _param(self, comp: Computation, n: int, shape: AnyShape, name: str = "") -> Instruction:
        base = _sanitize(name) if name else f"Arg_{n}"
        inst = Instruction("parameter", [], shape, parameter_number=n)
        return comp.add_instruction(inst, name=f"{base}.{self.next_id()}")

    def func_computation(self, sym: str, entry: bool = False) -> Computation:
        """The computation of ``func.func @sym`` (built once, shared by every call)."""
        if sym in self.func_comps:
            return self.func_comps[sym]
        if sym in self._building:
            raise HloImportError(f"recursive call to @{sym} is not supported", op="func.call")
        f = self.funcs.get(sym)
        if f is None:
            raise HloImportError(f"call to unknown function @{sym}", op="func.call")
        self._building.add(sym)
        comp = self.new_computation("main" if entry else sym)
        scope = Scope(comp)
        block = f.regions[0].blocks[0]
        arg_attrs = _array_of_dicts(f, "arg_attrs")
        for i, a in enumerate(block.arguments):
            name = _loc_name(a.location) if entry else ""
            p = self._param(comp, i, to_shape(a.type, LazyLocation(a.location)), name)
            if i < len(arg_attrs):
                d = arg_attrs[i]
                if "mhlo.sharding" in d:
                    p.attrs["sharding"] = parse_sharding_text(_string_value(d["mhlo.sharding"]))
                elif "sdy.sharding" in d:
                    from .shardy import sharding_attr
                    p.attrs["sharding"] = sharding_attr(self, d["sdy.sharding"])
            scope.values[a] = p
        outs = self.import_block(scope, block)
        if not outs:
            root = self.emit(scope, "tuple", [], TupleShape(()))
        else:
            root = self._root(scope, outs)
        res_attrs = _array_of_dicts(f, "res_attrs")
        shardings = [_string_value(d["mhlo.sharding"]) if "mhlo.sharding" in d else None
                     for d in res_attrs]
        if any("sdy.sharding" in d for d in res_attrs):
            from .shardy import sharding_attr
            sdy = [sharding_attr(self, d["sdy.sharding"]) if "sdy.sharding" in d else None
                   for d in res_attrs]
            shardings = [None if s is None else s.to_text() for s in sdy]
        if any(s is not None for s in shardings):
            if len(outs) == 1:
                root.attrs["sharding"] = parse_sharding_text(shardings[0])
            else:
                parts = [s if s is not None else "{replicated}" for s in shardings]
                root.attrs["sharding"] = parse_sharding_text("{" + ", ".join(parts) + "}")
        comp.root = root
        self.func_comps[sym] = comp
        self._building.discard(sym)
        return comp


def _is_constant(v: Any) -> bool:
    try:
        return v.owner.operation.name == "stablehlo.constant"
    except AttributeError:  # block arguments have a Block as owner
        return False


def free_values(regions: Sequence[Any]) -> list[Any]:
    """Values used inside ``regions`` but defined outside them, in first-use order."""
    defined: set = set()
    used: list = []

    def walk_region(r):
        for b in r.blocks:
            for a in b.arguments:
                defined.add(a)
            for op in b.operations:
                for res in op.results:
                    defined.add(res)
                for v in op.operands:
                    used.append(v)
                for sub in op.regions:
                    walk_region(sub)
    for r in regions:
        walk_region(r)
    out, seen = [], set()
    for v in used:
        if v not in defined and v not in seen:
            seen.add(v)
            out.append(v)
    return out


# --- helpers shared with the op tables ---------------------------------------------------
def _layout(rank: int):
    from ..shape import Layout
    return Layout.row_major(rank)


def _sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.\-]", "_", name).strip("_.") or "x"
    if s[0].isdigit() or s[0] in "-":
        s = "_" + s
    return s


def _loc_name(loc: Any) -> str:
    m = re.match(r'^loc\("((?:[^"\\]|\\.)*)"\)$', str(loc))
    return m.group(1) if m else ""


def _string_value(attr: Any) -> str:
    from jaxlib.mlir import ir
    if isa(attr, ir.StringAttr):
        return ir.StringAttr(attr).value
    return str(attr)


def _array_of_dicts(f: Any, key: str) -> list:
    from jaxlib.mlir import ir
    if key not in f.attributes:
        return []
    arr = ir.ArrayAttr(f.attributes[key])
    return [ir.DictAttr(a) for a in arr]


def parse_sharding_text(text: str) -> Any:
    """``mhlo.sharding`` text -> hlo.sharding's object when that module exists, else Raw."""
    try:
        from ..sharding import parse_sharding  # written by another helper
    except ImportError:
        return Raw(text)
    try:
        return parse_sharding(text)
    except Exception:
        return Raw(text)


def dict_to_frontend(attr: Any) -> FrontendAttributes:
    from jaxlib.mlir import ir
    d = ir.DictAttr(attr)
    items = []
    for i in range(len(d)):
        na = d[i]
        items.append((na.name, _string_value(na.attr)))
    return FrontendAttributes(tuple(items))


# --- public API -------------------------------------------------------------------------
def _import_mlir_module(mlir_module: Any, options: Optional[dict] = None) -> Module:
    from jaxlib.mlir import ir
    op = mlir_module.operation
    name = "module"
    if "sym_name" in op.attributes:
        name = ir.StringAttr(op.attributes["sym_name"]).value
    imp = Importer(_sanitize(name), options)
    funcs = []
    for f in mlir_module.body.operations:
        if f.operation.name == "func.func":
            sym = ir.StringAttr(f.attributes["sym_name"]).value
            imp.funcs[sym] = f
            funcs.append((sym, f))
        elif f.operation.name in ("sdy.mesh",):
            from .shardy import mesh_of_op
            sym, mesh = mesh_of_op(f)   # Shardy shardings name it; they convert to HLO's
            imp.sdy_meshes[sym] = mesh
            continue
        else:
            raise HloImportError("unsupported top-level operation", op=f.operation.name,
                                 location=short_location(f.location))
    if not funcs:
        raise HloImportError("the module has no func.func")
    entry_sym = (options or {}).get("entry")
    if entry_sym is not None and entry_sym not in imp.funcs:
        raise HloImportError(f"entry function @{entry_sym} is not in the module")
    if entry_sym is None:
        entry_sym = "main" if "main" in imp.funcs else None
    if entry_sym is None:
        public = [s for s, f in funcs if "sym_visibility" not in f.attributes
                  or ir.StringAttr(f.attributes["sym_visibility"]).value == "public"]
        entry_sym = (public or [funcs[0][0]])[0]
    entry = imp.func_computation(entry_sym, entry=True)
    m = imp.module
    m.entry = entry
    # Callees first, entry last, as XLA prints; drop functions nothing calls.
    order = m.reachable_computations()
    for c in list(m.computations):
        if c not in order:
            m.remove_computation(c)
    m.computations = order
    _set_config(m, op)
    return m


def _set_config(m: Module, op: Any) -> None:
    from jaxlib.mlir import ir
    for src, dst in (("mhlo.num_replicas", "replica_count"),
                     ("mhlo.num_partitions", "num_partitions")):
        if src in op.attributes:
            n = ir.IntegerAttr(op.attributes[src]).value
            if n != 1:
                m.config[dst] = n
    entry = m.entry
    from ..text.parser import ComputationLayout
    m.config["entry_computation_layout"] = ComputationLayout(
        tuple(p.shape for p in entry.parameters), entry.root.shape)
    if "mhlo.frontend_attributes" in op.attributes:
        m.config["frontend_attributes"] = dict_to_frontend(op.attributes["mhlo.frontend_attributes"])


def _ensure_rules() -> None:
    from . import ops_table  # noqa: F401  (register OP_RULES; chlo, sdy: _late_rule)


def from_stablehlo(text_or_bytes: str | bytes, **options: Any) -> Module:
    """Import StableHLO given as ``.mlir`` text, MLIR bytecode, or ``Exported.serialize()``.

    Options: ``entry="name"`` picks the entry function (default ``main``, else the first
    public one); ``allow_unregistered=True`` lets the MLIR parser accept unknown dialects.
    """
    _ensure_rules()
    data = text_or_bytes
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        if data.startswith(b"ML\xefR"):
            return _parse_and_import(data, options, portable=True)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\x00" in text:
            # Not text: a jax.export flatbuffer (``Exported.serialize()``), or garbage.
            try:
                from jax import export
                exp = export.deserialize(bytearray(data))
            except Exception:  # flatbuffer errors have no documented type
                raise HloImportError("input is neither MLIR text, MLIR bytecode nor a "
                                     "serialized jax.export.Exported") from None
            return from_exported(exp, **options)
        data = text
    if not isinstance(data, str):
        raise HloImportError(f"from_stablehlo expects str or bytes, got {type(data).__name__}")
    _check_nesting(data)
    if "!quant." in data:
        # JAX's MLIR has no quant dialect: lower quantized types and ops on the text first.
        from .quant import lower_quantized
        data = lower_quantized(data)
    return _parse_and_import(data, options)


def _parse_and_import(data: str | bytes, options: dict, portable: bool = False) -> Module:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as sh
    ctx = make_context(allow_unregistered=bool(options.get("allow_unregistered")))
    with ctx, ir.Location.unknown():
        try:
            mod = None
            if portable:  # bytecode may be a VHLO portable artifact or plain StableHLO
                try:
                    mod = sh.deserialize_portable_artifact(ctx, data)
                except Exception:
                    mod = None
            if mod is None:
                mod = ir.Module.parse(data)
        except ir.MLIRError as e:
            if '!"quant"' in str(e):
                # jaxlib registers no quant dialect, so `!quant.uniform` cannot even parse.
                raise HloImportError("quantized types (!quant.uniform) are not supported: "
                                     "the MLIR context JAX provides has no quant dialect") \
                    from None
            msg = str(e).strip().splitlines()
            detail = "; ".join(line.strip() for line in msg[1:3]) or msg[0]
            diagnostics = getattr(e, "error_diagnostics", None) or []
            where = short_location(diagnostics[0].location) if diagnostics else _TOP
            raise HloImportError(f"cannot parse MLIR: {detail}", location=where) from None
        except Exception as e:
            raise HloImportError(f"cannot parse MLIR: {e}", location=_TOP) from None
        try:
            return _import_mlir_module(mod, options)
        except RecursionError:
            raise HloImportError("types nest too deeply to import", location=_TOP) from None
        except (ValueError, TypeError, KeyError, IndexError) as e:
            # A module or function attribute of the wrong kind (`num_partitions = i32`): the
            # MLIR bindings' casts raise these; ops' own are located by import_block.
            raise HloImportError(f"cannot import: {type(e).__name__}: {e}",
                                 location=_module_location(mod)) from e
        except HloImportError as e:
            if e.location:
                raise
            # A module-level problem (no function, no entry): point at the module itself.
            raise HloImportError(e.message, op=e.op, location=_TOP) from e


# Where a problem of the whole input is reported: MLIR names text input "-".
_TOP = "-:1:1"


def _module_location(mod: Any) -> str:
    where = short_location(mod.operation.location)
    return where if re.search(r":\d+:\d+$", where) else _TOP
# MLIR's parser recurses on nested types, attributes and literals with no depth limit of its
# own: tens of thousands of levels overflow the C stack and the process dies (SIGSEGV). Real
# programs nest a few levels; past this the input is refused before MLIR sees it.
MAX_NESTING = 200
_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|->|[<>=]=|[(\[{<]|[)\]}>]')


def _check_nesting(text: str) -> None:
    depth = 0
    for m in _BRACKETS.finditer(text):
        tok = m.group()
        if len(tok) > 1:        # a string, an arrow, <= / >=
            continue
        depth += 1 if tok in "([{<" else -1
        if depth > MAX_NESTING:
            line = text.count("\n", 0, m.start()) + 1
            col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
            raise HloImportError(f"brackets nest deeper than {MAX_NESTING} levels",
                                 location=f"-:{line}:{col}")


def from_exported(exported: Any, **options: Any) -> Module:
    """Import a ``jax.export.Exported``."""
    _ensure_rules()
    try:
        bytecode = exported.mlir_module_serialized
    except AttributeError:
        raise HloImportError(f"expected a jax.export.Exported, got {type(exported).__name__}") \
            from None
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as sh
    ctx = make_context()
    with ctx, ir.Location.unknown():
        # jax.export stores a portable artifact (VHLO bytecode); turn it back into StableHLO.
        try:
            mod = sh.deserialize_portable_artifact(ctx, bytecode)
        except Exception:
            mod = ir.Module.parse(exported.mlir_module())
        m = _import_mlir_module(mod, options)
    if exported.fun_name and m.name == "module":
        m.name = _sanitize("jit_" + exported.fun_name)
    return m


def export_jax(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``from_jax``'s first step: ``fn`` traced and exported (``jax.Exported``). Kept on
    these lines: JAX names the exporting line in some instructions' source metadata, the
    same for ``from_jax`` and for ``runtime.jit`` (which imports through its cache).
    ``args``: as ``from_jax``; the import's errors (HloImportError) pass through, the
    tracing's are JAX's own.
    """
    import jax
    from jax import export
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, keep_unused=True)
    try:
        exp = export.export(jitted)(*args, **kwargs)
    except HloImportError:
        raise
    return exp


def from_jax(fn: Callable, *args: Any, **kwargs: Any) -> Module:
    """Trace ``fn`` with JAX (``jax.export``) and import the StableHLO it lowers to.

    ``args`` are arrays or ``jax.ShapeDtypeStruct`` (pytrees flatten as JAX does). Every
    argument leaf becomes an entry parameter, used or not (``keep_unused``), so the module's
    signature is the function's; pass an already-jitted function to choose otherwise.
    """
    return from_exported(export_jax(fn, *args, **kwargs))


def _late_rule(name: str) -> Optional[Callable]:
    """The rule for a ``chlo.*`` or ``sdy.*`` op, from the module that registers those
    rules, imported on the first such op (issue 13: a program without them no longer
    imports chlo, its math and shardy: ~10 ms of a process's first lower where Python
    compiles them from source); None for an op that no module has a rule for."""
    if name.startswith("chlo."):
        from . import chlo  # noqa: F401  (registers its rules in OP_RULES)
    elif name.startswith("sdy."):
        from . import shardy  # noqa: F401
    else:
        return None
    return OP_RULES.get(name)


# Below export_jax: JAX names export_jax's exporting line in some instructions' metadata,
# so code added above it would change imported modules (and the recorded hashes of
# benchmarks/passes_identity_before.json).
from .mlir_utils import LazyLocation  # noqa: E402  (a parameter's shape's error location)

_NO_METADATA = object()     # _metadata's "not seen yet" (None is "no metadata")


def _metadata(imp: Importer, loc: Any) -> Any:
    """``location_metadata(loc)``, once per distinct location of ``imp``'s import. A
    location is an attribute uniqued in the module's context (equal locations: one pointer,
    which is what the bindings hash and compare), and ops of one source line share one:
    the Adam step's 539 ops have 21. Printing a location to parse it costs a call into
    MLIR per op (issue 13: ~3.5 ms of the Adam step's ~11 ms import)."""
    try:
        cache = imp.__dict__.setdefault("_metadata", {})
        key = loc.attr
        md = cache.get(key, _NO_METADATA)
    except Exception:  # noqa: BLE001  (bindings without location attributes)
        return location_metadata(loc)
    if md is _NO_METADATA:
        md = cache[key] = location_metadata(loc)
    return md
