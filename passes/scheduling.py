"""Instruction schedulers: post-order, DFS and a memory-minimizing list scheduler.

A schedule is the order of a computation's ``instructions`` list (printed in that order,
with ``is_scheduled=true`` in the module header). Every scheduler respects operands and
control predecessors. The ``schedule`` pass runs copy insertion, then tries each scheduler
on each computation and keeps the one with the lowest peak of live bytes, as XLA's default
memory scheduler does; a computation with asynchronous collectives (start/done pairs) gets
the latency-hiding schedule instead (``latency_hiding_scheduler.py``).

The memory model (XLA's): an instruction allocates the buffers it defines (``Dataflow``
sets it writes first) when it runs; a buffer is freed after the last instruction that
reads it. Parameters, constants and the root's buffers are live throughout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hlo.ir import Computation, Instruction, Module

from .base import register_pass
from .dataflow import BufferSet, Dataflow, insert_copies

Scheduler = Callable[[Computation, "MemoryModel"], list[Instruction]]


class MemoryModel:
    """Per instruction: the buffers it defines and the buffers it reads, with sizes."""

    def __init__(self, comp: Computation, flow: Dataflow):
        self.comp = comp
        insts = comp.instructions
        self.defines: dict[int, list[BufferSet]] = {}
        self.reads: dict[int, list[BufferSet]] = {}
        owner: dict[int, int] = {}   # set id -> uid of the first instruction defining it
        for inst in insts:
            mine = []
            for bs in flow.sets_of(inst):
                if bs.id not in owner:
                    owner[bs.id] = inst.uid
                    mine.append(bs)
            self.defines[inst.uid] = mine
        for inst in insts:
            reads: list[BufferSet] = []
            for o in inst.operands:
                for bs in flow.sets_of(o):
                    if bs not in reads:
                        reads.append(bs)
            self.reads[inst.uid] = reads
        # Buffers that never die inside this computation: the root's, the parameters'.
        self.pinned = {bs.id for bs in flow.sets_of(comp.root)} if comp.root is not None else set()
        for p in comp.parameters:
            self.pinned.update(bs.id for bs in flow.sets_of(p))

    def peak(self, order: list[Instruction]) -> int:
        """Peak of live bytes when running ``order``."""
        remaining: dict[int, int] = {}
        for inst in order:
            for bs in self.reads[inst.uid]:
                remaining[bs.id] = remaining.get(bs.id, 0) + 1
        live = peak = 0
        sizes: dict[int, int] = {}
        for inst in order:
            for bs in self.defines[inst.uid]:
                sizes[bs.id] = bs.size
                live += bs.size
            peak = max(peak, live)
            for bs in self.reads[inst.uid]:
                remaining[bs.id] -= 1
                if remaining[bs.id] == 0 and bs.id not in self.pinned and bs.id in sizes:
                    live -= sizes.pop(bs.id)
            for bs in self.defines[inst.uid]:   # defined, never read: freed at once
                if remaining.get(bs.id, 0) == 0 and bs.id not in self.pinned and bs.id in sizes:
                    live -= sizes.pop(bs.id)
        return peak


def _predecessors(inst: Instruction) -> list[Instruction]:
    return list(dict.fromkeys(inst.operands + inst.control_predecessors))


def _successors(comp: Computation) -> dict[int, list[Instruction]]:
    succ: dict[int, list[Instruction]] = {i.uid: [] for i in comp.instructions}
    for i in comp.instructions:
        for p in _predecessors(i):
            succ[p.uid].append(i)
    return succ


def post_order_schedule(comp: Computation, model: "MemoryModel | None" = None) -> list[Instruction]:
    """Operands first, depth first from each instruction in list order (XLA's PostOrder)."""
    return comp.post_order()


def dfs_schedule(comp: Computation, model: MemoryModel) -> list[Instruction]:
    """Depth first from the root; operands visited biggest subtree first (XLA's DFS).

    Finishing a large subtree before starting another lets its temporaries die early.
    """
    weight: dict[int, int] = {}
    for inst in comp.post_order():
        own = sum(bs.size for bs in model.defines[inst.uid])
        weight[inst.uid] = own + sum(weight[p.uid] for p in _predecessors(inst))
    order: list[Instruction] = []
    seen: set[int] = set()

    def visit(start: Instruction) -> None:
        stack: list[tuple[Instruction, bool]] = [(start, False)]
        while stack:
            inst, done = stack.pop()
            if done:
                order.append(inst)
                continue
            if inst.uid in seen:
                continue
            seen.add(inst.uid)
            stack.append((inst, True))
            preds = sorted(_predecessors(inst), key=lambda p: weight[p.uid])
            # Pushed smallest first, so the biggest subtree is popped (visited) first.
            stack.extend((p, False) for p in preds if p.uid not in seen)

    roots = [comp.root] if comp.root is not None else []
    for r in roots + [i for i in comp.instructions if not i.users]:
        visit(r)
    for i in comp.instructions:   # parameters nobody reads, side-effecting leftovers
        visit(i)
    return order


def list_schedule(comp: Computation, model: MemoryModel) -> list[Instruction]:
    """Greedy: among ready instructions, run the one that frees the most bytes net
    (bytes of operand buffers it is the last reader of, minus bytes it allocates)."""
    succ = _successors(comp)
    waiting = {i.uid: len(_predecessors(i)) for i in comp.instructions}
    readers_left: dict[int, int] = {}
    for inst in comp.instructions:
        for bs in model.reads[inst.uid]:
            readers_left[bs.id] = readers_left.get(bs.id, 0) + 1
    position = {i.uid: k for k, i in enumerate(comp.instructions)}
    # Each buffer's size, once: ``BufferSet.size`` walks its positions, and the priorities
    # of all ready instructions are computed at every step (the graph does not change
    # while it is scheduled).
    size = {bs.id: bs.size for sets in (model.reads, model.defines)
            for bss in sets.values() for bs in bss}
    alloc_of = {uid: sum(size[bs.id] for bs in bss) for uid, bss in model.defines.items()}

    # An instruction's priority changes only when a buffer it reads loses a reader: kept
    # until then (issue 13: every ready instruction's was recomputed at every step, and an
    # optimizer step's ~100 parameters are all ready from the start).
    readers: dict[int, list[int]] = {}
    for inst in comp.instructions:
        for bs in model.reads[inst.uid]:
            readers.setdefault(bs.id, []).append(inst.uid)
    known: dict[int, tuple[int, int]] = {}

    def priority(inst: Instruction) -> tuple[int, int]:
        p = known.get(inst.uid)
        if p is None:
            freed = sum(size[bs.id] for bs in model.reads[inst.uid]
                        if readers_left[bs.id] == 1 and bs.id not in model.pinned)
            p = known[inst.uid] = (alloc_of[inst.uid] - freed, position[inst.uid])
        return p

    ready = [i for i in comp.instructions if waiting[i.uid] == 0]
    order: list[Instruction] = []
    while ready:
        best = min(ready, key=priority)
        ready.remove(best)
        order.append(best)
        for bs in model.reads[best.uid]:
            readers_left[bs.id] -= 1
            for uid in readers[bs.id]:
                known.pop(uid, None)
        for s in succ[best.uid]:
            waiting[s.uid] -= 1
            if waiting[s.uid] == 0:
                ready.append(s)
    return order


SCHEDULERS: dict[str, Scheduler] = {
    "post-order": post_order_schedule,
    "dfs": dfs_schedule,
    "list": list_schedule,
}


def schedule_module(module: Module, algorithm: str = "default",
                    target: str = "h100") -> dict[str, tuple[str, int]]:
    """Order every non-fusion computation; returns computation -> (scheduler, peak bytes).
    A computation with asynchronous collectives gets the latency-hiding schedule (its
    overlap matters more than its peak; ``algorithm`` other than default overrides)."""
    from .latency_hiding_scheduler import has_async_collectives, latency_hiding_schedule
    flow = Dataflow(module)
    chosen: dict[str, tuple[str, int]] = {}
    n = int(module.config.get("num_partitions", 1) or 1)
    for comp in flow.computations:
        model = MemoryModel(comp, flow)
        if algorithm in ("default", "latency-hiding") and has_async_collectives(comp):
            order, _ = latency_hiding_schedule(comp, target, n)
            comp.instructions[:] = order
            chosen[comp.name] = ("latency-hiding", model.peak(order))
            continue
        names = list(SCHEDULERS) if algorithm in ("default", "latency-hiding") else [algorithm]
        best: tuple[int, int, str, list[Instruction]] | None = None
        for k, name in enumerate(names):
            order = SCHEDULERS[name](comp, model)
            assert len(order) == len(comp.instructions), name
            peak = model.peak(order)
            if best is None or peak < best[0]:
                best = (peak, k, name, order)
        assert best is not None
        comp.instructions[:] = best[3]
        chosen[comp.name] = (best[2], best[0])
    # Fusion bodies and reducers keep an operands-first order of their own.
    for comp in module.computations:
        if comp not in flow.computations:
            comp.instructions[:] = comp.post_order()
    # XLA prints is_scheduled first in the header.
    rest = {k: v for k, v in module.config.items() if k != "is_scheduled"}
    module.config.clear()
    module.config.update({"is_scheduled": True, **rest})
    return chosen


@register_pass
@dataclass(frozen=True)
class Schedule:
    """Copy insertion, then the lowest-peak schedule of post-order / DFS / list."""
    name = "schedule"
    algorithm: str = "default"
    target: str = "h100"        # the device the latency-hiding schedule's cost model is for

    def run(self, module: Module) -> bool:
        from .base import PassError
        if self.algorithm not in ("default", "latency-hiding") and \
                self.algorithm not in SCHEDULERS:
            raise PassError(f"schedule: unknown algorithm {self.algorithm!r}; known: default, "
                            "latency-hiding, " + ", ".join(SCHEDULERS))
        before = [[i.uid for i in c.instructions] for c in module.computations]
        was = module.is_scheduled
        # Buffer assignment gives each loop its own state only if no two call sites share a
        # computation: flatten first (XLA runs FlattenCallGraph before scheduling too).
        from .flatten_call_graph import FlattenCallGraph
        flattened = FlattenCallGraph().run(module)
        insert_copies(module)
        schedule_module(module, self.algorithm, self.target)
        after = [[i.uid for i in c.instructions] for c in module.computations]
        return before != after or not was or flattened
