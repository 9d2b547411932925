"""The HLO verifier: ``verify(module)`` raises ``VerifierError`` naming the computation and
instruction that break an invariant.

Structural checks (names, parameters, users, order, called computations, layouts) are
here; shape checks come from shape inference (``hlo.shape_inference``), which also checks
the signatures of called computations (reducers, comparators, loop bodies, branches).
Per-op extra checks are attached with ``@rule("verify", opcode)`` as ``fn(inst)``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import numpy as np

from . import shape_inference as si
from .attrs import COMPUTATION_ATTRS, Raw
from .errors import HlotkError, ShapeError, VerifierError
from .ir import Computation, Instruction, Module
from .ops import VARIADIC, rule
from .shape import AnyShape, Shape, TupleShape, leaf_paths

# Ops whose declared element type may differ from the inferred one: XLA's
# preferred_element_type (e.g. s8 x s8 -> s32, bf16 x bf16 -> f32).
_PREFERRED_TYPE_OPS = ("dot", "convolution", "ragged-dot")


def verify(module: Module) -> None:
    """Check every invariant of ``module``; raise VerifierError on the first violation."""
    _check_module_structure(module)
    passed = _Passed()
    for comp in module.computations:
        _check_computation(module, comp, passed)
    _check_entry_layout(module)


# An instruction without these calls no computation (``Instruction.called_computations``).
_CALLING_ATTRS = frozenset(COMPUTATION_ATTRS)

# Attributes no shape inference rule reads (the rules read theirs by name; these are on
# nearly every instruction, and metadata differs between any two).
_NOT_INFERRED_FROM = frozenset(("metadata", "frontend_attributes", "statistics"))


class _Passed:
    """What one ``verify`` call has already checked and found good, by value (issue 13:
    an optimizer step's ~1,000 instructions have ~80 distinct (opcode, operand shapes,
    attributes) and ~15 distinct shapes; inferring each instruction's shape was half the
    verifier). Shapes are immutable values and the rules pure functions of the operand
    shapes, attributes and (for collectives) the module, which a verification does not
    change; called computations are keys by identity. Only successes are kept: a check
    that fails raises at once, and a later equal check would fail the same way.

    Each distinct shape whose layout check passed gets a number, and each instruction the
    number of its shape: an instruction's key holds its operands' numbers (hashing shapes,
    nested frozen dataclasses, cost as much as the inference it saves)."""

    def __init__(self) -> None:
        self.numbers: dict[AnyShape, int] = {}
        # The same by the shape object's id (instructions share shape objects: an imported
        # module's ~640 have 7), with the objects held so that no id is reused meanwhile.
        self.number_by_id: dict[int, int] = {}
        self.held: list[AnyShape] = []
        self.number_of: dict[int, int] = {}     # id(inst) -> the number of its shape
        self.shapes: set[tuple] = set()         # keys whose ``_check_shape`` passed

    def layouts_checked(self, inst: Instruction, err) -> None:
        """``_check_layouts(inst)`` unless an equal shape passed it; numbers the shape."""
        shape = inst.shape
        n = self.number_by_id.get(id(shape))
        if n is None:
            try:
                n = self.numbers.get(shape)
            except TypeError:          # not hashable: a number of its own, never shared
                _check_layouts(inst, err)
                n = -1 - len(self.held)
            if n is None:
                _check_layouts(inst, err)
                n = self.numbers[shape] = len(self.numbers)
            self.number_by_id[id(shape)] = n
            self.held.append(shape)
        self.number_of[id(inst)] = n

    def key(self, inst: Instruction) -> tuple:
        """What ``_check_shape`` reads: the opcode, the numbers of the declared shape and
        of the operands' shapes, the attributes with their types. Operands come before
        their users (``_check_edges`` has checked), so they have numbers."""
        number_of = self.number_of
        shapes = (number_of[id(inst)], *map(number_of.__getitem__, map(id, inst.operands)))
        attrs = inst.attrs
        if attrs.keys() <= _NOT_INFERRED_FROM:
            return (inst.opcode, shapes)
        # The value's type too: equal values of other types (1, True, 1.0) hash alike.
        return (inst.opcode, shapes, tuple(
            (k, type(v), v) for k, v in attrs.items() if k not in _NOT_INFERRED_FROM))


# --- module level ----------------------------------------------------------------------
def _check_module_structure(module: Module) -> None:
    if module.entry is None:
        raise VerifierError(f"module {module.name} has no entry computation")
    if module.entry not in module.computations:
        raise VerifierError("the entry computation is not in the module's computation list",
                            computation=module.entry.name)
    comp_names: set[str] = set()
    inst_names: dict[str, str] = {}
    for comp in module.computations:
        if comp.parent is not module:
            raise VerifierError("computation's parent is not this module", computation=comp.name)
        if comp.name in comp_names:
            raise VerifierError("computation name is not unique in the module",
                                computation=comp.name)
        comp_names.add(comp.name)
        for inst in comp.instructions:
            if inst.name in inst_names:
                raise VerifierError(f"instruction name is not unique in the module (also in "
                                    f"%{inst_names[inst.name]})", inst.name, comp.name)
            inst_names[inst.name] = comp.name


def _check_entry_layout(module: Module) -> None:
    """``entry_computation_layout={(p0, p1)->result}`` agrees with the entry signature."""
    value = module.config.get("entry_computation_layout")
    if value is None:
        return
    entry = module.entry
    assert entry is not None
    from .text.parser import ComputationLayout
    if isinstance(value, ComputationLayout):
        # The importer's and layout assignment's: shapes already (issue 13: printing and
        # parsing back the Adam step's 97 parameters took ~6 ms, twice per compile).
        params, result = list(value.parameters), value.result
    else:
        text = value.text if isinstance(value, Raw) else str(value)
        try:
            params, result = parse_program_shape(text)
        except HlotkError as e:
            raise VerifierError(f"cannot read entry_computation_layout {text!r}: {e}",
                                computation=entry.name) from None
    if len(params) != len(entry.parameters):
        raise VerifierError(f"entry_computation_layout has {len(params)} parameters but the "
                            f"entry takes {len(entry.parameters)}", computation=entry.name)
    for i, (want, p) in enumerate(zip(params, entry.parameters)):
        if not _same_with_layouts(want, p.shape):
            raise VerifierError(f"entry_computation_layout parameter {i} is {want} but the "
                                f"parameter is {p.shape}", p.name, entry.name)
    root = entry.root
    if root is not None and not _same_with_layouts(result, root.shape):
        raise VerifierError(f"entry_computation_layout result is {result} but the root is "
                            f"{root.shape}", root.name, entry.name)


def _same_with_layouts(a: AnyShape, b: AnyShape) -> bool:
    """Compatible, and layouts equal wherever both sides have one."""
    if not a.compatible(b):
        return False
    for (_, x), (_, y) in zip(leaf_paths(a), leaf_paths(b)):
        if x.layout is not None and y.layout is not None and x.rank > 0 \
                and x.layout.minor_to_major != y.layout.minor_to_major:
            return False
    return True


def parse_program_shape(text: str) -> tuple[list[AnyShape], AnyShape]:
    """``{(f32[2]{0}, s32[])->f32[2]{0}}`` -> ([param shapes], result shape)."""
    params, result = _parse_program_shape(text)
    return list(params), result


# The verifier reads the entry layout after every pass that changed the module, and the
# text rarely changes (layout assignment writes it once): parsed once per text. A pure
# function of the text, returning immutable shapes, so the cache needs no invalidation.
@lru_cache(maxsize=64)
def _parse_program_shape(text: str) -> tuple[tuple[AnyShape, ...], AnyShape]:
    from .text.parser import parse_shape
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    arrow = _top_level_arrow(s)
    if arrow < 0 or not s.startswith("("):
        raise ShapeError("expected '(params)->result'")
    inside = s[1:s.rindex(")", 0, arrow)]
    params = tuple(parse_shape(p) for p in _split_top_level(inside))
    return params, parse_shape(s[arrow + 2:].strip())


def _top_level_arrow(s: str) -> int:
    depth = 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith("->", i):
            return i
    return -1


def _split_top_level(s: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
    if s[start:].strip():
        parts.append(s[start:].strip())
    return parts


# --- computation level -----------------------------------------------------------------
def _check_computation(module: Module, comp: Computation, passed: _Passed) -> None:
    def err(msg: str, inst: Optional[Instruction] = None) -> VerifierError:
        return VerifierError(msg, inst.name if inst is not None else None, comp.name)

    if comp.root is None:
        raise err("computation has no root")
    members = {id(i) for i in comp.instructions}
    if id(comp.root) not in members:
        raise err(f"root %{comp.root.name} is not an instruction of this computation")

    # Parameters: dense numbers 0..n-1, each in the signature at its number.
    params_in_body = [i for i in comp.instructions if i.opcode == "parameter"]
    for n, p in enumerate(comp.parameters):
        if p is None:
            raise err(f"parameter number {n} is missing (numbers must be dense 0..n-1)")
        if p.parameter_number != n:
            raise err(f"parameter is at position {n} of the signature but has number "
                      f"{p.parameter_number}", p)
        if id(p) not in members:
            raise err("signature parameter is not an instruction of the computation", p)
    if len(params_in_body) != len(comp.parameters) or \
            {id(p) for p in params_in_body} != {id(p) for p in comp.parameters}:
        extra = [p for p in params_in_body if all(p is not q for q in comp.parameters)]
        raise err("parameter instruction is not in the computation's signature",
                  extra[0] if extra else None)

    position = {id(inst): k for k, inst in enumerate(comp.instructions)}
    edges_hold = len(position) == len(comp.instructions) and _edges_hold(comp.instructions)
    for inst in comp.instructions:
        if inst.parent is not comp:
            raise err("instruction's parent is not this computation", inst)
        if not edges_hold:
            _check_edges(comp, inst, position, err)
        op = inst.op
        if op.arity != VARIADIC and len(inst.operands) != op.arity:
            _check_arity(inst, err)
        if not inst.attrs.keys().isdisjoint(_CALLING_ATTRS):     # most call nothing
            _check_called(module, inst, err)
        passed.layouts_checked(inst, err)
        _check_shape(module, inst, err, passed)
        if op.verify is not None:
            try:
                op.verify(inst)
            except VerifierError:
                raise
            except HlotkError as e:
                raise err(str(e), inst) from None


def _edges_hold(insts: list[Instruction]) -> bool:
    """Whether every instruction of a computation (each listed once) passes ``_check_edges``,
    checked for all at once with sets (issue 13: one instruction at a time, the list scans
    of ``users`` and ``operands`` were a fifth of the verifier). The users lists name each
    user once and exactly the (user, operand) pairs of the operand lists, and operands and
    control predecessors come before their instruction: then every check of
    ``_check_edges`` holds (an operand listed here whose ``parent`` is another computation
    fails its own parent check first, as it comes earlier). False: ``_check_edges`` on each
    instruction finds the first that fails, and its message."""
    operand_edges = {(id(u), id(o)) for u in insts for o in u.operands}
    user_edges = [(id(u), id(o)) for o in insts for u in o.users]
    if len(user_edges) != len(operand_edges) or operand_edges != set(user_edges):
        return False
    earlier: set[int] = set()
    for inst in insts:
        if not earlier.issuperset(map(id, inst.operands)):
            return False
        if inst.control_predecessors and not earlier.issuperset(map(id, inst.control_predecessors)):
            return False
        earlier.add(id(inst))
    return True


def _check_edges(comp: Computation, inst: Instruction, position: dict[int, int], err) -> None:
    me = position[id(inst)]
    for k, o in enumerate(inst.operands):
        if id(o) not in position or o.parent is not comp:
            where = o.parent.name if o.parent is not None else "no computation"
            raise err(f"operand {k} %{o.name} is not in this computation (it is in {where})",
                      inst)
        if position[id(o)] >= me:
            raise err(f"operand {k} %{o.name} comes after its user in the instruction order "
                      "(not a topological order)", inst)
        # ``in`` on lists of instructions compares by identity (Instruction has no __eq__)
        if inst not in o.users:
            raise err(f"is an operand's user but is missing from %{o.name}.users", inst)
    for c in inst.control_predecessors:
        if id(c) not in position:
            raise err(f"control predecessor %{c.name} is not in this computation", inst)
        if position[id(c)] >= me:
            raise err(f"control predecessor %{c.name} comes after it in the instruction order",
                      inst)
    seen: set[int] = set()
    for u in inst.users:
        if id(u) in seen:
            raise err(f"users list names %{u.name} more than once", inst)
        seen.add(id(u))
        if inst not in u.operands:
            raise err(f"users list names %{u.name}, which does not use it", inst)
        if id(u) not in position:
            raise err(f"users list names %{u.name}, which is not in this computation", inst)


def _check_arity(inst: Instruction, err) -> None:
    want = inst.op.arity
    if want != VARIADIC and len(inst.operands) != want:
        raise err(f"{inst.opcode} takes {want} operands, has {len(inst.operands)}", inst)


def _check_called(module: Module, inst: Instruction, err) -> None:
    for c in inst.called_computations:
        if c.parent is not module or c not in module.computations:     # by identity
            raise err(f"calls computation %{c.name}, which is not in the module", inst)
        if c is inst.parent:
            raise err(f"calls its own computation %{c.name}", inst)


def _check_layouts(inst: Instruction, err) -> None:
    shape = inst.shape
    if not isinstance(shape, (Shape, TupleShape)):
        raise err(f"shape {shape!r} is not a Shape or TupleShape", inst)
    # An array shape is its own only leaf (leaf_paths' generator, without it)
    for path, leaf in leaf_paths(shape) if isinstance(shape, TupleShape) else (((), shape),):
        if leaf.is_token and leaf.dims:
            raise err(f"token shape at {path} has dimensions", inst)
        if any(d < 0 for d in leaf.dims):
            raise err(f"shape {leaf} has a negative dimension", inst)
        if leaf.layout is not None and leaf.rank > 0:
            m2m = leaf.layout.minor_to_major
            if sorted(m2m) != list(range(leaf.rank)):
                raise err(f"layout {leaf.layout} of {leaf.to_text(False)} is not a permutation "
                          f"of 0..{leaf.rank - 1}", inst)


def _check_shape(module: Module, inst: Instruction, err, passed: _Passed) -> None:
    key: Optional[tuple] = passed.key(inst)
    try:
        if key in passed.shapes:
            return
    except TypeError:               # a list or an array among the attributes: not kept
        key = None
    _check_inferred(module, inst, err)
    if key is not None:
        passed.shapes.add(key)


def _check_inferred(module: Module, inst: Instruction, err) -> None:
    shapes = [o.shape for o in inst.operands]
    try:
        inferred = si.infer(inst.opcode, shapes, inst.attrs, module)
    except si.ShapeRequired:
        try:
            si.check_result(inst.opcode, shapes, inst.attrs, inst.shape)
        except ShapeError as e:
            raise err(str(e), inst) from None
        return
    except ShapeError as e:
        raise err(str(e), inst) from None
    declared = inst.shape
    if inst.opcode in _PREFERRED_TYPE_OPS and not declared.is_tuple and not inferred.is_tuple:
        if declared.dims == inferred.dims:
            return
    if not inferred.compatible(declared):
        raise err(f"declared shape {declared.to_text(False)} does not match the inferred shape "
                  f"{inferred.to_text(False)}", inst)


# --- per-op extra checks ---------------------------------------------------------------
@rule("verify", "constant")
def _verify_constant(inst: Instruction) -> None:
    lit = inst.literal
    if lit is None:
        return  # elided literal ({...})
    shape = inst.shape
    if shape.is_tuple:
        if not isinstance(lit, tuple) or len(lit) != len(shape.elements):
            raise ShapeError(f"tuple constant needs {len(shape.elements)} literals")
        return
    arr = np.asarray(lit)
    if tuple(arr.shape) != shape.dims:
        raise ShapeError(f"literal has dimensions {list(arr.shape)} but the shape is {shape}")
    if shape.dtype.np_dtype is not None and arr.dtype != shape.dtype.np_dtype:
        raise ShapeError(f"literal has numpy type {arr.dtype} but the shape is {shape.dtype}")


@rule("verify", "parameter")
def _verify_parameter(inst: Instruction) -> None:
    if inst.parameter_number is None or inst.parameter_number < 0:
        raise ShapeError(f"parameter number {inst.parameter_number} is not a non-negative int")


@rule("verify", "map")
def _verify_map(inst: Instruction) -> None:
    comp = inst.attrs.get("to_apply")
    params = [p.shape for p in comp.parameters] if comp is not None else []
    if len(params) != len(inst.operands):
        raise ShapeError(f"map: to_apply takes {len(params)} parameters for "
                         f"{len(inst.operands)} operands")
    for i, (p, o) in enumerate(zip(params, inst.operands)):
        if not p.compatible(Shape(o.shape.dtype, ())):
            raise ShapeError(f"map: to_apply parameter {i} is {p}, expected a "
                             f"{o.shape.dtype}[] scalar")


@rule("verify", "get-tuple-element")
def _verify_gte(inst: Instruction) -> None:
    # The index range is checked by inference; here: the index is an int at all.
    if not isinstance(inst.attrs.get("index"), (int, np.integer)):
        raise ShapeError(f"get-tuple-element: index must be an integer, got "
                         f"{inst.attrs.get('index')!r}")


__all__ = ["verify", "parse_program_shape"]
