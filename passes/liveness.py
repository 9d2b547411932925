"""Liveness of every buffer over one flattened schedule of the whole module.

The entry's schedule is walked with each control-flow instruction's computations laid out
just before it (condition then body for ``while``, branches in order for ``conditional``,
the callee for ``call``), giving every instruction one time step, as XLA's sequential
heap simulation does. A buffer set is live from the first time one of its positions is
written to the last time one of its positions is read (values used by a control-flow
instruction stay live through its whole nested region, since the instruction's time comes
after it). Entry outputs stay live to the end; entry parameters from the start.
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo.ir import Computation, Instruction, Module

from .dataflow import BufferSet, Dataflow


@dataclass(frozen=True)
class Interval:
    start: int
    end: int   # inclusive

    def overlaps(self, other: "Interval") -> bool:
        return self.start <= other.end and other.start <= self.end


def _nested(inst: Instruction) -> list[Computation]:
    op = inst.opcode
    if op == "while":
        return [inst.attrs["condition"], inst.attrs["body"]]
    if op == "conditional":
        if "branch_computations" in inst.attrs:
            return list(inst.attrs["branch_computations"])
        return [inst.attrs["true_computation"], inst.attrs["false_computation"]]
    if op == "call":
        return [inst.attrs["to_apply"]]
    return []


def flatten_schedule(module: Module) -> list[Instruction]:
    """Every analysed instruction in execution order, nested regions before their owner."""
    out: list[Instruction] = []
    seen: set[int] = set()

    def walk(comp: Computation) -> None:
        for inst in comp.instructions:
            for sub in _nested(inst):
                if id(sub) not in seen:   # a computation called twice is laid out once
                    seen.add(id(sub))
                    walk(sub)
            out.append(inst)
    seen.add(id(module.entry))
    walk(module.entry)
    return out


class Liveness:
    """``interval(set)`` for every BufferSet of a Dataflow, over ``flatten_schedule``."""

    def __init__(self, module: Module, flow: Dataflow):
        self.module = module
        self.flow = flow
        self.sequence = flatten_schedule(module)
        self.time = {i.uid: t for t, i in enumerate(self.sequence)}
        end = len(self.sequence) - 1
        self.intervals: dict[int, Interval] = {}
        entry = module.entry
        outputs = {bs.id for bs in flow.sets_of(entry.root)}
        for bs in flow.sets:
            start, stop = end, 0
            for inst, _ in bs.positions:
                t = self.time.get(inst.uid)
                if t is None:
                    continue
                if inst.opcode == "parameter" and inst.parent is entry:
                    t = 0
                start = min(start, t)
                stop = max(stop, t)
                for u in inst.users:
                    tu = self.time.get(u.uid)
                    if tu is not None:
                        stop = max(stop, tu)
            if bs.id in outputs:
                stop = end
            self.intervals[bs.id] = Interval(start, max(start, stop))

    def interval(self, bs: BufferSet) -> Interval:
        return self.intervals[bs.id]

    def live_at(self, t: int) -> list[BufferSet]:
        return [bs for bs in self.flow.sets if self.intervals[bs.id].start <= t
                <= self.intervals[bs.id].end]
