"""A tiny rewrite engine: rules are (opcode, function) rows in a table.

A rule gets an instruction and returns a replacement ``Instruction`` (already added to the
computation with ``emit``), an existing instruction to forward to, or None when it does not
apply. The engine applies the first matching rule per instruction and repeats over the
computation until nothing changes, recording which named rule fired how often.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from hlo.ir import Computation, Instruction, Module
from hlo.shape import AnyShape, Shape

RuleFn = Callable[[Instruction], Optional[Instruction]]


@dataclass(frozen=True)
class Rule:
    name: str
    opcodes: tuple[str, ...]
    fn: RuleFn


def emit(anchor: Instruction, opcode: str, operands: list[Instruction], shape: AnyShape,
         literal: Any = None, name: str | None = None, **attrs: Any) -> Instruction:
    """Create an instruction just before ``anchor`` in its computation."""
    inst = Instruction(opcode, operands, shape, attrs, literal=literal,
                       name=name or opcode.replace("-", "_"))
    md = anchor.attrs.get("metadata")
    if md is not None and "metadata" not in attrs:
        inst.attrs["metadata"] = md
    assert anchor.parent is not None
    return anchor.parent.insert_before(inst, anchor)


def constant_like(anchor: Instruction, value: Any, shape: Shape) -> Instruction:
    """A constant of ``shape`` filled with ``value``: a scalar constant broadcast if needed."""
    scalar = np.asarray(value).astype(shape.dtype.np_dtype)
    c = emit(anchor, "constant", [], Shape(shape.dtype, ()), literal=scalar, name="constant")
    if not shape.dims:
        return c
    return emit(anchor, "broadcast", [c], shape, name="broadcast", dimensions=())


def scalar_constant_value(inst: Instruction) -> Any:
    """The single value of a constant (or broadcast of one) whose elements are all equal."""
    while inst.opcode == "broadcast" or (inst.opcode == "reshape" and inst.operands[0].shape.size == 1):
        inst = inst.operands[0]
    if inst.opcode != "constant" or inst.literal is None or isinstance(inst.literal, tuple):
        return None
    arr = np.asarray(inst.literal)
    if arr.size == 0:
        return None
    flat = arr.reshape(-1)
    first = flat[0]
    if arr.size > 1 and not np.all(flat == first):
        return None
    return first


def is_value(inst: Instruction, value: float) -> bool:
    v = scalar_constant_value(inst)
    if v is None:
        return False
    try:
        return bool(v == value) and not (isinstance(v, float) and np.isnan(v))
    except (TypeError, ValueError):
        return False


def apply_rules(module: Module, table: list[Rule], stats: Counter | None = None,
                max_sweeps: int = 20) -> bool:
    by_opcode: dict[str, list[Rule]] = {}
    for r in table:
        for op in r.opcodes:
            by_opcode.setdefault(op, []).append(r)
    changed_any = False
    for comp in list(module.computations):
        for _ in range(max_sweeps):
            changed = _sweep(comp, by_opcode, stats)
            changed_any |= changed
            if not changed:
                break
    return changed_any


def _sweep(comp: Computation, by_opcode: dict[str, list[Rule]], stats: Counter | None) -> bool:
    changed = False
    for inst in list(comp.instructions):
        if inst.parent is not comp:
            continue  # removed by an earlier rewrite in this sweep
        for rule in by_opcode.get(inst.opcode, ()):
            new = rule.fn(inst)
            if new is None or new is inst:
                continue
            if not new.shape.compatible(inst.shape):
                raise AssertionError(f"rule {rule.name} changed the shape of %{inst.name}: "
                                     f"{inst.shape} -> {new.shape}")
            if isinstance(new.shape, Shape) and isinstance(inst.shape, Shape) \
                    and new.shape.layout != inst.shape.layout and inst.shape.layout is not None:
                continue  # a layout change needs a copy; leave it to layout assignment
            inst.replace_all_uses_with(new)
            if stats is not None:
                stats[rule.name] += 1
            changed = True
            break
    if changed:
        comp.remove_dead()
    return changed
