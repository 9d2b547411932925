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


def instruction_key(inst: Instruction, seen: dict | None = None,
                    texts: dict | None = None) -> tuple:
    """``seen``: computation keys by id; ``texts``: shape texts by shape, for one pass run
    (a shape's text is a function of its value, and most of a program's instructions share
    a few shapes: printing each was a third of the pass on the Adam step, issue 13)."""
    seen = {} if seen is None else seen
    # Most instructions carry metadata only: no generator for them.
    attrs = () if inst.attrs.keys() <= _IGNORED_ATTRS else \
        tuple((k, _attr_key(v, seen)) for k, v in inst.attrs.items() if k not in _IGNORED_ATTRS)
    shape = inst.shape
    if texts is None:
        text = str(shape)
    else:
        text = texts.get(shape)
        if text is None:
            text = texts[shape] = str(shape)
    return (inst.opcode, tuple(map(id, inst.operands)), text, attrs,
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
        texts: dict = {}
        for comp in module.computations:
            seen: dict[tuple, Instruction] = {}
            # Without control edges in the computation, the merged instructions are removed
            # in one walk at the end (``remove_instructions``; issue 13: one
            # ``remove_instruction`` each, a scan of the list, was half of the pass on the
            # Adam step). The same result: a removed instruction has no users left, and in
            # operands-first order it uses only instructions looked at before it, so whether
            # it is still listed as their user meanwhile changes no later key or merge. With
            # control edges, each removal at once: removing a control predecessor can make
            # a later instruction mergeable.
            batch = not any(i.control_predecessors for i in comp.instructions)
            dead: list[Instruction] = []
            for inst in list(comp.instructions):
                if inst.opcode in _NEVER_MERGE or inst.is_side_effecting or inst.control_predecessors:
                    continue
                if self.only_constants and inst.opcode != "constant":
                    continue
                key = instruction_key(inst, called, texts)
                first = seen.get(key)
                if first is None:
                    seen[key] = inst
                    continue
                inst.replace_all_uses_with(first)
                if not inst.users and inst is not comp.root:
                    if batch:
                        dead.append(inst)
                    else:
                        comp.remove_instruction(inst)
                changed = True
            if dead:
                comp.remove_instructions(dead)
        return changed
