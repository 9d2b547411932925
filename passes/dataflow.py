"""Dataflow and aliasing: which array values of a module share one buffer.

A *position* is one array leaf of one instruction's result: ``(instruction, shape index)``.
Some instructions define new values at their positions (an ``add``, a ``fusion``, a
``constant``, an entry ``parameter``); others only name values defined elsewhere:

- ``tuple`` / ``get-tuple-element``: leaf ``(i,)+rest`` of a tuple is leaf ``rest`` of operand i;
- ``bitcast``: the operand's bytes, reinterpreted (same buffer);
- ``while``: init, body parameter, body root, condition parameter and the while's result are
  one loop-carried buffer per leaf (the body updates the state in place);
- ``conditional``: every branch root and the conditional's result share a buffer; branch
  parameters are the conditional's operands;
- ``call``: callee parameters are the arguments, the callee root is the call's result;
- asynchronous collectives: a ``*-done`` is its start's result buffer, and a start's
  element 0 is its operands (alive until the done, as the collective reads them).

``Dataflow(module)`` groups positions into ``BufferSet``s with a union-find (XLA's HloBuffer:
values that must live in one place). Fusion bodies and reducer computations (``to_apply``)
are not looked into: they run inside one kernel, their intermediates are not buffers.

``copy-insertion`` adds the copies that make those must-share groups safe (XLA's
CopyInsertion): a loop state may not start as an entry parameter or a constant, a body may
not swap state leaves, an entry result may not be a parameter or a constant (unless it was
donated), and so on. ``in-place`` sharing (an operand buffer reused by its user when it dies
there) is decided later by buffer assignment, once the schedule is known, under
``can_share_operand_buffer`` (XLA's rule: only where no other element is read first).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

from hlo.attrs import Raw
from hlo.ir import Computation, Instruction, Module
from hlo.ops import ELEMENTWISE
from hlo.shape import AnyShape, Shape, leaf_paths, subshape

from .base import register_pass

Index = tuple[int, ...]
Position = tuple[Instruction, Index]

# Computations that run as part of one instruction's kernel; not analysed for buffers.
_KERNEL_COMPUTATION_ATTRS = ("calls", "to_apply", "select", "scatter", "comparator")


def array_leaves(shape: AnyShape) -> Iterator[tuple[Index, Shape]]:
    """(index, shape) of each leaf that holds bytes (arrays; tokens hold none)."""
    for index, s in leaf_paths(shape):
        if s.is_array:
            yield index, s


def leaf_bytes(shape: Shape) -> int:
    return shape.byte_size if shape.is_array else 0


@dataclass(eq=False)
class BufferSet:
    """Positions that must share one buffer (XLA's HloBuffer)."""
    id: int
    positions: list[Position] = field(default_factory=list)

    @property
    def size(self) -> int:
        return max((leaf_bytes(subshape(i.shape, ix)) for i, ix in self.positions), default=0)

    def defining(self) -> list[Position]:
        """The positions whose instruction writes the buffer (not views, not pass-throughs)."""
        return [(i, ix) for i, ix in self.positions if defines_value(i)]

    def __repr__(self) -> str:
        names = ", ".join(f"%{i.name}{'{' + ','.join(map(str, ix)) + '}' if ix else ''}"
                          for i, ix in self.positions[:4])
        more = f", +{len(self.positions) - 4}" if len(self.positions) > 4 else ""
        return f"BufferSet#{self.id}({names}{more})"


_VIEW_OPS = {"tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
             "optimization-barrier", "all-reduce-done", "all-gather-done",
             "collective-permute-done", "async-done"}
# Asynchronous pairs: a done is its start's result buffer (XLA's aliasing); a start's
# element 0 is its operands, so they stay alive while the collective reads them.
_DONE_OF_RESULT = {"all-reduce-done": (), "all-gather-done": (1,),
                   "collective-permute-done": (1,), "async-done": (1,)}
_START_HOLDS_OPERANDS = ("all-gather-start", "collective-permute-start", "async-start")


def defines_value(inst: Instruction) -> bool:
    """Whether ``inst`` writes new bytes at its positions (False for views/pass-throughs)."""
    if inst.opcode == "parameter":
        return inst.parent is not None and inst.parent.is_entry
    if inst.opcode == "bitcast":
        return not _bitcast_is_view(inst)
    return inst.opcode not in _VIEW_OPS


def _bitcast_is_view(inst: Instruction) -> bool:
    src = inst.operands[0].shape
    return (not src.is_tuple and not inst.shape.is_tuple
            and src.byte_size == inst.shape.byte_size)


class Dataflow:
    """Positions of every analysed computation, grouped into BufferSets."""

    def __init__(self, module: Module):
        self.module = module
        self._parent: dict[tuple[int, Index], tuple[int, Index]] = {}
        self._pos: dict[tuple[int, Index], Position] = {}
        self.computations: list[Computation] = []
        self._visit(module.entry)
        groups: dict[tuple[int, Index], BufferSet] = {}
        self.sets: list[BufferSet] = []
        self._set_of: dict[tuple[int, Index], BufferSet] = {}
        for key, pos in self._pos.items():
            root = self._find(key)
            bs = groups.get(root)
            if bs is None:
                bs = groups[root] = BufferSet(len(self.sets))
                self.sets.append(bs)
            bs.positions.append(pos)
            self._set_of[key] = bs

    # --- union-find ---------------------------------------------------------------------
    def _key(self, inst: Instruction, index: Index) -> tuple[int, Index]:
        key = (id(inst), index)
        if key not in self._parent:
            self._parent[key] = key
            self._pos[key] = (inst, index)
        return key

    def _find(self, key: tuple[int, Index]) -> tuple[int, Index]:
        while self._parent[key] != key:
            self._parent[key] = self._parent[self._parent[key]]
            key = self._parent[key]
        return key

    def _union(self, a: Position, b: Position) -> None:
        ra, rb = self._find(self._key(*a)), self._find(self._key(*b))
        if ra != rb:
            self._parent[rb] = ra

    def _union_leaves(self, a: Instruction, a_prefix: Index, b: Instruction, b_prefix: Index,
                      shape: AnyShape) -> None:
        for index, _ in array_leaves(shape):
            self._union((a, a_prefix + index), (b, b_prefix + index))

    # --- walking ------------------------------------------------------------------------
    def _visit(self, comp: Computation) -> None:
        if comp in self.computations:
            return
        self.computations.append(comp)
        for inst in comp.instructions:
            for index, _ in array_leaves(inst.shape):
                self._key(inst, index)
            self._alias(inst)

    def _alias(self, inst: Instruction) -> None:
        op = inst.opcode
        if op == "tuple":
            for i, o in enumerate(inst.operands):
                self._union_leaves(inst, (i,), o, (), o.shape)
        elif op == "get-tuple-element":
            self._union_leaves(inst, (), inst.operands[0], (inst.attrs["index"],), inst.shape)
        elif op == "optimization-barrier":
            # The barrier only orders computation; its result is its operand's buffers.
            self._union_leaves(inst, (), inst.operands[0], (), inst.shape)
        elif op == "bitcast" and _bitcast_is_view(inst):
            self._union((inst, ()), (inst.operands[0], ()))
        elif op in _DONE_OF_RESULT:
            self._union_leaves(inst, (), inst.operands[0], _DONE_OF_RESULT[op], inst.shape)
        elif op in _START_HOLDS_OPERANDS and inst.shape.is_tuple:
            held = inst.shape.elements[0]
            if held.is_tuple:
                for k, o in enumerate(inst.operands):
                    self._union_leaves(inst, (0, k), o, (), o.shape)
            else:
                self._union_leaves(inst, (0,), inst.operands[0], (), held)
        elif op == "while":
            body, cond = inst.attrs["body"], inst.attrs["condition"]
            self._visit(body)
            self._visit(cond)
            init = inst.operands[0]
            for other, prefix in ((init, ()), (body.parameters[0], ()), (body.root, ()),
                                  (cond.parameters[0], ())):
                self._union_leaves(inst, (), other, prefix, inst.shape)
        elif op == "conditional":
            branches = (list(inst.attrs["branch_computations"])
                        if "branch_computations" in inst.attrs
                        else [inst.attrs["true_computation"], inst.attrs["false_computation"]])
            for b, operand in zip(branches, inst.operands[1:]):
                self._visit(b)
                self._union_leaves(b.parameters[0], (), operand, (), operand.shape)
                self._union_leaves(inst, (), b.root, (), inst.shape)
        elif op == "call":
            callee = inst.attrs["to_apply"]
            self._visit(callee)
            for p, a in zip(callee.parameters, inst.operands):
                self._union_leaves(p, (), a, (), a.shape)
            self._union_leaves(inst, (), callee.root, (), inst.shape)

    # --- queries ------------------------------------------------------------------------
    def buffer_set(self, inst: Instruction, index: Index = ()) -> BufferSet:
        return self._set_of[(id(inst), index)]

    def positions(self, inst: Instruction) -> list[tuple[Index, BufferSet]]:
        return [(ix, self._set_of[(id(inst), ix)]) for ix, _ in array_leaves(inst.shape)]

    def uses(self, bs: BufferSet) -> list[Instruction]:
        """Instructions that read the buffer (users of its positions that are not views)."""
        out: list[Instruction] = []
        for inst, _ in bs.positions:
            for u in inst.users:
                if u not in out:
                    out.append(u)
        return out

    def sets_of(self, inst: Instruction) -> list[BufferSet]:
        """The distinct sets of ``inst``'s leaves, in leaf order."""
        out: list[BufferSet] = []
        seen: set[int] = set()      # ids: a list's ``in`` was quadratic in a tuple's leaves
        for _, bs in self.positions(inst):
            if bs.id not in seen:
                seen.add(bs.id)
                out.append(bs)
        return out


# --- in-place sharing --------------------------------------------------------------------
# Whether a user may write its result over the buffer of an operand that dies at it (XLA's
# HloDataflowAnalysis::CanShareOperandBufferWithUser, with XLA:GPU's fusion hint). Our
# numpy kernels compute a whole result before writing it, so any same-sized operand would
# do for them; a parallel GPU kernel does not: an output that overwrites an input which
# other programs still read at other indices (a transpose, a reduction over a row, a
# broadcast, a slice, a reverse, the passes of a normalization) reads clobbered values.
# Buffer assignment therefore only shares where every element of the operand is read at
# the output's own index, by the program that writes it, or where the op updates the
# operand in place by design.

def in_place_pairs(inst: Instruction) -> list[tuple[int, Index]]:
    """(operand number, result index) pairs that ``inst`` updates in place by design (XLA's
    GetInPlaceInputOutputPairs): dynamic-update-slice writes into operand 0, a scatter of N
    inputs into operands 0..N-1, and a fusion whose root (or root tuple element) is one of
    these into the operand behind the fused parameter feeding that slot, when the slot is
    the parameter's only use (XLA:GPU's condition: nothing else reads what is overwritten)."""
    op = inst.opcode
    if op == "dynamic-update-slice":
        return [(0, ())]
    if op == "scatter":
        n = (len(inst.operands) - 1) // 2
        return [(i, (i,)) for i in range(n)] if inst.shape.is_tuple else [(0, ())]
    if op != "fusion":
        return []
    root = inst.attrs["calls"].root
    outputs = ([((k,), r) for k, r in enumerate(root.operands)] if root.opcode == "tuple"
               else [((), root)])
    out: list[tuple[int, Index]] = []
    for out_index, r in outputs:
        if r.opcode not in ("dynamic-update-slice", "scatter"):
            continue
        for k, r_index in in_place_pairs(r):
            source = r.operands[k]
            if source.opcode == "parameter" and source.users == [r] and \
                    sum(o is source for o in r.operands) == 1 and (not r_index or not out_index):
                out.append((source.parameter_number, out_index + r_index))
    return out


def _layout_of(shape: Shape):
    return shape.layout.minor_to_major if shape.layout is not None \
        else tuple(range(len(shape.dims) - 1, -1, -1))


def same_iteration_space(a: AnyShape, b: AnyShape) -> bool:
    """Two arrays whose elements sit at the same byte offsets: same dims, same physical
    layout (unassigned = row-major), same element width. The element type may differ (a
    convert between f32 and s32 writes each element where it read it), as XLA:GPU allows."""
    return (a.is_array and b.is_array and not a.is_tuple and not b.is_tuple
            and a.dims == b.dims and a.dtype.itemsize == b.dtype.itemsize
            and _layout_of(a) == _layout_of(b))


def reads_at_same_index(fusion: Instruction, param: int, output: int,
                        single_pass: bool = False, memo: Optional[dict] = None) -> bool:
    """Whether fused parameter ``param`` reaches fused output ``output``, and no other
    output, only through elementwise ops (and as operand 0 of a dynamic-update-slice), with
    the same dims and layout as the output: then each output element is written by the
    program that read the same element of the parameter, after reading it, so the output may
    be written over the parameter's buffer by a parallel kernel.

    ``single_pass``: the kernel computes every output in the one pass that reads the
    parameter (a loop kernel), so other outputs the parameter reaches elementwise do not
    read it again after ``output`` was written: they may share its index too (an optimizer
    step's moment feeds both the new moment and the new parameter).

    ``memo``: a dict the caller keeps while the fusion does not change; the walk from a
    parameter (which outputs it reaches, and whether only elementwise) is made once per
    parameter there, whatever the output asked about."""
    comp = fusion.attrs["calls"]
    root = comp.root
    outs = list(root.operands) if root.opcode == "tuple" else [root]
    p = next((q for q in comp.parameters if q.parameter_number == param), None)
    if p is None or output >= len(outs):
        return False
    if not p.shape.is_array or p.shape.is_tuple or outs[output].shape.is_tuple or \
            _layout_of(p.shape) != _layout_of(outs[output].shape) or \
            p.shape.dims != outs[output].shape.dims:
        return False
    key = (id(comp), param)
    walked = memo.get(key) if memo is not None else None
    if walked is None:
        walked = _walk_elementwise(p, outs, root)
        if memo is not None:
            memo[key] = walked
    if walked is False:
        return False
    reached = walked
    return reached == {output} or (single_pass and output in reached)


def _walk_elementwise(p: Instruction, outs: list[Instruction], root: Instruction
                      ) -> Union[set[int], bool]:
    """The outputs (positions in ``outs``) that parameter ``p`` reaches, or False when a
    user on the way is not elementwise over ``p``'s dims (nor a dynamic-update-slice into
    it)."""
    reached: set[int] = set()
    stack, seen = [p], {id(p)}
    while stack:
        v = stack.pop()
        for k, o in enumerate(outs):
            if o is v:
                reached.add(k)
        for u in v.users:
            if u.opcode == "tuple" and u is root:
                continue
            same = (u.op.category == ELEMENTWISE and u.shape.dims == p.shape.dims) or (
                u.opcode == "dynamic-update-slice" and u.operands[0] is v and
                all(o is not v for o in u.operands[1:]))
            if not same:
                return False
            if id(u) not in seen:
                seen.add(id(u))
                stack.append(u)
    return reached


def can_share_operand_buffer(user: Instruction, operand_number: int, user_index: Index = (),
                             slots: Optional[list[int]] = None,
                             memo: Optional[dict] = None,
                             pairs: Optional[list[tuple[int, Index]]] = None,
                             result: Optional[AnyShape] = None) -> bool:
    """Whether leaf ``user_index`` of ``user``'s result may be written over the buffer of
    operand ``operand_number`` (XLA's CanShareOperandBufferWithUser; buffer assignment still
    checks that the operand dies at ``user`` and that the sizes match).

    - dynamic-update-slice (operand 0), scatter (operands 0..N-1) and fusions rooted at
      them update that operand in place by design;
    - an elementwise op reads each operand element at the index it writes;
    - a fusion may share where ``reads_at_same_index`` holds for the fused parameter;
    - sort permutes operand i into result i in place, when it is the operand's only user;
    - an all-reduce reduces operand k into result k in place;
    - nothing else: it reads the operand at other indices than it writes.

    ``slots``: the operand numbers holding the same value as ``operand_number`` (found
    here when not given; ``in_place_operand_candidates`` finds them once per user).
    ``memo``: ``reads_at_same_index``'s, kept by the caller while ``user`` is unchanged.
    ``pairs``, ``result``: ``in_place_pairs(user)`` and the result leaf's shape, when the
    caller has them (``in_place_operand_candidates``: once per user, not per pair).
    """
    operand = user.operands[operand_number]
    if operand.opcode == "constant" or operand.shape.is_tuple or not operand.shape.is_array:
        return False
    if result is None:
        result = subshape(user.shape, user_index)
    if not same_iteration_space(operand.shape, result):
        return False
    # Every operand slot holding this value must be safe: fusion(a, a) reads a through two
    # fused parameters, and an in-place op may not also read its target as an update.
    if slots is None:
        slots = [k for k, o in enumerate(user.operands) if o is operand]
    if (operand_number, user_index) in (in_place_pairs(user) if pairs is None else pairs):
        return len(slots) == 1
    if user.opcode == "fusion":
        root = user.attrs["calls"].root
        if root.opcode == "tuple":
            if len(user_index) != 1:
                return False
            output = user_index[0]
        elif user_index:
            return False
        else:
            output = 0
        return all(reads_at_same_index(user, k, output, memo=memo) for k in slots)
    if user.opcode == "sort":
        if operand.users != [user] or len(slots) != 1:
            return False
        return len(user.operands) == 1 or user_index == (operand_number,)
    if user.opcode in ("all-reduce", "all-reduce-start"):
        # Reduced where it lies (NCCL's all-reduce works in place): result k over operand k.
        return len(slots) == 1 and (user_index == (operand_number,) if user.shape.is_tuple
                                    else user_index == ())
    return user.op.category == ELEMENTWISE and not user.shape.is_tuple


# The ops can_share_operand_buffer may say yes for besides elementwise ones and those with
# in-place pairs.
_MAY_SHARE = frozenset({"fusion", "sort", "all-reduce", "all-reduce-start"})


def in_place_operand_candidates(inst: Instruction) -> list[tuple[Index, int]]:
    """(result index, operand number) pairs where the result may take over the operand's
    buffer if the operand dies at ``inst``: ``can_share_operand_buffer`` over every array
    leaf of the result and every operand."""
    out: list[tuple[Index, int]] = []
    pairs = in_place_pairs(inst)          # once per instruction, not per (leaf, operand)
    if not pairs and inst.opcode not in _MAY_SHARE and (
            inst.op.category != ELEMENTWISE or inst.shape.is_tuple):
        # can_share_operand_buffer says no to every pair of such an op (a tuple, a
        # transpose...): not asked leaf by operand (the entry's root tuple of the Adam step,
        # 73 x 73 pairs, was 90% of its buffer assignment's questions)
        return out
    # Each operand's slots, once (a fusion of many operands and outputs asked for them per
    # pair, quadratic in its operands: ~0.5 s of an AdamW step's buffer assignment).
    slots: dict[int, list[int]] = {}
    for k, o in enumerate(inst.operands):
        slots.setdefault(id(o), []).append(k)
    memo: dict = {}      # a fusion's walk from each parameter, once (not per output leaf)
    for index, leaf in array_leaves(inst.shape):
        for k, o in enumerate(inst.operands):
            if can_share_operand_buffer(inst, k, index, slots[id(o)], memo, pairs, leaf):
                out.append((index, k))
    return out


# --- copy insertion ----------------------------------------------------------------------
def _reorder(comp: Computation) -> None:
    """New instructions were appended; put the list back in an operands-first order."""
    comp.instructions[:] = comp.post_order()


def _owns_buffer(comp: Computation, v: Instruction, user: Instruction) -> bool:
    """``v`` defines a fresh buffer that only ``user`` reads (so ``user`` may take it).
    The computation's root is read by the caller too, even when nothing inside uses it
    (a dead loop after the root in the list still must not update it in place)."""
    return (defines_value(v) and v.opcode not in ("parameter", "constant")
            and not v.shape.is_tuple and v.users == [user] and v is not comp.root)


def _readers(comp: Computation, param_leaf: tuple[Instruction, Index]) -> list[Instruction]:
    """Instructions of ``comp`` that read leaf ``index`` of ``param`` (through views)."""
    param, index = param_leaf
    out: list[Instruction] = []
    stack: list[tuple[Instruction, Index]] = [(param, index)]
    while stack:
        inst, ix = stack.pop()
        for u in inst.users:
            if u.opcode == "get-tuple-element":
                k = u.attrs["index"]
                if ix[:1] == (k,):
                    stack.append((u, ix[1:]))
                elif not ix:
                    out.append(u)   # reads a tuple containing the leaf: a view of it
                continue
            if u.opcode == "tuple":
                for i, o in enumerate(u.operands):
                    if o is inst:
                        stack.append((u, (i,) + ix))
                if u is comp.root:
                    continue
            elif u.opcode == "bitcast":
                stack.append((u, ix))
            if u not in out:
                out.append(u)
    return out


def insert_copies(module: Module, donated_outputs: Optional[dict[Index, int]] = None) -> bool:
    """Add the copies that let loop state, branch results and entry outputs own buffers."""
    changed = False
    for comp in list(module.reachable_computations()):
        if comp.fusion_instruction is not None:
            continue
        for inst in list(comp.instructions):
            if inst.opcode == "while":
                changed |= _copy_while(comp, inst)
            elif inst.opcode == "conditional":
                branches = (list(inst.attrs["branch_computations"])
                            if "branch_computations" in inst.attrs
                            else [inst.attrs["true_computation"], inst.attrs["false_computation"]])
                for b in branches:
                    changed |= _copy_root_leaves(b, lambda v, ix: False)
            elif inst.opcode == "call":
                # A callee's root leaf that is one of its parameters (or appears twice) would
                # make the call's result alias its argument: a while body that permutes its
                # state through a call would then give two state elements one buffer.
                changed |= _copy_root_leaves(inst.attrs["to_apply"], lambda v, ix: False)
    entry = module.entry
    aliased = donated_outputs if donated_outputs is not None else output_aliases(module)
    changed |= _copy_entry_root(entry, aliased)
    return changed


def _leaf_value(inst: Instruction, index: Index) -> tuple[Instruction, Index]:
    """Follow tuples/get-tuple-elements to the instruction that provides a leaf."""
    while True:
        if inst.opcode == "tuple" and index:
            inst, index = inst.operands[index[0]], index[1:]
        elif inst.opcode == "get-tuple-element":
            inst, index = inst.operands[0], (inst.attrs["index"],) + index
        elif inst.opcode in _DONE_OF_RESULT:
            inst, index = inst.operands[0], _DONE_OF_RESULT[inst.opcode] + index
        else:
            return inst, index


def _through_views(v: Instruction, vix: Index) -> tuple[Instruction, Index]:
    """The instruction whose buffer an array leaf views (same bytes, another shape)."""
    while v.opcode == "bitcast" and not vix and _bitcast_is_view(v):
        v = v.operands[0]
    return v, vix


def _copy_root_leaves(comp: Computation, needs_copy, through_views: bool = False) -> bool:
    """Rebuild ``comp``'s root so that each leaf needing it is a fresh copy. With
    ``through_views`` a leaf that is a bitcast of a fresh buffer owns that buffer (the
    entry's outputs: a fusion computed in [n, m, 1] and returned as [n, m] needs no copy)."""
    root = comp.root
    leaves = list(array_leaves(root.shape))
    seen: dict[tuple[int, Index], int] = {}
    need: set[Index] = set()

    def leaf(ix: Index) -> tuple[Instruction, Index]:
        v, vix = _leaf_value(root, ix)
        return _through_views(v, vix) if through_views else (v, vix)
    for ix, _ in leaves:
        v, vix = leaf(ix)
        key = (id(v), vix)
        seen[key] = seen.get(key, 0) + 1
    for ix, _ in leaves:
        v, vix = leaf(ix)
        # A leaf may stay as it is when it appears once and its buffer belongs to this
        # computation: defined here (not a parameter or constant), or the state of a loop /
        # the result of a conditional (whose own copies made them owned).
        owned = (seen[(id(v), vix)] == 1 and v.opcode not in ("parameter", "constant")
                 and (defines_value(v) or v.opcode in ("while", "conditional")))
        if owned and not needs_copy(v, ix):
            continue
        need.add(ix)
    if not need:
        return False
    comp.root = _rebuild(comp, root, (), need)
    _drop_if_dead(comp, root)
    _reorder(comp)
    return True


def _drop_if_dead(comp: Computation, old: Instruction) -> None:
    """Remove a replaced root/init tuple nobody uses any more."""
    while old.opcode in ("tuple", "get-tuple-element") and not old.users and old is not comp.root:
        operands = list(old.operands)
        comp.remove_instruction(old)
        if len(operands) != 1:
            break
        old = operands[0]


def _rebuild(comp: Computation, value: Instruction, prefix: Index, need: set[Index]) -> Instruction:
    """``value`` with the leaves in ``need`` (paths from the root) replaced by copies."""
    if not any(n[:len(prefix)] == prefix for n in need):
        return value
    if not value.shape.is_tuple:
        return comp.add_instruction(Instruction("copy", [value], value.shape))
    parts = []
    for i, s in enumerate(value.shape.elements):
        if value.opcode == "tuple":
            part = value.operands[i]
        else:
            part = comp.add_instruction(Instruction("get-tuple-element", [value], s, {"index": i}))
        parts.append(_rebuild(comp, part, prefix + (i,), need))
    return comp.add_instruction(Instruction("tuple", parts, value.shape))


def _copy_while(comp: Computation, w: Instruction) -> bool:
    changed = False
    body = w.attrs["body"]
    param = body.parameters[0]

    # Body: root leaf i must be leaf i of the parameter passed through, or a state-update
    # copy written after every read of the old state leaf.
    root = body.root
    need: set[Index] = set()
    counts: dict[tuple[int, Index], int] = {}
    for ix, _ in array_leaves(root.shape):
        v, vix = _leaf_value(root, ix)
        counts[(id(v), vix)] = counts.get((id(v), vix), 0) + 1
    for ix, _ in array_leaves(root.shape):
        v, vix = _leaf_value(root, ix)
        if v is param and vix == ix and counts[(id(v), vix)] == 1:
            continue   # unchanged state leaf: no copy
        if v.opcode == "copy" and len(v.users) == 1 and counts[(id(v), vix)] == 1 \
                and v.control_predecessors:
            continue   # already a state-update copy
        if counts[(id(v), vix)] == 1 and _update_in_place(body, v, vix, param, ix):
            continue   # the state leaf updated where it lies (a scan's stacked outputs)
        need.add(ix)
    if need:
        passthrough = {ix for ix in need if _leaf_value(root, ix)[0].opcode == "parameter"}
        body.root = _rebuild(body, root, (), need)
        _drop_if_dead(body, root)
        # A leaf that is another state leaf passed through (a rotation of the state) is
        # first copied out into a temporary: the state copies then never read state.
        for ix in passthrough:
            c, _ = _leaf_value(body.root, ix)
            early = body.add_instruction(Instruction("copy", [c.operands[0]], c.shape))
            c.replace_operand(0, early)
        # Each state-update copy overwrites leaf ix of the state: every reader of the old
        # state leaf must run first (a control edge, as XLA's copy insertion adds).
        for ix in need:
            c, _ = _leaf_value(body.root, ix)
            for r in _readers(body, (param, ix)):
                if r is not c and r not in c.control_predecessors and not _depends_on(r, c):
                    c.control_predecessors.append(r)
        _reorder(body)
        changed = True

    # Init: every leaf must be a buffer only the loop uses.
    init = w.operands[0]
    need_init: set[Index] = set()
    counts = {}
    for ix, _ in array_leaves(init.shape):
        v, vix = _leaf_value(init, ix)
        counts[(id(v), vix)] = counts.get((id(v), vix), 0) + 1
    for ix, _ in array_leaves(init.shape):
        v, vix = _leaf_value(init, ix)
        holder = init if (init.opcode == "tuple" and len(ix) == 1) else None
        if not vix and holder is not None and _owns_buffer(comp, v, holder) \
                and counts[(id(v), vix)] == 1 and init.users == [w]:
            continue
        need_init.add(ix)
    if need_init:
        new_init = _rebuild(comp, init, (), need_init)
        w.replace_operand(0, new_init)
        _drop_if_dead(comp, init)
        _reorder(comp)
        changed = True
    return changed


def _update_in_place(body: Computation, v: Instruction, vix: Index, param: Instruction,
                     ix: Index) -> bool:
    """Whether body root leaf ``ix``, leaf ``vix`` of ``v``, may be written over state leaf
    ``ix`` itself, with no state-update copy: ``v`` may take that leaf's buffer
    (``in_place_operand_candidates``: a dynamic-update-slice writes into it by design, an
    elementwise op or fusion reads each element where it writes it) reading it directly,
    only the root reads ``v``, and every other reader of the old leaf can run before ``v``
    (control edges are added here, as for a copy). XLA keeps a scan's stacked outputs and
    accumulated gradients the same way; with copies, each of an LSTM's 128 steps moved
    every stack twice and copied its weight gradients."""
    if not v.users or any(u is not body.root and u.opcode != "tuple" for u in v.users):
        return False
    state = None
    for r_index, k in in_place_operand_candidates(v):
        if r_index == vix and _leaf_value(v.operands[k], ()) == (param, ix):
            state = v.operands[k]
    if state is None:
        return False
    readers = [r for r in _readers(body, (param, ix)) if r is not v and r is not state]
    if any(_depends_on(r, v) for r in readers):
        return False       # something reads the old leaf after the update: keep the copy
    for r in readers:
        if r not in v.control_predecessors:
            v.control_predecessors.append(r)
    return True


def _depends_on(a: Instruction, b: Instruction) -> bool:
    """Whether ``a`` (transitively) uses ``b``."""
    stack, seen = [a], set()
    while stack:
        x = stack.pop()
        if x is b:
            return True
        if id(x) in seen:
            continue
        seen.add(id(x))
        stack.extend(x.operands)
        stack.extend(x.control_predecessors)
    return False


def donated_output_writer(entry: Computation, ix: Index) -> Optional[Instruction]:
    """The instruction that writes entry output ``ix`` into its donated parameter's buffer:
    the output's own defining instruction, or the multi-output fusion whose element it is
    (an optimizer step updates parameter, moments... in one fusion). None where the output
    cannot take the parameter's buffer (a view, a parameter, a constant, an element of
    another tuple-producing op)."""
    v, vix = _leaf_value(entry.root, ix)
    if not defines_value(v) or v.opcode in ("parameter", "constant"):
        return None
    if vix and (v.opcode != "fusion" or len(vix) != 1):
        return None
    return v


def _copy_entry_root(entry: Computation, aliased: dict[Index, int]) -> bool:
    """Entry outputs own their buffers: no parameter, constant or repeated value, except
    for outputs aliased with a donated parameter, which are written last into it."""
    changed = _copy_root_leaves(entry, lambda v, ix: False, through_views=True)
    for ix, pnum in aliased.items():
        param = entry.parameters[pnum]
        v = donated_output_writer(entry, ix)
        if v is None:
            continue
        for r in _readers(entry, (param, ())):
            if r is not v and r not in v.control_predecessors and not _depends_on(r, v):
                v.control_predecessors.append(r)
                changed = True
    if changed:
        _reorder(entry)
    return changed


@register_pass
@dataclass(frozen=True)
class CopyInsertion:
    """Adds the copies buffer assignment needs (loop state, branch results, entry outputs)."""
    name = "copy-insertion"

    def run(self, module: Module) -> bool:
        return insert_copies(module)


# --- input/output aliasing (donated arguments) --------------------------------------------
def parse_input_output_alias(text: str) -> dict[Index, int]:
    """``{ {0}: (1, {}, may-alias), {1}: (0, {}, must-alias) }`` -> {(0,): 1, (1,): 0}."""
    import re
    out: dict[Index, int] = {}
    for o, p, pix in re.findall(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}", text):
        if pix.strip():
            continue   # aliasing into a tuple parameter's leaf: not produced by hlotk
        out[tuple(int(i) for i in o.replace(" ", "").split(",") if i)] = int(p)
    return out


def format_input_output_alias(pairs: dict[Index, int]) -> Raw:
    """XLA's spelling: ``{ {0}: (1, {}, may-alias) }``."""
    items = ", ".join("{" + ",".join(map(str, o)) + "}" + f": ({p}, {{}}, may-alias)"
                      for o, p in sorted(pairs.items()))
    return Raw("{ " + items + " }")


def output_aliases(module: Module) -> dict[Index, int]:
    """Output index -> parameter number from the header's ``input_output_alias``."""
    raw = module.config.get("input_output_alias")
    if raw is None:
        return {}
    return parse_input_output_alias(str(getattr(raw, "text", raw)))
