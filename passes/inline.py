"""Call inlining: replace every ``call`` with a copy of the called computation's body."""
from __future__ import annotations

from dataclasses import dataclass

from hlo.ir import Computation, Instruction, Module

from .base import register_pass


def clone_into(callee: Computation, anchor: Instruction, args: list[Instruction]) -> Instruction:
    """Copy ``callee``'s instructions before ``anchor``, parameters bound to ``args``.

    Returns the copy of the callee's root.
    """
    comp = anchor.parent
    assert comp is not None and callee.root is not None
    mapping: dict[int, Instruction] = {id(p): a for p, a in zip(callee.parameters, args)}
    for inst in callee.post_order():
        if inst.opcode == "parameter":
            continue
        new = Instruction(inst.opcode, [mapping[id(o)] for o in inst.operands], inst.shape,
                          dict(inst.attrs), name=inst.name, literal=inst.literal)
        new.control_predecessors = [mapping[id(c)] for c in inst.control_predecessors
                                    if id(c) in mapping]
        comp.insert_before(new, anchor)
        mapping[id(inst)] = new
    return mapping[id(callee.root)]


@register_pass
@dataclass(frozen=True)
class Inline:
    """Inline every ``call`` (to a fixed point, so nested calls disappear too)."""
    name = "inline"

    def run(self, module: Module) -> bool:
        changed = False
        while True:
            calls = [i for c in module.computations for i in c.instructions if i.opcode == "call"]
            if not calls:
                break
            for call in calls:
                root = clone_into(call.attrs["to_apply"], call, list(call.operands))
                comp = call.parent
                call.replace_all_uses_with(root)
                comp.remove_instruction(call)
                changed = True
        if changed:
            module.remove_unreachable_computations()
        return changed
