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

import heapq
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
        # Each instruction's sets once (an operand's are asked for by each of its users).
        sets = {inst.uid: flow.sets_of(inst) for inst in insts}
        owner: dict[int, int] = {}   # set id -> uid of the first instruction defining it
        for inst in insts:
            mine = []
            for bs in sets[inst.uid]:
                if bs.id not in owner:
                    owner[bs.id] = inst.uid
                    mine.append(bs)
            self.defines[inst.uid] = mine
        for inst in insts:
            reads: list[BufferSet] = []
            seen: set[int] = set()  # set ids (a list's ``in``: quadratic in a tuple's operands)
            for o in inst.operands:
                for bs in sets.get(o.uid) or flow.sets_of(o):
                    if bs.id not in seen:
                        seen.add(bs.id)
                        reads.append(bs)
            self.reads[inst.uid] = reads
        # Buffers that never die inside this computation: the root's, the parameters'.
        self.pinned = {bs.id for bs in flow.sets_of(comp.root)} if comp.root is not None else set()
        for p in comp.parameters:
            self.pinned.update(bs.id for bs in flow.sets_of(p))
        # Each set's bytes once: ``BufferSet.size`` walks the set's positions, and the three
        # schedulers and their three peaks asked for it per instruction (issue 13).
        self.size: dict[int, int] = {}
        for bss in self.defines.values():     # each set once (a set may have many readers)
            for bs in bss:
                self.size[bs.id] = bs.size
        for bss in self.reads.values():
            for bs in bss:
                if bs.id not in self.size:
                    self.size[bs.id] = bs.size
        self.alloc: dict[int, int] = {uid: sum(self.size[bs.id] for bs in bss)
                                      for uid, bss in self.defines.items()}
        # For ``peak``: per instruction, (id, bytes) of the sets it defines and the ids of the
        # sets it reads, pinned ones left out (they are never freed, so their reader counts
        # do not matter).
        self._defined = {uid: [(bs.id, self.size[bs.id]) for bs in bss if bs.id not in self.pinned]
                         for uid, bss in self.defines.items()}
        self._pinned_bytes = {uid: sum(self.size[bs.id] for bs in bss if bs.id in self.pinned)
                              for uid, bss in self.defines.items()}
        self._freeable_reads = {uid: [bs.id for bs in bss if bs.id not in self.pinned]
                                for uid, bss in self.reads.items()}

    def peak(self, order: list[Instruction]) -> int:
        """Peak of live bytes when running ``order``."""
        reads, defined, pinned_bytes = self._freeable_reads, self._defined, self._pinned_bytes
        remaining: dict[int, int] = {}
        for inst in order:
            for i in reads[inst.uid]:
                remaining[i] = remaining.get(i, 0) + 1
        live = peak = 0
        sizes: dict[int, int] = {}
        for inst in order:
            uid = inst.uid
            mine = defined[uid]
            live += pinned_bytes[uid]            # allocated, never freed
            for i, size in mine:
                sizes[i] = size
                live += size
            if live > peak:
                peak = live
            for i in reads[uid]:
                left = remaining[i] - 1
                remaining[i] = left
                if left == 0 and i in sizes:
                    live -= sizes.pop(i)
            for i, _ in mine:                    # defined, never read: freed at once
                if i in sizes and not remaining.get(i, 0):
                    live -= sizes.pop(i)
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
        weight[inst.uid] = model.alloc[inst.uid] + sum(weight[p.uid] for p in _predecessors(inst))
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
    readers: dict[int, list[Instruction]] = {}
    for inst in comp.instructions:
        for bs in model.reads[inst.uid]:
            readers_left[bs.id] = readers_left.get(bs.id, 0) + 1
            readers.setdefault(bs.id, []).append(inst)
    position = {i.uid: k for k, i in enumerate(comp.instructions)}
    size, pinned = model.size, model.pinned

    def priority(inst: Instruction) -> tuple[int, int]:
        freed = sum(size[bs.id] for bs in model.reads[inst.uid]
                    if readers_left[bs.id] == 1 and bs.id not in pinned)
        return (model.alloc[inst.uid] - freed, position[inst.uid])

    # The ready instructions in a heap of (priority, position, instruction), the lowest
    # first, as ``min`` over the ready list picked it (positions are unique: no ties).
    # An instruction's priority changes only when a buffer it reads is left with one
    # reader (``freed`` counts buffers whose reader it is last): then its entry is pushed
    # again and the old one, no longer ``current``, is skipped when popped (issue 13: an
    # optimizer step's ~100 parameters are all ready from the start; ``min`` over them at
    # every step was most of the pass).
    current: dict[int, tuple[int, int]] = {}
    heap: list[tuple[tuple[int, int], Instruction]] = []

    def push(inst: Instruction) -> None:
        p = priority(inst)
        if current.get(inst.uid) != p:
            current[inst.uid] = p
            heapq.heappush(heap, (p, inst))      # p holds the unique position: never ties

    for inst in comp.instructions:
        if waiting[inst.uid] == 0:
            push(inst)
    order: list[Instruction] = []
    while heap:
        p, best = heapq.heappop(heap)
        if current.get(best.uid) != p:
            continue                             # stale: pushed again since, or done
        del current[best.uid]
        order.append(best)
        for bs in model.reads[best.uid]:
            readers_left[bs.id] -= 1
            if readers_left[bs.id] == 1:         # its last reader now frees it
                for r in readers[bs.id]:
                    if r.uid in current:
                        push(r)
        for s in succ[best.uid]:
            waiting[s.uid] -= 1
            if waiting[s.uid] == 0:
                push(s)
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
