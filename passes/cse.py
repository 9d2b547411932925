"""Common subexpression elimination: one instruction per (opcode, operands, attributes).

Two instructions are the same when they have the same opcode, the same operand
instructions, the same shape (layouts included) and equal attributes; constants when their
literals are equal bit for bit. Side-effecting ops, parameters and rng never merge.
Metadata is not part of the key (XLA's CSE ignores it too), so the survivor keeps its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hlo.attrs import format_value
from hlo.ir import Instruction, Module

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


def instruction_key(inst: Instruction) -> tuple:
    attrs = tuple((k, format_value(v)) for k, v in inst.attrs.items() if k not in _IGNORED_ATTRS)
    return (inst.opcode, tuple(id(o) for o in inst.operands), str(inst.shape), attrs,
            _literal_key(inst.literal) if inst.opcode == "constant" else None)


@register_pass
@dataclass(frozen=True)
class CSE:
    name = "cse"
    only_constants: bool = False

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations:
            seen: dict[tuple, Instruction] = {}
            for inst in list(comp.instructions):
                if inst.opcode in _NEVER_MERGE or inst.is_side_effecting or inst.control_predecessors:
                    continue
                if self.only_constants and inst.opcode != "constant":
                    continue
                key = instruction_key(inst)
                first = seen.get(key)
                if first is None:
                    seen[key] = inst
                    continue
                inst.replace_all_uses_with(first)
                if not inst.users and inst is not comp.root:
                    comp.remove_instruction(inst)
                changed = True
        return changed
