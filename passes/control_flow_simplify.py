"""While and conditional simplification.

- ``conditional`` whose predicate/index is a constant becomes a ``call`` of the branch
  taken (an out-of-range index takes the last branch, as XLA defines);
- ``while`` whose condition is a constant false is its initial value (a zero-trip loop);
- loop state that nothing reads is dropped: element i of a tuple-shaped ``while`` is
  removed when the condition does not read it, the body only passes it through or reads it
  to compute element i itself, and no user of the loop reads it.
"""
from __future__ import annotations

from dataclasses import dataclass


from hlo.ir import Computation, Instruction, Module
from hlo.shape import TupleShape

from .base import register_pass
from .rewrite import emit, scalar_constant_value


def _constant_branch(cond: Instruction) -> Computation | None:
    v = scalar_constant_value(cond.operands[0])
    if v is None:
        return None
    if "branch_computations" in cond.attrs:
        branches = cond.attrs["branch_computations"]
        k = int(v)
        return branches[k] if 0 <= k < len(branches) else branches[-1]
    return cond.attrs["true_computation"] if bool(v) else cond.attrs["false_computation"]


def _simplify_conditional(cond: Instruction) -> bool:
    branch = _constant_branch(cond)
    if branch is None:
        return False
    if "branch_computations" in cond.attrs:
        arg = cond.operands[1 + list(cond.attrs["branch_computations"]).index(branch)] \
            if list(cond.attrs["branch_computations"]).count(branch) == 1 else None
        if arg is None:
            k = int(scalar_constant_value(cond.operands[0]))
            n = len(cond.attrs["branch_computations"])
            arg = cond.operands[1 + (k if 0 <= k < n else n - 1)]
    else:
        arg = cond.operands[1] if branch is cond.attrs["true_computation"] else cond.operands[2]
    call = emit(cond, "call", [arg], cond.shape, name="call", to_apply=branch)
    cond.parent.replace_instruction(cond, call)
    return True


def _condition_is_false(loop: Instruction) -> bool:
    root = loop.attrs["condition"].root
    v = scalar_constant_value(root) if root is not None else None
    return v is not None and not bool(v)


def _gtes(param: Instruction) -> dict[int, list[Instruction]]:
    out: dict[int, list[Instruction]] = {}
    for u in param.users:
        if u.opcode != "get-tuple-element":
            return {-1: [u]}  # the whole tuple escapes: nothing is removable
        out.setdefault(u.attrs["index"], []).append(u)
    return out


def _state_reads(value: Instruction, param: Instruction) -> set[int]:
    """The loop-state indices ``value`` reads (through get-tuple-element of ``param``)."""
    reads: set[int] = set()
    stack, seen = [value], set()
    while stack:
        i = stack.pop()
        if id(i) in seen:
            continue
        seen.add(id(i))
        if i.opcode == "get-tuple-element" and i.operands[0] is param:
            reads.add(i.attrs["index"])
            continue
        if i is param:
            reads.update(range(len(param.shape.elements)))
            continue
        stack.extend(i.operands)
    return reads


def _remove_unused_state(loop: Instruction) -> bool:
    if not isinstance(loop.shape, TupleShape) or loop.operands[0].opcode != "tuple":
        return False
    cond_c: Computation = loop.attrs["condition"]
    body_c: Computation = loop.attrs["body"]
    body_root = body_c.root
    if body_root is None or body_root.opcode != "tuple":
        return False
    if len({id(c) for c in (cond_c, body_c)}) != 2 or _shared(cond_c, body_c, loop):
        return False
    if any(i.is_side_effecting for i in body_c.instructions + cond_c.instructions):
        return False  # a side effect may read any state; keep it all
    n = len(loop.shape.elements)
    cond_reads = _gtes(cond_c.parameters[0])
    body_reads = _gtes(body_c.parameters[0])
    if -1 in cond_reads or -1 in body_reads:
        return False
    outside = set()
    for u in loop.users:
        if u.opcode != "get-tuple-element":
            return False
        outside.add(u.attrs["index"])
    # An index is live if read by the condition, outside, or by the body to compute a live index.
    live = set(cond_reads) | outside
    deps = {k: _state_reads(body_root.operands[k], body_c.parameters[0]) for k in range(n)}
    frontier = list(live)
    while frontier:
        k = frontier.pop()
        for d in deps[k]:
            if d not in live:
                live.add(d)
                frontier.append(d)
    dead = [k for k in range(n) if k not in live]
    if not dead:
        return False
    keep = [k for k in range(n) if k in live]
    remap = {old: new for new, old in enumerate(keep)}
    new_shape = TupleShape(tuple(loop.shape.elements[k] for k in keep))
    for comp in (cond_c, body_c):
        param = comp.parameters[0]
        for u in list(param.users):
            if u.attrs["index"] in remap:
                u.attrs["index"] = remap[u.attrs["index"]]
        param.shape = new_shape
    # Body root: a tuple of the kept elements only.
    new_root = Instruction("tuple", [body_root.operands[k] for k in keep], new_shape, name="tuple")
    body_c.add_instruction(new_root)
    body_c.root = new_root
    body_c.remove_dead()
    # Unused reads left in the body (e.g. of dead indices) are gone after remove_dead.
    init = loop.operands[0]
    new_init = emit(loop, "tuple", [init.operands[k] for k in keep], new_shape, name="tuple")
    for u in list(loop.users):
        u.attrs["index"] = remap[u.attrs["index"]]
    loop.replace_operand(0, new_init)
    loop.shape = new_shape
    return True


def _shared(cond_c: Computation, body_c: Computation, loop: Instruction) -> bool:
    """True if the condition or body is also called by another instruction."""
    module = loop.parent.parent if loop.parent else None
    if module is None:
        return True
    for inst in module.all_instructions():
        if inst is loop:
            continue
        called = inst.called_computations
        if cond_c in called or body_c in called:
            return True
    return False


@register_pass
@dataclass(frozen=True)
class ControlFlowSimplify:
    name = "control-flow-simplify"

    def run(self, module: Module) -> bool:
        changed = False
        for comp in list(module.computations):
            for inst in list(comp.instructions):
                if inst.parent is not comp:
                    continue
                if inst.opcode == "conditional":
                    changed |= _simplify_conditional(inst)
                elif inst.opcode == "while":
                    if _condition_is_false(inst):
                        inst.replace_all_uses_with(inst.operands[0])
                        comp.remove_instruction(inst)
                        changed = True
                    else:
                        changed |= _remove_unused_state(inst)
        if changed:
            module.remove_unreachable_computations()
        return changed
