"""``async-collective-creator``: every collective becomes a start/done pair (XLA's
AsyncCollectiveCreator), so a scheduler can put independent work between the two.

    all-reduce          -> all-reduce-start / all-reduce-done            (same shapes)
    all-gather          -> all-gather-start (operand, result) / all-gather-done
    collective-permute  -> collective-permute-start (operand, result, u32[], u32[]) / -done
    reduce-scatter, all-to-all, collective-broadcast
                        -> async-start ((operands), result) / async-done, calls= a computation
                           wrapping the collective (XLA's generic async wrapper)

The start takes the collective's place and the done follows it at once: this pass changes
what runs, not when (``latency-hiding-scheduler`` moves them apart). The start's operand
elements alias the operands (dataflow), so an operand stays alive until its done; the
done aliases the start's result. Collectives inside fusions, reducers and loop bodies'
kernels are left alone; loop bodies and branches are converted like the entry.
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo import dtypes as dt
from hlo.ir import Computation, Instruction, Module
from hlo.shape import Shape, TupleShape

from .base import register_pass

SUGARED = ("all-reduce", "all-gather", "collective-permute")
WRAPPED = ("reduce-scatter", "all-to-all", "collective-broadcast")
ASYNC_STARTS = ("all-reduce-start", "all-gather-start", "collective-permute-start", "async-start")
ASYNC_DONES = ("all-reduce-done", "all-gather-done", "collective-permute-done", "async-done")


def start_of(done: Instruction) -> Instruction:
    return done.operands[0]


def wrapped_opcode(start: Instruction) -> str:
    """The collective a start runs: ``all-reduce`` for all-reduce-start, the wrapped
    computation's root opcode for async-start."""
    if start.opcode == "async-start":
        return start.attrs["calls"].root.opcode
    return start.opcode[:-len("-start")]


def _operands_shape(inst: Instruction):
    shapes = tuple(o.shape for o in inst.operands)
    return shapes[0] if len(shapes) == 1 else TupleShape(shapes)


def _make_async(comp: Computation, inst: Instruction) -> tuple[Instruction, Instruction]:
    """(start, done) replacing ``inst``; ``inst`` is removed."""
    op = inst.opcode
    attrs = {k: v for k, v in inst.attrs.items() if k != "sharding"}
    module = comp.parent
    if op == "all-reduce":
        start_shape, done_shape = inst.shape, inst.shape
        start = Instruction("all-reduce-start", list(inst.operands), start_shape, attrs)
    elif op == "all-gather":
        start_shape = TupleShape((_operands_shape(inst), inst.shape))
        start = Instruction("all-gather-start", list(inst.operands), start_shape, attrs)
    elif op == "collective-permute":
        ctx = Shape(dt.U32, ())
        start_shape = TupleShape((inst.operands[0].shape, inst.shape, ctx, ctx))
        start = Instruction("collective-permute-start", list(inst.operands), start_shape, attrs)
    else:
        wrapped = Computation(module.unique_computation_name(f"wrapped_{op.replace('-', '_')}"))
        params = [wrapped.add_instruction(Instruction("parameter", [], o.shape,
                                                      parameter_number=k), f"param_{k}")
                  for k, o in enumerate(inst.operands)]
        wrapped.root = wrapped.add_instruction(Instruction(op, params, inst.shape, attrs),
                                               op.replace("-", "_"))
        module.add_computation(wrapped)
        module.computations.remove(wrapped)
        module.computations.insert(module.computations.index(comp), wrapped)
        start_shape = TupleShape((TupleShape(tuple(o.shape for o in inst.operands)), inst.shape))
        start = Instruction("async-start", list(inst.operands), start_shape, {"calls": wrapped})
    done_op = "async-done" if start.opcode == "async-start" else op + "-done"
    done_attrs = {"calls": start.attrs["calls"]} if done_op == "async-done" else {}
    if inst.sharding is not None:
        done_attrs["sharding"] = inst.sharding
    comp.insert_before(start, inst)
    done = Instruction(done_op, [start], inst.shape, done_attrs)
    comp.insert_before(done, inst)
    start.control_predecessors = list(inst.control_predecessors)
    inst.replace_all_uses_with(done)
    for other in comp.instructions:
        if inst in other.control_predecessors:
            other.control_predecessors = [done if c is inst else c
                                          for c in other.control_predecessors]
    comp.remove_instruction(inst)
    return start, done


@register_pass
@dataclass(frozen=True)
class AsyncCollectiveCreator:
    """Turn collectives into start/done pairs (see the module docstring)."""
    name = "async-collective-creator"
    convert: str = "all"        # "all", or a "+"-joined list of opcodes to convert

    def run(self, module: Module) -> bool:
        kinds = set(SUGARED + WRAPPED) if self.convert == "all" else set(self.convert.split("+"))
        changed = False
        for comp in sequential_computations(module):
            for inst in list(comp.instructions):
                if inst.opcode in kinds and not (inst.opcode == "collective-permute"
                                                 and len(inst.operands) != 1):
                    _make_async(comp, inst)
                    changed = True
        return changed


def sequential_computations(module: Module) -> list[Computation]:
    """The entry and the computations it runs instruction by instruction (loop bodies and
    conditions, branches, called computations), not those run inside one instruction
    (fusion bodies, reducers, comparators, async wrappers)."""
    out: list[Computation] = []

    def visit(comp: Computation) -> None:
        if comp in out:
            return
        out.append(comp)
        for inst in comp.instructions:
            for key in ("body", "condition", "true_computation", "false_computation"):
                if isinstance(inst.attrs.get(key), Computation):
                    visit(inst.attrs[key])
            for c in inst.attrs.get("branch_computations") or ():
                visit(c)
            if inst.opcode == "call":
                visit(inst.attrs["to_apply"])
    if module.entry is not None:
        visit(module.entry)
    return out
