"""Sharding propagation: give every instruction a sharding, loop bodies included.

Shardings the user wrote (on parameters, the root, ``custom-call @Sharding``
constraints — anything that already has one) are fixed points: never changed.
The rest are filled in by rounds until nothing changes:

1. forwards, in post order: an instruction without a sharding takes the one its operands
   imply (``rules.forward``: elementwise, broadcast, transpose, reshape, dot, reduce,
   slice/pad/concatenate/reverse/dynamic-slice, gather, scatter, sort);
2. backwards, in reverse post order: one still without takes what its users want of it
   (``rules.backward``).

**Conflict rule.** An instruction keeps the first sharding it is given. Forwards comes
before backwards within a round. When several operands (forwards) or users (backwards)
propose different shardings, the one cutting the array into the most tiles wins; a tie
goes to the lowest operand number (forwards) or the earliest user in the schedule
(backwards). A disagreement between an instruction's sharding and what a neighbour wants
is not an error: the partitioner reshards on that edge.

Calls are inlined first (``inline``), so propagation passes through them. ``tuple`` and
``get-tuple-element`` carry element shardings, also through ``sort`` and ``while``.

**While loops** (GSPMD's rule): the loop state has one sharding, shared by the ``while``,
its body's parameter and root and its condition's parameter. It starts as the initial
state's; the body is propagated with its parameter fixed to it and its root wanting it,
and an element the initial state leaves whole takes the body's split of it (a carry
built from a broadcast zero, say), until nothing changes. The entry is then propagated
again with the loop's results split that way.

**Manual computations** (``shard_map``: the values between ``SPMDFullToShardShape`` and
``SPMDShardToFullShape``) are per-device programs already: propagation leaves them alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from hlo.ir import Computation, Instruction, Module
from hlo.sharding import Sharding

from ..base import register_pass
from ..inline import Inline
from . import rules
from .tiling import SpmdError, Tiling

MAX_LOOP_ROUNDS = 4


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
    return not inst.shape.is_tuple and not inst.shape.is_token


def _target(inst: Instruction) -> Optional[str]:
    return inst.attrs.get("custom_call_target") if inst.opcode == "custom-call" else None


def manual_region(comp: Computation) -> set[int]:
    """ids of the instructions of ``comp`` inside manual computations: everything reached
    from an ``SPMDFullToShardShape`` before an ``SPMDShardToFullShape``."""
    region: set[int] = set()
    for inst in comp.post_order():
        if _target(inst) == "SPMDFullToShardShape" or (
                _target(inst) != "SPMDShardToFullShape"
                and any(id(o) in region for o in inst.operands)):
            region.add(id(inst))
    return region


class _Propagator:
    """Tilings of one computation's array instructions (and element tilings of its
    tuple-shaped ones), loops recursed into."""

    def __init__(self, n: int):
        self.n = n
        self.loops: dict[int, list[Tiling]] = {}    # id(while) -> loop state tilings
        self.done: dict[int, tuple[dict, dict]] = {}  # id(comp) -> its (cur, tuples)

    def run(self, comp: Computation, params: Optional[list[Tiling]] = None,
            root_wants: Optional[list[Tiling]] = None) -> tuple[dict[int, Tiling],
                                                               dict[int, list]]:
        """(tilings by id, element tilings of tuple-shaped values by id) of ``comp``, its
        parameter's elements fixed to ``params`` and its root tuple wanting
        ``root_wants`` (a loop body)."""
        order = comp.post_order()
        manual = manual_region(comp)
        whiles = [i for i in order if i.opcode == "while" and id(i) not in manual]
        for _ in range(MAX_LOOP_ROUNDS):
            cur: dict[int, Tiling] = {}
            tuples: dict[int, list[Optional[Tiling]]] = {}
            for inst in order:
                s = inst.sharding
                if id(inst) in manual:
                    continue
                if isinstance(s, Sharding) and _is_array(inst) and s.kind != "manual":
                    cur[id(inst)] = Tiling.from_sharding(s, len(inst.shape.dims), self.n)
            if params is not None:
                tuples[id(comp.parameters[0])] = list(params)
            for w in whiles:
                if id(w) in self.loops:
                    tuples[id(w)] = list(self.loops[id(w)])
            self._fixed_point(order, manual, cur, tuples, root_wants, comp)
            changed = False
            for w in whiles:
                state = self._loop(w, cur)
                old = self.loops.get(id(w))
                if state is not None and (old is None or any(
                        not a.same_as(b) for a, b in zip(old, state))):
                    self.loops[id(w)] = state
                    changed = True
            if not changed:
                break
        return cur, tuples

    def _fixed_point(self, order, manual, cur, tuples, root_wants, comp) -> None:
        def get(i: Instruction) -> Optional[Tiling]:
            if id(i) in manual:
                return None
            if i.opcode == "get-tuple-element":
                src = i.operands[0]
                if src.opcode == "tuple":
                    return cur.get(id(src.operands[i.attrs["index"]]))
                els = tuples.get(id(src))
                return els[i.attrs["index"]] if els is not None else None
            return cur.get(id(i))

        changed = True
        while changed:
            changed = False
            for inst in order:
                if id(inst) in manual:
                    continue
                if inst.shape.is_tuple:
                    if id(inst) not in tuples and inst.opcode in ("sort", "topk"):
                        els = rules.tuple_forward(inst, [get(o) for o in inst.operands])
                        if els is not None:
                            tuples[id(inst)] = els
                            changed = True
                    continue
                if id(inst) in cur or not _is_array(inst):
                    continue
                t = get(inst) if inst.opcode == "get-tuple-element" else \
                    rules.forward(inst, [get(o) for o in inst.operands])
                if t is not None:
                    cur[id(inst)] = t
                    changed = True
            for inst in reversed(order):
                if id(inst) in cur or not _is_array(inst) or id(inst) in manual:
                    continue
                cands = []
                for u in inst.users:
                    if u.opcode == "tuple" and u is comp.root and root_wants is not None:
                        cands += [root_wants[k] for k, o in enumerate(u.operands) if o is inst]
                        continue
                    ut = cur.get(id(u))
                    if ut is None or id(u) in manual:
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

    def _loop(self, inst: Instruction, cur: dict) -> Optional[list[Tiling]]:
        """The loop state tilings of ``inst`` (its body and condition propagated with
        them, kept in ``done``), or None for a loop whose state is not a flat tuple."""
        init = inst.operands[0]
        shapes = inst.shape.elements
        if init.opcode != "tuple" or any(not _is_array_shape(s) for s in shapes):
            return None
        # The initial state's tilings where it has them (they may have appeared since the
        # last round); elsewhere what the body grew last time, or whole.
        prev = self.loops.get(id(inst))
        state = [cur.get(id(o)) or (prev[k] if prev else Tiling.replicated(len(s.dims), self.n))
                 for k, (o, s) in enumerate(zip(init.operands, shapes))]
        body, cond = inst.attrs["body"], inst.attrs["condition"]
        for _ in range(MAX_LOOP_ROUNDS):
            bcur, btuples = self.run(body, state, state)
            self.done[id(body)] = (bcur, btuples)
            grown = list(state)
            if body.root.opcode == "tuple":
                for k, o in enumerate(body.root.operands):
                    t = bcur.get(id(o))
                    if t is not None and state[k].is_replicated and not t.is_replicated:
                        grown[k] = t.without_partial()
            if all(a.same_as(b) for a, b in zip(grown, state)):
                break
            state = grown
        self.done[id(body)] = self.run(body, state, state)
        self.done[id(cond)] = self.run(cond, state, None)
        return state


def _is_array_shape(s: Any) -> bool:
    return not s.is_tuple and not s.is_token


def propagate(module: Module) -> dict[int, Tiling]:
    """Tilings of every array instruction of the entry (by ``id``); annotations fixed."""
    assert module.entry is not None
    cur, _ = _Propagator(num_devices(module)).run(module.entry)
    return cur


def _annotate(comp: Computation, cur: dict, tuples: dict) -> bool:
    """Write the shardings ``cur``/``tuples`` give into ``comp`` (annotations kept)."""
    changed = False
    manual = manual_region(comp)
    for inst in comp.instructions:
        if inst.sharding is not None or id(inst) in manual:
            continue
        s = None
        if _is_array(inst):
            t = cur.get(id(inst))
            s = t.to_sharding() if t is not None else Sharding.replicated()
        elif inst.opcode == "tuple":
            if any(o.shape.is_tuple for o in inst.operands):
                continue
            s = Sharding.tuple([cur[id(o)].to_sharding() if id(o) in cur
                                else Sharding.replicated() for o in inst.operands])
        elif id(inst) in tuples and all(t is not None for t in tuples[id(inst)]):
            s = Sharding.tuple([t.to_sharding() for t in tuples[id(inst)]])
        if s is not None:
            inst.attrs["sharding"] = s
            changed = True
    return changed


@register_pass
@dataclass(frozen=True)
class ShardingPropagation:
    """Fill in the sharding of every instruction of the entry computation and of the
    loops it runs."""
    name = "sharding-propagation"

    def run(self, module: Module) -> bool:
        if module.entry is None:
            return False
        if not any(_leaves(i.sharding) for i in module.entry.instructions):
            return False   # nothing is sharded: the module is not an SPMD program
        changed = Inline().run(module)
        changed |= _unshare_loop_computations(module)
        n = num_devices(module)
        prop = _Propagator(n)
        cur, tuples = prop.run(module.entry)
        changed |= _annotate(module.entry, cur, tuples)
        for comp in module.computations:
            if id(comp) in prop.done:
                bcur, btuples = prop.done[id(comp)]
                changed |= _annotate(comp, bcur, btuples)
        for inst in module.all_instructions():       # the loop state, everywhere it is
            if inst.opcode == "while" and id(inst) in prop.loops:
                s = Sharding.tuple([t.to_sharding() for t in prop.loops[id(inst)]])
                for i in (inst, inst.attrs["body"].parameters[0], inst.attrs["body"].root,
                          inst.attrs["condition"].parameters[0]):
                    if i.sharding != s:
                        i.attrs["sharding"] = s
                        changed = True
        if n > 1 and not module.config.get("num_partitions"):
            module.config["num_partitions"] = n
            changed = True
        return changed


def _unshare_loop_computations(module: Module) -> bool:
    """Give every while its own body and condition (a body shared by two loops could need
    two shardings)."""
    seen: set[int] = set()
    changed = False
    for inst in list(module.all_instructions()):
        if inst.opcode != "while":
            continue
        for key in ("body", "condition"):
            c = inst.attrs[key]
            if id(c) in seen:
                inst.attrs[key] = module.clone_computation(c)
                changed = True
            seen.add(id(inst.attrs[key]))
    return changed


__all__ = ["ShardingPropagation", "propagate", "num_devices", "manual_region", "SpmdError"]
