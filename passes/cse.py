"""Common subexpression elimination: one instruction per (opcode, operands, attributes).

Two instructions are the same when they have the same opcode, the same operand
instructions, the same shape (layouts included) and equal attributes (called computations
equal in structure, whatever their names); constants when their literals are equal bit for
bit. Side-effecting ops, parameters and rng never merge.
Metadata is not part of the key (XLA's CSE ignores it too), so the survivor keeps its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hlo.attrs import format_value
from hlo.ir import Computation, Instruction, Module

from .base import register_pass

_NEVER_MERGE = {"parameter", "rng", "rng-bit-generator", "rng-get-and-update-state",
                "custom-call", "infeed", "recv", "send", "outfeed", "after-all",
                "optimization-barrier"}
_IGNORED_ATTRS = {"metadata", "frontend_attributes", "statistics"}


def _literal_key(lit: Any) -> Any:
    if lit is None:
        return None
    if isinstance(lit, tuple):
        return tuple(_literal_key(x) for x in lit)
    arr = np.ascontiguousarray(lit)
    return (str(arr.dtype), arr.shape, arr.tobytes())


def _attr_key(value: Any, seen: dict) -> Any:
    """Called computations compare by structure (two reduces whose ``to_apply`` bodies are
    equal copies under other names are the same reduce, as in XLA's CSE); the rest by text.
    ``seen`` caches computation keys by id for one pass run."""
    if isinstance(value, Computation):
        return computation_key(value, seen)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, Computation) for v in value):
        return tuple(computation_key(v, seen) for v in value)
    return format_value(value)


def computation_key(comp: Computation, seen: dict | None = None) -> tuple:
    """The structure of ``comp``: every instruction's opcode, shape, attributes and literal
    with operands as positions, names left out."""
    seen = {} if seen is None else seen
    hit = seen.get(id(comp))
    if hit is not None:
        return hit
    pos = {id(i): n for n, i in enumerate(comp.instructions)}
    key = tuple(
        (i.opcode, tuple(pos.get(id(o), -1) for o in i.operands), str(i.shape),
         tuple((k, _attr_key(v, seen)) for k, v in i.attrs.items() if k not in _IGNORED_ATTRS),
         _literal_key(i.literal) if i.opcode == "constant" else None,
         i.parameter_number if i.opcode == "parameter" else None, i is comp.root)
        for i in comp.instructions)
    seen[id(comp)] = key
    return key


def instruction_key(inst: Instruction, seen: dict | None = None) -> tuple:
    seen = {} if seen is None else seen
    attrs = tuple((k, _attr_key(v, seen)) for k, v in inst.attrs.items()
                  if k not in _IGNORED_ATTRS)
    return (inst.opcode, tuple(id(o) for o in inst.operands), str(inst.shape), attrs,
            _literal_key(inst.literal) if inst.opcode == "constant" else None)


@register_pass
@dataclass(frozen=True)
class CSE:
    name = "cse"
    only_constants: bool = False

    def run(self, module: Module) -> bool:
        changed = False
        # Keys of called computations, once per run: an edit CSE makes later inside one keeps
        # its meaning, so a merge decided on the earlier key stays right.
        called: dict = {}
        for comp in module.computations:
            seen: dict[tuple, Instruction] = {}
            for inst in list(comp.instructions):
                if inst.opcode in _NEVER_MERGE or inst.is_side_effecting or inst.control_predecessors:
                    continue
                if self.only_constants and inst.opcode != "constant":
                    continue
                key = instruction_key(inst, called)
                first = seen.get(key)
                if first is None:
                    seen[key] = inst
                    continue
                inst.replace_all_uses_with(first)
                if not inst.users and inst is not comp.root:
                    comp.remove_instruction(inst)
                changed = True
        return changed
