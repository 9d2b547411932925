"""Sharding propagation: give every instruction of the entry computation a sharding.

Shardings the user wrote (on parameters, the root, ``custom-call @Sharding``
constraints — anything that already has one) are fixed points: never changed.
The rest are filled in by rounds until nothing changes:

1. forwards, in post order: an instruction without a sharding takes the one its operands
   imply (``rules.forward``: elementwise, broadcast, transpose, reshape, dot, reduce,
   slice/pad/concatenate/reverse/dynamic-slice, gather, scatter);
2. backwards, in reverse post order: one still without takes what its users want of it
   (``rules.backward``).

**Conflict rule.** An instruction keeps the first sharding it is given. Forwards comes
before backwards within a round. When several operands (forwards) or users (backwards)
propose different shardings, the one cutting the array into the most tiles wins; a tie
goes to the lowest operand number (forwards) or the earliest user in the schedule
(backwards). A disagreement between an instruction's sharding and what a neighbour wants
is not an error: the partitioner reshards on that edge.

Calls are inlined first (``inline``), so propagation passes through them. ``tuple`` and
``get-tuple-element`` carry element shardings, also through a ``while`` whose initial
state is a ``tuple`` (its results take the initial state's shardings). Loop bodies are not
propagated into: the partitioner runs a ``while`` on whole (replicated) values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from hlo.ir import Instruction, Module
from hlo.sharding import Sharding

from ..base import register_pass
from ..inline import Inline
from . import rules
from .tiling import SpmdError, Tiling


def num_devices(module: Module) -> int:
    """Devices the module is partitioned over: ``num_partitions``, else the largest
    tiled sharding in it, else 1."""
    n = module.config.get("num_partitions")
    if n:
        return int(n)
    best = 1
    for c in module.computations:
        for i in c.instructions:
            for s in _leaves(i.sharding):
                if s.kind == "tiled":
                    best = max(best, s.num_devices)
    return best


def _leaves(s: Any) -> list[Sharding]:
    if not isinstance(s, Sharding):
        return []
    if s.is_tuple:
        return [x for e in s.elements for x in _leaves(e)]
    return [s]


def _is_array(inst: Instruction) -> bool:
    return not inst.shape.is_tuple and not getattr(inst.shape, "is_token", False)


def propagate(module: Module) -> dict[int, Tiling]:
    """Tilings of every array instruction of the entry (by ``id``); annotations fixed."""
    comp = module.entry
    assert comp is not None
    n = num_devices(module)
    order = comp.post_order()
    cur: dict[int, Tiling] = {}
    for inst in order:
        s = inst.sharding
        if isinstance(s, Sharding) and _is_array(inst) and s.kind != "manual":
            cur[id(inst)] = Tiling.from_sharding(s, len(inst.shape.dims), n)

    def get(i: Instruction) -> Optional[Tiling]:
        if i.opcode == "get-tuple-element":
            src = i.operands[0]
            if src.opcode == "tuple":
                return cur.get(id(src.operands[i.attrs["index"]]))
            if src.opcode == "while":
                return cur.get(id(src.operands[0].operands[i.attrs["index"]])) \
                    if src.operands[0].opcode == "tuple" else None
        return cur.get(id(i))

    changed = True
    while changed:
        changed = False
        for inst in order:
            if id(inst) in cur or not _is_array(inst):
                continue
            t = get(inst) if inst.opcode == "get-tuple-element" else \
                rules.forward(inst, [get(o) for o in inst.operands])
            if t is not None:
                cur[id(inst)] = t
                changed = True
        for inst in reversed(order):
            if id(inst) in cur or not _is_array(inst):
                continue
            cands = []
            for u in inst.users:
                ut = cur.get(id(u))
                if ut is None:
                    continue
                for k, o in enumerate(u.operands):
                    if o is inst:
                        t = rules.backward(u, k, ut)
                        if t is not None:
                            cands.append(t)
            if cands:
                # max() keeps the first of equals: the earliest user wins a tie.
                cur[id(inst)] = max(cands, key=lambda t: math.prod(t.tiles))
                changed = True
    return cur


def _tuple_sharding(inst: Instruction, cur: dict[int, Tiling], n: int) -> Optional[Sharding]:
    if inst.opcode == "tuple":
        els = []
        for o in inst.operands:
            if o.shape.is_tuple:
                return None
            t = cur.get(id(o))
            els.append(t.to_sharding() if t is not None else Sharding.replicated())
        return Sharding.tuple(els)
    return None


@register_pass
@dataclass(frozen=True)
class ShardingPropagation:
    """Fill in the sharding of every instruction of the entry computation."""
    name = "sharding-propagation"

    def run(self, module: Module) -> bool:
        if module.entry is None:
            return False
        if not any(_leaves(i.sharding) for i in module.entry.instructions):
            return False   # nothing is sharded: the module is not an SPMD program
        changed = Inline().run(module)
        cur = propagate(module)
        n = num_devices(module)
        for inst in module.entry.instructions:
            if inst.sharding is not None:
                continue
            if _is_array(inst):
                t = cur.get(id(inst))
                inst.attrs["sharding"] = (t.to_sharding() if t is not None
                                          else Sharding.replicated())
                changed = True
            else:
                s = _tuple_sharding(inst, cur, n)
                if s is not None:
                    inst.attrs["sharding"] = s
                    changed = True
        if n > 1 and not module.config.get("num_partitions"):
            module.config["num_partitions"] = n
            changed = True
        return changed


__all__ = ["ShardingPropagation", "propagate", "num_devices", "SpmdError"]
