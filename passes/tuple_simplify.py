"""Tuple / get-tuple-element simplification.

- ``get-tuple-element(tuple(a, b, ...), index=i)`` -> the i-th operand;
- ``tuple(gte(x, 0), ..., gte(x, n-1))`` covering all of x in order -> ``x``.
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo.ir import Instruction, Module

from .base import register_pass
from .rewrite import Rule, apply_rules


def gte_of_tuple(i: Instruction):
    t = i.operands[0]
    if t.opcode == "tuple":
        return t.operands[i.attrs["index"]]


def tuple_of_gtes(i: Instruction):
    if not i.operands:
        return None
    src = i.operands[0].operands[0] if i.operands[0].opcode == "get-tuple-element" else None
    if src is None or not src.shape.is_tuple or len(src.shape.elements) != len(i.operands):
        return None
    for k, o in enumerate(i.operands):
        if o.opcode != "get-tuple-element" or o.operands[0] is not src or o.attrs["index"] != k:
            return None
    return src if src.shape.compatible(i.shape) else None


TUPLE_RULES = [Rule("gte-of-tuple", ("get-tuple-element",), gte_of_tuple),
               Rule("tuple-of-gtes", ("tuple",), tuple_of_gtes)]


@register_pass
@dataclass(frozen=True)
class TupleSimplify:
    name = "tuple-simplify"

    def run(self, module: Module) -> bool:
        return apply_rules(module, TUPLE_RULES)
