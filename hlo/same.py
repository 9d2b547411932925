"""``prints_same(a, b)``: whether two modules print the same HLO text, without printing them.

The on-disk module cache (runtime/compile_cache.py) stores a pickled module only when the
unpickled copy is the module it pickled: that nothing pickling loses shows in the text.
Printing both and comparing the texts answers that, at ~7 ms per print of the Adam step's
637 instructions, twice per stored entry (issue 13: four of a cold compile's five prints).
This compares what the printer prints, field by field, in the printer's order: the
module's name, header attributes, sections and computations (entry last); each
computation's name, extra signature text, parameters and root; each instruction's name,
shape (layout included), opcode, operands and control predecessors (by name), parameter
number, literal (bit for bit) and attributes (keys in order, values of the same type and
equal, called computations by name).

It is conservative: True means the printer, a function of those fields, gives both the
same text; False may also come for two modules that print the same (a NaN attribute, an
attribute object without ``==``), and the caller then only skips the cache.

``structure_key(comp)``: a hashable value that is equal for two computations printing the
same text up to their instructions' names and metadata (the Triton backend generates one
kernel per distinct fused computation with it, issue 13).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from .ir import Computation, Instruction, Module


def prints_same(a: Module, b: Module) -> bool:
    """True only if ``a`` and ``b`` print the same text (see the module doc)."""
    try:
        return _modules(a, b)
    except Exception:  # noqa: BLE001  (an attribute whose == raises: not provably the same)
        return False


def _order(m: Module) -> list[Computation]:
    comps = [c for c in m.computations if c is not m.entry]
    if m.entry is not None:
        comps.append(m.entry)
    return comps


def _modules(a: Module, b: Module) -> bool:
    if a.name != b.name or (a.entry is None) != (b.entry is None):
        return False
    if not _values(a.config, b.config) or a.sections != b.sections:
        return False
    ca, cb = _order(a), _order(b)
    if len(ca) != len(cb):
        return False
    return all(_computations(x, y, a, b) for x, y in zip(ca, cb))


def _computations(x: Computation, y: Computation, ma: Module, mb: Module) -> bool:
    if x.name != y.name or x.extra_attrs != y.extra_attrs or \
            (ma.entry is x) != (mb.entry is y) or \
            len(x.instructions) != len(y.instructions) or \
            len(x.parameters) != len(y.parameters):
        return False
    if [_name(p) for p in x.parameters] != [_name(p) for p in y.parameters]:
        return False
    if (x.root is None) != (y.root is None):
        return False
    if x.root is not None and x.root.name != y.root.name:       # type: ignore[union-attr]
        return False
    for i, j in zip(x.instructions, y.instructions):
        if not _instructions(i, j):
            return False
        if (i is x.root) != (j is y.root):
            return False
    return True


def _name(p: Any) -> Any:
    return None if p is None else p.name


def _instructions(i: Instruction, j: Instruction) -> bool:
    if i.name != j.name or i.opcode != j.opcode or i.parameter_number != j.parameter_number:
        return False
    if type(i.shape) is not type(j.shape) or i.shape != j.shape:
        return False
    if len(i.operands) != len(j.operands) or \
            any(o.name != p.name for o, p in zip(i.operands, j.operands)):
        return False
    if [c.name for c in i.control_predecessors] != [c.name for c in j.control_predecessors]:
        return False
    return _values(i.literal, j.literal) and _values(i.attrs, j.attrs)


def _values(u: Any, v: Any) -> bool:
    """Equal values of the same type; computations and instructions by name, arrays bit
    for bit, containers element by element in order."""
    if type(u) is not type(v):
        return False
    if isinstance(u, (Computation, Instruction)):
        return u.name == v.name
    if isinstance(u, dict):
        return list(u) == list(v) and all(_values(u[k], v[k]) for k in u)
    if isinstance(u, (list, tuple)):
        return len(u) == len(v) and all(_values(x, y) for x, y in zip(u, v))
    if isinstance(u, (np.ndarray, np.generic)):
        return u.dtype == v.dtype and u.shape == v.shape and u.tobytes() == v.tobytes()
    same = u == v
    return same if isinstance(same, bool) else False


# --- structure up to instruction names -----------------------------------------------------
def structure_key(comp: Computation, skip: frozenset[str] = frozenset({"metadata"}),
                  _seen: Optional[dict[int, tuple]] = None) -> tuple:
    """A hashable value equal for two computations that print the same text up to their
    instructions' names and the attributes named in ``skip``: per instruction, in order,
    its opcode, shape (layout included), operands and control predecessors by position,
    parameter number, literal (bit for bit) and attributes in order (called computations by
    name and by their own key, instructions of ``comp`` by position); the root's position
    and the extra signature text. Equal keys mean one computation is the other with its
    instructions renamed (and the skipped attributes changed); unequal keys may still come
    for two such (a NaN attribute, an attribute object compared by identity). Raises
    TypeError for an attribute value that cannot be made hashable."""
    seen = {} if _seen is None else _seen
    known = seen.get(id(comp))
    if known is not None:
        return known
    position = {id(i): k for k, i in enumerate(comp.instructions)}

    def ref(i: Instruction) -> Any:
        k = position.get(id(i))
        return k if k is not None else ("outside", i.name)

    rows = []
    for inst in comp.instructions:
        attrs = attrs_key(inst.attrs, skip, ref, seen)
        rows.append((inst.opcode, type(inst.shape), inst.shape,
                     tuple(ref(o) for o in inst.operands),
                     tuple(ref(c) for c in inst.control_predecessors),
                     inst.parameter_number, _frozen(inst.literal, ref, skip, seen), attrs))
    root = comp.root
    key = (tuple(rows), None if root is None else ref(root), comp.extra_attrs)
    seen[id(comp)] = key
    return key


def attrs_key(attrs: dict[str, Any], skip: frozenset[str] = frozenset({"metadata"}),
              ref: Any = None, _seen: Optional[dict[int, tuple]] = None) -> tuple:
    """``attrs`` (an instruction's) but those in ``skip`` as a hashable value, in order, as
    ``structure_key`` compares them; instructions by ``ref(inst)`` (default: by name)."""
    ref = ref if ref is not None else (lambda i: ("outside", i.name))
    seen = {} if _seen is None else _seen
    return tuple((k, _frozen(v, ref, skip, seen)) for k, v in attrs.items() if k not in skip)


def _frozen(v: Any, ref: Any, skip: frozenset[str], seen: dict[int, tuple]) -> Any:
    """``v`` as a hashable value that is equal exactly where ``_values`` says equal (same
    type; arrays bit for bit; containers in order), instructions by ``ref``."""
    if isinstance(v, float):
        return (type(v), v.hex())         # -0.0 == 0.0, but they print differently
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return (type(v), v)
    if isinstance(v, Instruction):
        return (Instruction, ref(v))
    if isinstance(v, Computation):
        return (Computation, v.name, structure_key(v, skip, seen))
    if isinstance(v, (np.ndarray, np.generic)):
        a = np.asarray(v)
        return (type(v), a.dtype.str, a.shape, a.tobytes())
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_frozen(x, ref, skip, seen) for x in v))
    if isinstance(v, dict):
        return (type(v), tuple((k, _frozen(x, ref, skip, seen)) for k, x in v.items()))
    try:
        hash(v)
        return (type(v), v)
    except TypeError:
        if dataclasses.is_dataclass(v):
            return (type(v), tuple(_frozen(getattr(v, f.name), ref, skip, seen)
                                   for f in dataclasses.fields(v)))
        raise
