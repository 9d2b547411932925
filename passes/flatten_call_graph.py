"""Give every control-flow call site its own computation (XLA's FlattenCallGraph).

A while body, condition, conditional branch or ``call`` target reached from two places is
cloned, so that buffer assignment can give each loop its own state buffers: two loops
sharing one body computation would otherwise share one state buffer, and the second loop
would overwrite the first one's results while they are still live. Reducers, comparators
and fusion bodies are evaluated per instruction and may stay shared.
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo.ir import Computation, Instruction, Module

from .base import register_pass

CONTROL_FLOW_ATTRS = ("condition", "body", "true_computation", "false_computation")


def _control_callees(inst: Instruction) -> list[tuple[str, int | None, Computation]]:
    out: list[tuple[str, int | None, Computation]] = []
    for key in CONTROL_FLOW_ATTRS:
        c = inst.attrs.get(key)
        if isinstance(c, Computation):
            out.append((key, None, c))
    for k, c in enumerate(inst.attrs.get("branch_computations") or ()):
        out.append(("branch_computations", k, c))
    if inst.opcode == "call" and isinstance(inst.attrs.get("to_apply"), Computation):
        out.append(("to_apply", None, inst.attrs["to_apply"]))
    return out


@register_pass
@dataclass(frozen=True)
class FlattenCallGraph:
    name = "flatten-call-graph"

    def run(self, module: Module) -> bool:
        if module.entry is None:
            return False
        seen: set[int] = set()
        changed = False
        stack = [module.entry]
        while stack:
            comp = stack.pop()
            for inst in comp.instructions:
                for key, k, callee in _control_callees(inst):
                    if id(callee) in seen:
                        callee = module.clone_computation(callee)
                        if k is None:
                            inst.attrs[key] = callee
                        else:
                            branches = list(inst.attrs[key])
                            branches[k] = callee
                            inst.attrs[key] = tuple(branches)
                        changed = True
                    seen.add(id(callee))
                    stack.append(callee)
        return changed
