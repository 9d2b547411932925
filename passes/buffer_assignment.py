"""Buffer assignment: every array value of a scheduled module gets bytes at an offset.

``assign_buffers(module) -> BufferAssignment``:

1. ``Dataflow`` groups positions that must share a buffer (tuples, views, loop state ...);
2. ``Liveness`` gives each group a live range over the flattened schedule;
3. in-place sharing: a result may be written over an operand buffer that dies at it (same
   size, temp only) where ``dataflow.can_share_operand_buffer`` allows it (XLA's rule:
   elementwise reads, or an in-place op such as dynamic-update-slice / scatter); the two
   groups become one, with the union of their (touching) live ranges;
4. groups holding an entry parameter become parameter allocations, constants get read-only
   allocations of their own, entry outputs get output allocations (or, when donated, the
   parameter's), and every other group is packed into ONE temp arena by the heap simulator.

The result reports like XLA's buffer-assignment dump (``to_text``) and draws the memory
timeline (``memory_timeline_svg``; Jupyter shows it via ``_repr_svg_``).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Optional

from hlo.ir import Instruction, Module
from hlo.shape import subshape

from .base import PassError
from .dataflow import BufferSet, Dataflow, Index, donated_output_writer, \
    in_place_operand_candidates, output_aliases
from .heap_simulator import ALIGNMENT, HeapBuffer, HeapResult, align, lower_bound, simulate
from .liveness import Interval, Liveness


@dataclass(eq=False)
class LogicalBuffer:
    """One group of BufferSets that occupy the same bytes (after in-place sharing)."""
    id: int
    sets: list[BufferSet]
    interval: Interval
    kind: str = "temp"                    # parameter | constant | output | temp
    parameter: Optional[int] = None       # entry parameter number
    parameter_index: Index = ()
    output_index: Optional[Index] = None
    allocation: int = -1
    offset: int = 0

    @property
    def size(self) -> int:
        return max((s.size for s in self.sets), default=0)

    @property
    def name(self) -> str:
        inst, ix = self.sets[0].positions[0]
        for s in self.sets:
            for i, x in s.defining():
                inst, ix = i, x
                break
            else:
                continue
            break
        return f"%{inst.name}" + ("{" + ",".join(map(str, ix)) + "}" if ix else "")

    def positions(self):
        for s in self.sets:
            yield from s.positions


@dataclass
class Allocation:
    index: int
    kind: str
    size: int
    buffers: list[LogicalBuffer] = field(default_factory=list)
    parameter: Optional[int] = None
    parameter_index: Index = ()
    output_index: Optional[Index] = None
    maybe_live_out: bool = False
    heap: Optional[HeapResult] = None


class BufferAssignment:
    def __init__(self, module: Module, flow: Dataflow, liveness: Liveness,
                 buffers: list[LogicalBuffer], allocations: list[Allocation],
                 shared: list[tuple[str, str]], aliased_outputs: dict[Index, int]):
        self.module = module
        self.flow = flow
        self.liveness = liveness
        self.buffers = buffers
        self.allocations = allocations
        self.shared_in_place = shared          # (user, operand) names that share
        self.aliased_outputs = aliased_outputs  # output index -> donated parameter
        self._buffer_of_set: dict[int, LogicalBuffer] = {}
        for b in buffers:
            for s in b.sets:
                self._buffer_of_set[s.id] = b

    # --- lookups -----------------------------------------------------------------------
    def buffer(self, inst: Instruction, index: Index = ()) -> LogicalBuffer:
        return self._buffer_of_set[self.flow.buffer_set(inst, index).id]

    def slice(self, inst: Instruction, index: Index = ()) -> tuple[Allocation, int]:
        """(allocation, byte offset) of one array leaf."""
        b = self.buffer(inst, index)
        return self.allocations[b.allocation], b.offset

    @property
    def temp_allocation(self) -> Optional[Allocation]:
        for a in self.allocations:
            if a.kind == "temp":
                return a
        return None

    @property
    def temp_size(self) -> int:
        t = self.temp_allocation
        return t.size if t is not None else 0

    def temp_buffers(self) -> list[LogicalBuffer]:
        return [b for b in self.buffers if b.kind == "temp"]

    def heap_buffers(self) -> list[HeapBuffer]:
        return [HeapBuffer(b.id, b.size, b.interval.start, b.interval.end)
                for b in self.temp_buffers()]

    @property
    def lower_bound(self) -> int:
        """No-fragmentation lower bound of the temp arena (peak of live aligned bytes)."""
        return lower_bound(self.heap_buffers())

    def argument_size(self) -> int:
        from .dataflow import array_leaves
        return sum(s.byte_size for p in self.module.entry.parameters
                   for _, s in array_leaves(p.shape))

    def output_size(self) -> int:
        from .dataflow import array_leaves
        return sum(s.byte_size for _, s in array_leaves(self.module.entry.root.shape))

    def alias_size(self) -> int:
        root = self.module.entry.root.shape
        return sum(subshape(root, ix).byte_size for ix in self.aliased_outputs)

    def constant_size(self) -> int:
        return sum(a.size for a in self.allocations if a.kind == "constant")

    # --- timeline ----------------------------------------------------------------------
    def timeline(self) -> list[int]:
        """Live temp bytes (aligned) at each step of the flattened schedule."""
        steps = len(self.liveness.sequence)
        live = [0] * max(steps, 1)
        for b in self.temp_buffers():
            for t in range(b.interval.start, b.interval.end + 1):
                live[t] += align(b.size)
        return live

    def peak(self) -> tuple[int, int, list[LogicalBuffer]]:
        """(time step, bytes, buffers live then, biggest first) of the temp peak."""
        live = self.timeline()
        t = max(range(len(live)), key=lambda k: live[k]) if live else 0
        at = [b for b in self.temp_buffers() if b.interval.start <= t <= b.interval.end]
        return t, live[t] if live else 0, sorted(at, key=lambda b: -b.size)

    # --- reports -----------------------------------------------------------------------
    def to_text(self) -> str:
        lines = ["BufferAssignment:"]
        for a in self.allocations:
            what = {"parameter": f"parameter {a.parameter}, shape index {{{','.join(map(str, a.parameter_index))}}}",
                    "constant": "constant",
                    "output": "output shape index {" + ",".join(map(str, a.output_index or ())) + "}",
                    "temp": "preallocated-temp"}[a.kind]
            if a.maybe_live_out:
                what += ", maybe-live-out"
            if a.kind == "parameter" and a.output_index is not None:
                what += ", aliased with output {" + ",".join(map(str, a.output_index)) + "}"
            lines.append(f"allocation {a.index}: size {a.size}, {what}:")
            for b in sorted(a.buffers, key=lambda b: (b.offset, b.id)):
                shape = _leaf_shape(b)
                lines.append(f" value: <{b.id} {b.name}> (size={b.size},offset={b.offset}): "
                             f"{shape} live [{b.interval.start}, {b.interval.end}]")
        lines.append("")
        lines.append(f"Total bytes used: {sum(a.size for a in self.allocations)}")
        t = self.temp_allocation
        if t is not None:
            lines.append(f"Temp arena: {t.size} bytes ({t.heap.algorithm if t.heap else ''}); "
                         f"no-fragmentation lower bound {self.lower_bound} bytes; "
                         f"alignment {ALIGNMENT}")
        if self.shared_in_place:
            lines.append("In-place sharing: " + ", ".join(f"%{u} reuses %{o}"
                                                         for u, o in self.shared_in_place))
        step, peak, at = self.peak()
        lines.append(f"Peak live temp bytes {peak} at step {step}"
                     + (f" (%{self.liveness.sequence[step].name})" if self.liveness.sequence else "")
                     + (": " + ", ".join(f"{b.name} {b.size}" for b in at[:8]) if at else ""))
        return "\n".join(lines) + "\n"

    def memory_timeline_svg(self, width: int = 640, height: int = 220) -> str:
        """Live temp bytes over schedule steps, peak marked with the buffers making it."""
        live = self.timeline()
        n = len(live)
        top = max(max(live), 1)
        left, bottom, right, head = 60, 30, 10, 40
        w, h = width - left - right, height - bottom - head
        xs = lambda t: left + (w * t / max(n - 1, 1))  # noqa: E731
        ys = lambda v: head + h - h * v / top  # noqa: E731
        pts = " ".join(f"{xs(t):.1f},{ys(v):.1f}" for t, v in enumerate(live))
        step, peak, at = self.peak()
        names = ", ".join(f"{b.name} ({b.size} B)" for b in at[:4]) + (" ..." if len(at) > 4 else "")
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="Helvetica,Arial,sans-serif" font-size="11">',
            f'<text x="{left}" y="14" font-size="13">Live temp bytes over the schedule '
            f'({html.escape(self.module.name)}): arena {self.temp_size} B, lower bound '
            f'{self.lower_bound} B</text>',
            f'<text x="{left}" y="30" fill="#b22">peak {peak} B at step {step}: '
            f'{html.escape(names)}</text>',
            f'<line x1="{left}" y1="{head + h}" x2="{left + w}" y2="{head + h}" stroke="#444"/>',
            f'<line x1="{left}" y1="{head}" x2="{left}" y2="{head + h}" stroke="#444"/>',
            f'<text x="{left - 4}" y="{head + 4}" text-anchor="end">{top}</text>',
            f'<text x="{left - 4}" y="{head + h}" text-anchor="end">0</text>',
            f'<text x="{left + w}" y="{height - 8}" text-anchor="end">step {n - 1}</text>',
            f'<polyline fill="none" stroke="#2a6ebb" stroke-width="1.5" points="{pts}"/>',
            f'<circle cx="{xs(step):.1f}" cy="{ys(peak):.1f}" r="3" fill="#b22"/>',
            "</svg>",
        ]
        return "\n".join(parts)

    def _repr_svg_(self) -> str:
        return self.memory_timeline_svg()

    def html_section(self) -> str:
        """The dump report's section: timeline and the text report."""
        return (f"<h2>Buffer assignment</h2>{self.memory_timeline_svg()}"
                f"<pre>{html.escape(self.to_text())}</pre>")

    def __repr__(self) -> str:
        return (f"<BufferAssignment {self.module.name}: {len(self.allocations)} allocations, "
                f"temp {self.temp_size} B>")


def _leaf_shape(b: LogicalBuffer) -> str:
    inst, ix = b.sets[0].positions[0]
    return subshape(inst.shape, ix).to_text()


# --- the algorithm -------------------------------------------------------------------------
def assign_buffers(module: Module, *, share_in_place: bool = True) -> BufferAssignment:
    if module.entry is None:
        raise PassError("assign_buffers needs a module with an entry computation")
    if not module.is_scheduled:
        raise PassError(f"module {module.name} is not scheduled: run the 'schedule' pass "
                        "before buffer assignment")
    flow = Dataflow(module)
    live = Liveness(module, flow)
    entry = module.entry
    # Groups of sets (union-find over set ids).
    parent = {s.id: s.id for s in flow.sets}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    span = {s.id: live.interval(s) for s in flow.sets}
    gsize = {s.id: s.size for s in flow.sets}
    kinds: dict[int, set[str]] = {}
    for s in flow.sets:
        k: set[str] = set()
        for inst, _ in s.positions:
            if inst.opcode == "parameter" and inst.parent is entry:
                k.add("parameter")
            elif inst.opcode == "constant":
                k.add("constant")
        kinds[s.id] = k
    outputs = {s.id for s in flow.sets_of(entry.root)}

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra == rb:
            return
        parent[rb] = ra
        ia, ib = span[ra], span[rb]
        span[ra] = Interval(min(ia.start, ib.start), max(ia.end, ib.end))
        kinds[ra] |= kinds[rb]
        gsize[ra] = max(gsize[ra], gsize[rb])

    # Donated parameters: the output takes the parameter's buffer (copy insertion added
    # control edges so that it is written after every read of the parameter).
    aliased: dict[Index, int] = {}
    for ix, pnum in output_aliases(module).items():
        if donated_output_writer(entry, ix) is None:
            continue
        out_set = flow.buffer_set(entry.root, ix)
        p_set = flow.buffer_set(entry.parameters[pnum], ())
        if out_set.size != p_set.size:
            continue
        union(p_set.id, out_set.id)
        aliased[ix] = pnum

    shared: list[tuple[str, str]] = []
    output_roots = {find(o) for o in outputs}
    if share_in_place:
        for inst in live.sequence:
            t = live.time[inst.uid]
            taken: set[int] = set()
            for ix, k in in_place_operand_candidates(inst):
                operand = inst.operands[k]
                if not operand.shape.is_array or operand.shape.is_tuple:
                    continue
                a = find(flow.buffer_set(operand, ()).id)
                r = find(flow.buffer_set(inst, ix).id)
                if a == r or a in taken or r in taken:
                    continue
                sa, sr = span[a], span[r]
                if kinds[a] or a in output_roots or sa.end != t or sr.start != t:
                    continue
                if gsize[a] != gsize[r]:
                    continue
                union(r, a)
                taken.update((a, r))
                shared.append((inst.name, operand.name))

    groups: dict[int, list[BufferSet]] = {}
    for s in flow.sets:
        groups.setdefault(find(s.id), []).append(s)
    # Each output set's first leaf of the root (its place in the root's leaf order, the
    # index), so that a group's output index is the earliest leaf holding one of its sets.
    # Walking the root's leaves for every output group was quadratic in the outputs
    # (issue 13: an AdamW step over 200 arrays returns 600, ~0.2 s of its build).
    first_leaf: dict[int, tuple[int, Index]] = {}
    for k, (ix, s) in enumerate(flow.positions(entry.root)):
        first_leaf.setdefault(s.id, (k, ix))
    buffers: list[LogicalBuffer] = []
    for root_id, sets in groups.items():
        b = LogicalBuffer(len(buffers), sets, span[root_id])
        ks = kinds[root_id]
        for s in sets:
            for inst, ix in s.positions:
                if inst.opcode == "parameter" and inst.parent is entry:
                    b.kind, b.parameter, b.parameter_index = "parameter", inst.parameter_number, ix
        if b.kind != "parameter":
            if "constant" in ks:
                b.kind = "constant"
            elif any(s.id in outputs for s in sets):
                b.kind = "output"
        leaves = [first_leaf[s.id] for s in sets if s.id in first_leaf]
        if leaves:
            b.output_index = min(leaves)[1]
        buffers.append(b)

    allocations: list[Allocation] = []
    for b in buffers:
        if b.kind == "temp":
            continue
        a = Allocation(len(allocations), b.kind, b.size, [b], parameter=b.parameter,
                       parameter_index=b.parameter_index, output_index=b.output_index,
                       maybe_live_out=b.output_index is not None)
        b.allocation, b.offset = a.index, 0
        allocations.append(a)
    temps = [b for b in buffers if b.kind == "temp"]
    heap = simulate([HeapBuffer(b.id, b.size, b.interval.start, b.interval.end) for b in temps])
    temp = Allocation(len(allocations), "temp", heap.heap_size, temps, heap=heap)
    allocations.append(temp)
    for b in temps:
        b.allocation, b.offset = temp.index, heap.offsets[b.id]
    return BufferAssignment(module, flow, live, buffers, allocations, shared, aliased)
