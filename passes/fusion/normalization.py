"""Whole-row normalization fusion (softmax, layer norm) as one Triton kernel.

As XLA's Triton softmax rewriter does: starting from a row reduction (a reduce over the
minor-most dimensions), grow a group over the elementwise ops, broadcasts and further row
reductions around it whose results are either row-shaped (the reduce's input dims) or
reduced-shaped (its output dims). A kernel per row block keeps the row on chip, so the
input is read once and the result written once, however many reductions and broadcasts
("diamonds") there are in between. The group becomes a ``kCustom`` fusion with
``backend_config={"fusion_backend_config":{"kind":"__triton"}}``.

A group is formed only when it has a diamond (a reduced value broadcast back to rows),
one output, and rows of at most ``max_row_elements``; otherwise its instructions are left
to the ordinary fusion policy.
"""
from __future__ import annotations

import math
from typing import Optional

from hlo.ir import Instruction
from hlo.layout_util import is_default
from hlo.ops import ELEMENTWISE

from .explain import FusionDecision, FusionReport
from .legality import check_group
from .rewrite import FusionState, Group

REASON = "normalization: row-wise reduction diamond kept on chip (Triton softmax rewriter)"


def row_reduction(inst: Instruction) -> Optional[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(input dims, reduced dims) when ``inst`` reduces the trailing (minor-most) dims."""
    if inst.opcode != "reduce" or inst.shape.is_tuple or len(inst.operands) != 2:
        return None
    src = inst.operands[0].shape
    dims = sorted(inst.attrs.get("dimensions", ()))
    k = src.rank - len(dims)
    if not dims or dims != list(range(k, src.rank)) or not is_default(src.layout):
        return None
    if inst.operands[1].opcode != "constant":
        return None
    return src.dims, src.dims[:k]


def _squeeze(dims: tuple) -> tuple:
    """Dims without 1s: [8192,1] and [8192] are the same rows (keepdims=True reshapes)."""
    return tuple(d for d in dims if d != 1)


def _fits(inst: Instruction, full: tuple, rows: tuple) -> bool:
    shapes = (_squeeze(full), _squeeze(rows))
    if inst.shape.is_tuple or _squeeze(inst.shape.dims) not in shapes:
        return False
    if inst.opcode == "reduce":
        r = row_reduction(inst)
        return r is not None and r[0] == full
    if inst.opcode in ("broadcast", "bitcast"):
        return True
    if inst.opcode == "reshape":
        return _squeeze(inst.operands[0].shape.dims) == _squeeze(inst.shape.dims)
    return inst.op.category == ELEMENTWISE and all(
        _squeeze(o.shape.dims) in shapes + ((),) for o in inst.operands)


def _descendants(members: set[int], insts: list[Instruction]) -> set[int]:
    out: set[int] = set()
    stack = [u for i in insts for u in i.users if id(u) not in members]
    while stack:
        u = stack.pop()
        if id(u) in out:
            continue
        out.add(id(u))
        stack.extend(u.users)
    return out


def grow(state: FusionState, seed: Instruction, full: tuple, rows: tuple) -> list[Instruction]:
    group = [seed]
    ids = {id(seed)}

    def free_group(i: Instruction) -> bool:
        g = state.group_of(i)
        return g is not None and g.kind != "normalization" and len(g.instances()) == 1

    changed = True
    while changed:
        changed = False
        reach = _descendants(ids, group)
        for m in list(group):
            for n in list(m.operands) + list(m.users):
                if id(n) in ids or n.parent is not state.comp or not free_group(n):
                    continue
                if not _fits(n, full, rows):
                    continue
                if n in m.operands and not all(id(u) in ids for u in n.users):
                    continue
                if any(id(o) not in ids and id(o) in reach for o in n.operands):
                    continue
                group.append(n)
                ids.add(id(n))
                changed = True
                reach = _descendants(ids, group)
    return group


def form_groups(state: FusionState, report: Optional[FusionReport] = None,
                max_row_elements: int = 65536, max_operands: int = 96,
                max_size: int = 256) -> list[Group]:
    """Find softmax/layer-norm shaped subgraphs and make each one normalization group."""
    made: list[Group] = []
    for inst in list(state.comp.instructions):
        g0 = state.group_of(inst)
        if g0 is None or g0.kind in ("normalization", "attention"):
            continue
        shape = row_reduction(inst)
        if shape is None:
            continue
        full, rows = shape
        members = grow(state, inst, full, rows)
        diamond = any(m.opcode == "broadcast" and _squeeze(m.shape.dims) == _squeeze(full)
                      and _squeeze(m.operands[0].shape.dims) == _squeeze(rows)
                      and m.operands[0] in members for m in members)
        row = math.prod(full[len(rows):])
        reason = None
        if not diamond:
            reason = "no reduced value is broadcast back to the rows (a plain reduction)"
        elif row > max_row_elements:
            reason = f"rows of {row} elements exceed {max_row_elements}"
        else:
            groups = [state.group_of(m) for m in members]
            inside = {g.id for g in groups}
            d = check_group(state, members, members, inside, "normalization",
                            max_operands, max_size)
            if not d:
                reason = d.reason
        if reason is not None:
            if report is not None:
                report.record(FusionDecision(inst.name, "-", False, "normalization",
                                             f"no normalization fusion: {reason}",
                                             computation=state.comp.name))
            continue
        apart = sum(state.node_estimate(gr).time_us for gr in groups)
        g = state.merge_many(groups, "normalization")
        made.append(g)
        if report is not None:
            est = state.node_estimate(g)
            for m in members:
                for o in m.operands:
                    if o in g:
                        report.record(FusionDecision(o.name, m.name, True, "normalization",
                                                     REASON, apart, est.time_us,
                                                     state.comp.name))
    return made
