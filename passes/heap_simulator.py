"""Packing buffers with live ranges into one arena: offsets, alignment, a lower bound.

Each buffer is ``(key, size, start, end)`` over schedule time steps (``end`` inclusive).
Two buffers may share bytes only when their live ranges do not overlap. The packers:

- ``best_fit(buffers, order="spatial")``: place buffers biggest first; each goes into the
  smallest gap (between already placed, time-overlapping buffers) that fits it, else on top
  (XLA's GlobalDecreasingSizeBestFitHeap, spatial ordering);
- ``order="temporal"``: the same best fit, buffers taken by start time (then size);
- ``simulate(buffers)`` runs both and keeps the smaller arena.

``lower_bound(buffers)``: the peak over time of the sum of live (aligned) sizes: no packing
can beat it, a perfect one without fragmentation reaches it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

ALIGNMENT = 64


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class HeapBuffer:
    key: Hashable
    size: int
    start: int
    end: int


@dataclass
class HeapResult:
    offsets: dict[Hashable, int] = field(default_factory=dict)
    heap_size: int = 0
    algorithm: str = ""


def _overlap(a: HeapBuffer, b: HeapBuffer) -> bool:
    return a.start <= b.end and b.start <= a.end


def best_fit(buffers: Sequence[HeapBuffer], order: str = "spatial",
             alignment: int = ALIGNMENT) -> HeapResult:
    if order == "spatial":
        todo = sorted(buffers, key=lambda b: (-align(b.size, alignment), -(b.end - b.start), b.start))
    elif order == "temporal":
        todo = sorted(buffers, key=lambda b: (b.start, -align(b.size, alignment)))
    else:
        raise ValueError(f"unknown order {order!r}")
    placed: list[tuple[HeapBuffer, int, int]] = []   # (buffer, offset, aligned size)
    result = HeapResult(algorithm=f"best-fit/{order}")
    for b in todo:
        size = align(b.size, alignment)
        if size == 0:
            result.offsets[b.key] = 0
            continue
        busy = sorted((off, off + sz) for pb, off, sz in placed if _overlap(pb, b))
        best_off, best_gap = None, None
        cursor = 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best_off, best_gap = cursor, gap
            cursor = max(cursor, hi)
        if best_off is None:
            best_off = cursor   # on top of everything live at the same time
        placed.append((b, best_off, size))
        result.offsets[b.key] = best_off
        result.heap_size = max(result.heap_size, best_off + size)
    return result


def simulate(buffers: Sequence[HeapBuffer], alignment: int = ALIGNMENT) -> HeapResult:
    """The smaller of spatial and temporal best fit (ties: spatial)."""
    results = [best_fit(buffers, o, alignment) for o in ("spatial", "temporal")]
    return min(results, key=lambda r: r.heap_size)


def lower_bound(buffers: Sequence[HeapBuffer], alignment: int = ALIGNMENT) -> int:
    """Peak over time of the total aligned size of live buffers."""
    events: dict[int, int] = {}
    for b in buffers:
        s = align(b.size, alignment)
        events[b.start] = events.get(b.start, 0) + s
        events[b.end + 1] = events.get(b.end + 1, 0) - s
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def check_packing(buffers: Sequence[HeapBuffer], offsets: dict[Hashable, int],
                  alignment: int = ALIGNMENT) -> list[tuple[Hashable, Hashable]]:
    """Pairs of buffers that are live together and overlap in the arena (should be none)."""
    bad = []
    items = list(buffers)
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if a.size and b.size and _overlap(a, b):
                oa, ob = offsets[a.key], offsets[b.key]
                if oa < ob + b.size and ob < oa + a.size:
                    bad.append((a.key, b.key))
    return bad
