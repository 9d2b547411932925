"""Sink gathers and dynamic slices through the elementwise work that produces their operand.

``gather(f(a, b), idx)`` equals ``f(gather(a, idx), gather(b, idx))`` for an elementwise
``f``: computing the producer at the gathered index only is what XLA's loop fusion does
when it fuses a gather's operand into it. Done here as an HLO rewrite before fusion, every
backend gets it, and buffer assignment sees the result: ``take_along_axis(log_softmax(x))``
no longer writes the [N, V] log-probabilities, only the row reductions (max, sum of exp)
and N gathered values of ``x``.

The walk goes down through elementwise instructions (their other users keep the original,
so nothing is recomputed at full size) and stops at anything else, which is then gathered
itself. A ``broadcast`` whose kept dimensions are not indexed becomes a broadcast of its
small operand to the gathered shape (the per-row max of a softmax is not expanded to
[N, V] just to pick one element per row). Only gathers that read fewer elements than
their operand holds are sunk, and at most ``max_cloned`` instructions are copied per
gather, so the duplicated work stays bounded by the gathered size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hlo.ir import Instruction, Module
from hlo.shape import Shape

from .base import register_pass
from .rewrite import emit

SUNK = ("gather", "dynamic-slice")


def _elementwise(inst: Instruction) -> bool:
    return (inst.op.elementwise and inst.opcode != "map" and not inst.is_side_effecting
            and isinstance(inst.shape, Shape))


def _gather_output_dims(g: Instruction) -> Optional[dict[int, int]]:
    """operand dim -> output dim for the dims a gather copies whole (batching dims and
    full, un-indexed offset dims); None if the attributes use a form not handled here."""
    a = g.attrs
    operand_rank = g.operands[0].shape.rank
    ivd = a["index_vector_dim"]
    offset_dims = list(a["offset_dims"])
    batch_out = [d for d in range(g.shape.rank) if d not in offset_dims]
    index_dims = [d for d in range(g.operands[1].shape.rank) if d != ivd]
    out: dict[int, int] = {}
    for k, d in enumerate(a.get("operand_batching_dims", ())):
        j = a["start_indices_batching_dims"][k]
        if j not in index_dims:
            return None
        out[d] = batch_out[index_dims.index(j)]
    skipped = set(a["collapsed_slice_dims"]) | set(a.get("operand_batching_dims", ()))
    offset_operand = [d for d in range(operand_rank) if d not in skipped]
    for n, d in enumerate(offset_operand):
        if d not in a["start_index_map"] and a["slice_sizes"][d] == g.operands[0].shape.dims[d]:
            out[d] = offset_dims[n]
    return out


class _Sinker:
    def __init__(self, sunk: Instruction, max_cloned: int):
        self.sunk, self.budget = sunk, max_cloned
        self.memo: dict[int, Instruction] = {}

    def shape(self, like: Instruction) -> Shape:
        return self.sunk.shape.with_dtype(like.shape.dtype)

    def gathered(self, x: Instruction) -> Instruction:
        """``x`` at the sunk instruction's indices, as a new value of the sunk shape."""
        hit = self.memo.get(id(x))
        if hit is None:
            hit = self.memo[id(x)] = self._gathered(x)
        return hit

    def _gathered(self, x: Instruction) -> Instruction:
        g = self.sunk
        if x.opcode == "broadcast":
            small = self._broadcast(x)
            if small is not None:
                return small
        if _elementwise(x) and self.budget > 0 \
                and all(o.shape.dims == x.shape.dims for o in x.operands):
            self.budget -= 1
            ops = [self.gathered(o) for o in x.operands]
            attrs = {k: v for k, v in x.attrs.items() if k != "metadata"}
            return emit(g, x.opcode, ops, self.shape(x), name=x.name.split(".")[0], **attrs)
        attrs = {k: v for k, v in g.attrs.items() if k != "metadata"}
        return emit(g, g.opcode, [x, *g.operands[1:]], self.shape(x), name=g.opcode, **attrs)

    def _broadcast(self, b: Instruction) -> Optional[Instruction]:
        g, small = self.sunk, b.operands[0]
        dims = list(b.attrs.get("dimensions", ()))
        if g.opcode == "dynamic-slice":
            if dims:
                sizes = [g.attrs["dynamic_slice_sizes"][d] for d in dims]
                starts = [g.operands[1 + d] for d in dims]
                small = emit(g, "dynamic-slice", [small, *starts],
                             Shape(small.shape.dtype, tuple(sizes), small.shape.layout), name="dynamic-slice",
                             dynamic_slice_sizes=tuple(sizes))
            return emit(g, "broadcast", [small], self.shape(b), name="broadcast",
                        dimensions=tuple(dims))
        kept = _gather_output_dims(g)
        if kept is None or any(d not in kept for d in dims):
            return None
        out_dims = [kept[d] for d in dims]
        if out_dims != sorted(out_dims):
            return None
        return emit(g, "broadcast", [small], self.shape(b), name="broadcast",
                    dimensions=tuple(out_dims))


@register_pass
@dataclass(frozen=True)
class SinkGathers:
    """Rewrite ``gather/dynamic-slice(elementwise(...))`` into elementwise work on gathered
    operands (module docstring)."""
    name = "sink-gathers"
    max_cloned: int = 32

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations:
            sunk = [i for i in comp.instructions if i.opcode in SUNK
                    and isinstance(i.shape, Shape) and i.shape.size < i.operands[0].shape.size
                    and (_elementwise(i.operands[0]) or i.operands[0].opcode == "broadcast")]
            for inst in sunk:
                operand = inst.operands[0]
                new = _Sinker(inst, self.max_cloned).gathered(operand)
                if new.opcode == inst.opcode and new.operands[0] is operand:
                    continue        # nothing to sink through; the copy is dead
                inst.replace_all_uses_with(new)
                changed = True
            if sunk:
                comp.remove_dead()
        return changed
