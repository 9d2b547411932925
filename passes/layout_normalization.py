"""Layout normalization: back to default (row-major) layouts, with the data movement explicit.

After layout assignment, a ``bitcast`` moves no data only because of the layouts around it,
and a ``copy`` between layouts is a physical transpose. This pass rewrites the module so
that every value inside it has the default layout and later passes (and code generators)
can ignore layouts, as XLA's LayoutNormalization does:

- ``bitcast`` becomes what it means on logical values: transpose the operand into its memory
  order, reshape to the result's memory-order dims, transpose back to the result's logical
  order (each step left out when it is the identity);
- a ``copy`` that only changed the layout disappears (logically it is the identity);
- every shape gets the default layout.

The entry signature is the caller's contract, so it keeps its layouts: an entry parameter
with another layout is copied to the default one once, and the entry result is copied into
the layout ``entry_computation_layout`` asks for.
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo import layout_util as lu
from hlo.ir import Computation, Instruction, Module
from hlo.shape import AnyShape, Shape, TupleShape

from .base import ModuleSnapshot, register_pass
from .layout_assignment import _entry_signature, _same_layouts


@register_pass
@dataclass(frozen=True)
class LayoutNormalization:
    """Rewrite to default layouts everywhere inside the module (see the module docstring)."""
    name = "layout-normalization"

    def run(self, module: Module) -> bool:
        assert module.entry is not None
        before = ModuleSnapshot(module)
        params, result = _entry_signature(module)
        # Bitcasts first: their meaning depends on the layouts of their operands, which
        # removing a layout-changing copy would change.
        # ``assigned`` keeps the layout each value had: a bitcast of a bitcast must read its
        # operand with the layout it had before the expansion of the first one.
        assigned: dict[int, Shape] = {}
        for comp in module.computations:
            for inst in list(comp.instructions):
                if inst.opcode == "bitcast":
                    _expand_bitcast(comp, inst, assigned)
        for comp in module.computations:
            for inst in list(comp.instructions):
                if inst.opcode == "copy" and not inst.shape.is_tuple and \
                        not _same_layouts(inst.shape, inst.operands[0].shape):
                    inst.replace_all_uses_with(inst.operands[0])
                    if not inst.users and inst is not comp.root:
                        comp.remove_instruction(inst)
        for comp in module.computations:
            for inst in comp.instructions:
                inst.shape = lu.with_default_layouts(inst.shape)
        entry = module.entry
        for p, want in zip(entry.parameters, params):
            p.shape = want
            users = list(p.users)
            fixed = _convert(entry, p, lu.with_default_layouts(want))
            if fixed is not p:
                for u in users:
                    u.replace_operand_with(p, fixed)
                if entry.root is p:
                    entry.root = fixed
        assert entry.root is not None
        entry.root = _convert(entry, entry.root, result)
        return before.changed(module)


def _expand_bitcast(comp: Computation, inst: Instruction, assigned: dict[int, Shape]) -> None:
    """bitcast(x) == transpose back(reshape(transpose x into memory order))."""
    src: Shape = assigned.get(id(inst.operands[0]), inst.operands[0].shape)
    dst: Shape = inst.shape
    value = inst.operands[0]
    pieces: list[Instruction] = []

    def add(opcode: str, operand: Instruction, dims: tuple[int, ...], attrs: dict) -> Instruction:
        new = Instruction(opcode, [operand], Shape(dst.dtype, dims, lu.default_layout(len(dims))),
                          attrs, name=opcode)
        comp.insert_before(new, inst)
        pieces.append(new)
        return new

    to_memory = lu.major_to_minor(src.layout, src.rank)
    if to_memory != tuple(range(src.rank)):
        value = add("transpose", value, lu.physical_dims(src), {"dimensions": to_memory})
    dst_memory = lu.physical_dims(dst)
    if tuple(value.shape.dims) != dst_memory:
        value = add("reshape", value, dst_memory, {})
    from_memory = lu.major_to_minor(dst.layout, dst.rank)
    if from_memory != tuple(range(dst.rank)):
        back = tuple(int(i) for i in sorted(range(dst.rank), key=lambda d: from_memory[d]))
        value = add("transpose", value, dst.dims, {"dimensions": back})
    # (When nothing was added, the bitcast only renamed the layout: its operand is its value.)
    if value is not inst.operands[0]:
        assigned[id(value)] = dst
    inst.replace_all_uses_with(value)
    comp.remove_instruction(inst)


def _convert(comp: Computation, value: Instruction, shape: AnyShape) -> Instruction:
    """``value`` in the layouts of ``shape``: copies (through tuples) where they differ,
    placed right after ``value`` so they come before any of its users."""
    if _same_layouts(value.shape, shape):
        return value
    last = [value]

    def place(new: Instruction) -> Instruction:
        k = comp.instructions.index(last[0]) + 1
        if k < len(comp.instructions):
            comp.insert_before(new, comp.instructions[k])
        else:
            comp.add_instruction(new)
        last[0] = new
        return new

    def go(v: Instruction, s: AnyShape) -> Instruction:
        if _same_layouts(v.shape, s):
            return v
        if not s.is_tuple:
            return place(Instruction("copy", [v], s, name=v.name + ".copy"))
        parts = [go(place(Instruction("get-tuple-element", [v], v.shape.elements[i],
                                      {"index": i})), e)
                 for i, e in enumerate(s.elements)]
        return place(Instruction("tuple", parts, TupleShape(tuple(p.shape for p in parts))))
    return go(value, shape)


__all__ = ["LayoutNormalization"]
