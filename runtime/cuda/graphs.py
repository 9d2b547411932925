"""CUDA graphs: maximal straight-line runs of capturable thunks, recorded once and replayed.

A Triton launch from Python costs ~12 µs of host time, the same launch replayed inside a
CUDA graph ~1 µs (measured on the H200, DESIGN.md), so every run of consecutive capturable
thunks (kernels, library calls, copies) is one ``GraphSegment``. Host-driven control flow
and host fallbacks are not capturable: they end a segment, and the sequences inside a loop
body or a branch are segmented on their own.

A graph records device addresses. The arena and the constants never move, but parameters
(the caller's arrays) and outputs (fresh per call) may, so a segment keeps its graphs by
the addresses of the per-call allocations it touches:

- addresses seen for the first time: the segment runs eagerly (this is also the warm-up:
  Triton compiles and autotunes on its first launch, which must not happen inside a capture);
- the same addresses again: capture, then replay; from then on, replay only.

A caller that passes the same arrays and drops its results (a benchmark or serving loop;
torch's caching allocator hands the freed output block back) replays every call; one that
passes new arrays every call runs eagerly, with no capture wasted.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

from .arena import Memory
from .thunks import RunContext, Thunk

MAX_GRAPHS_PER_SEGMENT = 8
MAX_REMEMBERED_KEYS = 64


@dataclass
class GraphSettings:
    """Per-executable graph state: on/off, the capture stream and the shared memory pool."""
    enabled: bool = True
    stream: Any = None
    pool: Any = None
    max_graphs: int = MAX_GRAPHS_PER_SEGMENT
    failures: list[str] = field(default_factory=list)

    def ensure(self) -> None:
        import torch
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()


class GraphSegment(Thunk):
    kind = "graph"
    capturable = False

    def __init__(self, thunks: list[Thunk], dynamic: set[int]):
        self.inst = None  # type: ignore[assignment]
        self.thunks = thunks
        touched: set[int] = set()
        for t in thunks:
            touched |= t.allocations()
        self.dynamic = sorted(touched & dynamic)   # per-call allocations: part of the key
        self.graphs: "OrderedDict[tuple, Any]" = OrderedDict()
        self.seen: "OrderedDict[tuple, None]" = OrderedDict()
        self.broken: Optional[str] = None           # why capturing failed (then always eager)

    def _eager(self, mem: Memory, ctx: RunContext) -> None:
        for t in self.thunks:
            t.run(mem, ctx)

    def run(self, mem: Memory, ctx: RunContext) -> None:
        gs: Optional[GraphSettings] = getattr(ctx, "graphs", None)
        if gs is None or not gs.enabled or self.broken is not None or \
                not all(t.capturable for t in self.thunks):
            ctx.stats["eager_thunks"] = ctx.stats.get("eager_thunks", 0) + len(self.thunks)
            return self._eager(mem, ctx)
        key = tuple(mem.ptr(a) for a in self.dynamic)
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            graph.replay()
            ctx.stats["graph_replays"] = ctx.stats.get("graph_replays", 0) + 1
            return
        if key not in self.seen:
            # First time with these addresses: run (and warm up) eagerly.
            self.seen[key] = None
            if len(self.seen) > MAX_REMEMBERED_KEYS:
                self.seen.popitem(last=False)
            ctx.stats["eager_thunks"] = ctx.stats.get("eager_thunks", 0) + len(self.thunks)
            return self._eager(mem, ctx)
        try:
            graph = self._capture(mem, ctx, gs)
        except Exception as e:  # noqa: BLE001  (never worse than eager)
            self.broken = f"{type(e).__name__}: {e}"
            gs.failures.append(f"segment of {len(self.thunks)} thunks "
                               f"(first {self.thunks[0].label()}): {self.broken}")
            ctx.stats["capture_failures"] = ctx.stats.get("capture_failures", 0) + 1
            return self._eager(mem, ctx)
        self.graphs[key] = graph
        if len(self.graphs) > gs.max_graphs:
            self.graphs.popitem(last=False)
        ctx.stats["graph_captures"] = ctx.stats.get("graph_captures", 0) + 1
        graph.replay()
        ctx.stats["graph_replays"] = ctx.stats.get("graph_replays", 0) + 1

    def _capture(self, mem: Memory, ctx: RunContext, gs: GraphSettings) -> Any:
        import torch
        gs.ensure()
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        gs.stream.wait_stream(current)
        with torch.cuda.stream(gs.stream):
            graph.capture_begin(pool=gs.pool, capture_error_mode="thread_local")
            try:
                self._eager(mem, ctx)     # recorded, not run
            finally:
                graph.capture_end()
        current.wait_stream(gs.stream)
        return graph

    def label(self) -> str:
        return f"{len(self.thunks)} thunks"

    def describe(self, depth: int = 0) -> str:
        pad = "  " * depth
        return f"{pad}graph ({len(self.thunks)} thunks)\n" + "\n".join(
            t.describe(depth + 1) for t in self.thunks)

    def walk(self):
        yield self
        for t in self.thunks:
            yield from t.walk()


def segment(thunks: list[Thunk], dynamic: set[int]) -> list[Thunk]:
    """Group maximal runs of consecutive capturable thunks into GraphSegments."""
    out: list[Thunk] = []
    run: list[Thunk] = []
    for t in thunks:
        if t.capturable:
            run.append(t)
            continue
        if run:
            out.append(GraphSegment(run, dynamic))
            run = []
        out.append(t)
    if run:
        out.append(GraphSegment(run, dynamic))
    return out
