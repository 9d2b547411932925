"""Elementwise chains merged before priority fusion ranks anything (issue 13).

An optimizer step is hundreds of same-shape elementwise ops in short trees (Adam over 24
arrays: ~380 instructions, ~350 fusions, each of which re-ranks its neighbours in
``pass_.run_ranked``). Most of those fusions are certain from the start: a producer whose
only reader is an elementwise consumer of the same shape. This pass merges such trees into
one group each, in one walk, before the ranked loop starts; the loop then ranks the trees
instead of their instructions.

Why the loop would make these merges anyway (for an edge P -> C of a tree: P and C
elementwise of the same dims, C the only reader of P but for the output tuple):
- profitable whenever it is looked at: where every group is priced by
  ``estimate_kernel`` (no dot, convolution or tensor-core work in the computation, so no
  split-GEMM pricing), the fused kernel reads at most what both read, writes at most what
  both write less P's value where only C read it, and its arithmetic is the sum: its time
  is at most the two apart less one launch, so the benefit is positive, above
  ``min_benefit_us`` (0), and ``should_fuse`` says yes. A positive merge comes before
  every sibling candidate (their priority is less 1e9), so every tree edge is looked at
  before any sibling fusion while it is legal.
- legal whenever it is looked at, in a computation without reductions, scatters,
  transposes that are heroes, in-place updates and normalization or attention groups
  (every group is a loop fusion):
  * multi-output dims: P's group writes P (C is outside it) so, being legal, all its
    outputs have P's dims; so do C's group's where the component (below) holds only
    instructions of those dims and scalars cannot be outputs beside them (that group
    was legal): every output of the merged group has them;
  * ``max_size``: the broadcasts this pass copies are in no group afterwards (only
    copies of them), so until a sibling fusion a group's instances are distinct
    instructions of one *part* (the component's members but those broadcasts, joined by
    data edges: the trees one member that stays joins), the broadcasts copied into it,
    and scalars (only a scalar's broadcast joins two components or parts); the pass runs
    only where that count is at most ``max_size`` for every part of the component (an
    optimizer step's same-shape arrays form one component of hundreds of members through
    the broadcasts of its constants; its parts are single trees);
  * ``max_operands``: bounded for every group made of whole trees (with copies and
    scalars): its inputs are the part's, its copies' and the scalars' outside operands
    and exposed values (tree roots, tree nodes the output tuple reads, scalars) of other
    trees, its outputs its own exposed values, each exposed value on one side only; the
    pass runs only where outside operands + exposed values are at most ``max_operands``
    for every part.
  * no cycle: trees of a component meet only through broadcasts of scalars and nothing
    but the output tuple reads the component from outside (``_independent``), so a path
    leaving P's group through a broadcast it took in leads only into other trees' groups,
    and from them only to the output tuple, while no group holds parts of two trees.
    A broadcast of a constant or parameter is never merged into a reader (its duplicate
    is legal and at least as profitable as any of its merges, and listed first on ties),
    so it never joins two trees; the loop copies it too. So is a broadcast of a computed
    scalar (a kernel's value) that other instructions read too (an optimizer's bias
    correction, broadcast once per shape): the scalar cannot be merged into it first
    (the merged group would write the scalar beside the array: outputs of other dims).
  NOT proven: that a broadcast of a computed scalar read by that broadcast alone (left
  to the loop: the scalar may be merged into it first) is never merged into two trees'
  groups, joining them (the cycle rule could then refuse a tree edge); that the loop
  copies a broadcast of a computed scalar read elsewhere before it merges it into a
  reader (its duplicate saves the broadcast's kernel and write; a merge keeps both);
  ``max_operands`` for a group holding part of a tree (each piece may add its top as an
  output and its children's tops as inputs). None happens in any program tested
  (adam_step's kernels have 9 operands; the loop copied adamw_200's bias-correction
  broadcasts into every array's kernel in its first rounds).
- Scalars computed from arrays (a key's element sliced out and bitcast to rank 0) turn the
  pass off: the loop copies such views into their readers in an order the trees change
  (zoo:rng_threefry_exact's kernels differed).
Merging the trees first changes the order of the loop's other fusions; that it does not
change the final kernels is checked, not proven: benchmarks/passes_identity.py (75
programs) and tests/test_fusion_chains.py, tests/test_fusion_scale.py. The merges are
logged with their own reason, without predicted times (nothing was estimated).
"""
from __future__ import annotations

from hlo.ir import Instruction
from hlo.ops import ELEMENTWISE

from .explain import FusionDecision, FusionReport
from .legality import is_hero
from .rewrite import FusionState, Group

REASON = ("fused (merge): an elementwise chain, each producer read only by its consumer of "
          "the same shape; merged before ranking (chains.py)")


COPY_REASON = ("fused (duplicate): a broadcast of a scalar read by several kernels, recomputed "
               "in each; before ranking (chains.py)")


def _elementwise(inst: Instruction) -> bool:
    return inst.op.category == ELEMENTWISE and inst.shape.is_array


def applicable(state: FusionState, policy: object) -> bool:
    """Whether the computation and policy are ones the argument above covers."""
    from .priority import PriorityPolicy
    if type(policy) is not PriorityPolicy or policy.min_benefit_us > 0.0:  # type: ignore[attr-defined]
        return False
    if state.kernel_ceiling_us() is None:
        return False      # a dot, convolution or tensor-core op: pricing may be split
    for g in state.groups.values():
        if g.kind or len(g.members) != 1 or g.copies or g.reads:
            return False  # a normalization or attention group was formed
        i = g.members[0]
        if is_hero(i) or i.opcode in ("dynamic-update-slice", "scatter") or \
                not i.shape.is_array:
            return False
        # Scalars computed from arrays (a slice's element, a bitcast to rank 0): cheap
        # views the loop copies into readers in an order the trees change (a threefry
        # step's fused kernels differed); only scalars made of scalars are covered.
        if i.shape.rank == 0 and any(o.shape.rank != 0 for o in i.operands):
            return False
    return True


def _joined(nodes: list[Instruction]) -> list[list[Instruction]]:
    """``nodes`` joined by the data edges between them (union-find), each part in
    ``nodes``' order."""
    parent = {id(i): id(i) for i in nodes}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for i in nodes:
        for o in i.operands:
            if id(o) in parent:
                a, b = find(id(i)), find(id(o))
                if a != b:
                    parent[a] = b
    out: dict[int, list[Instruction]] = {}
    for i in nodes:
        out.setdefault(find(id(i)), []).append(i)
    return list(out.values())


def _components(state: FusionState) -> list[list[Instruction]]:
    """Fusible instructions of rank > 0 joined by the data edges between them (rank-0
    values are where the components are cut)."""
    insts = [g.members[0] for g in state.groups.values()]
    return _joined([i for i in insts if i.shape.rank > 0])


def _homogeneous(members: list[Instruction]) -> bool:
    """One dims for all, and only elementwise ops and broadcasts (the multi-output
    argument in the module docstring)."""
    dims = members[0].shape.dims
    return all(i.shape.dims == dims and (_elementwise(i) or i.opcode == "broadcast")
               for i in members)


def _parts(members: list[Instruction], copied: set[int]) -> list[list[Instruction]]:
    """The members but the broadcasts in ``copied`` (ids), joined by the data edges between
    them: once those broadcasts are copied into their readers, no edge of the graph joins
    two parts but through a scalar (the module docstring), so until a sibling fusion each
    group of the component holds members of one part."""
    return _joined([i for i in members if id(i) not in copied])


def _bounded(state: FusionState, part: list[Instruction], copies: list[Instruction],
             scalars: list[Instruction], max_operands: int, max_size: int) -> bool:
    """Whether every possible group of a part (the module docstring says why these bound
    any group holding its members) fits the limits: instances, at most the part, the
    broadcasts copied into it and the scalars; inputs, at most the values they read from
    outside; outputs, at most the members that are not internal tree nodes and the
    scalars."""
    if len(part) + len(copies) + len(scalars) > max_size:
        return False
    instances = part + copies + scalars
    inside = {id(i) for i in instances}
    inputs = {id(o) for i in instances for o in i.operands if id(o) not in inside}
    root = state.comp.root
    # Tree roots, tree nodes the output tuple reads, scalars: of a group made of whole
    # trees, each is inside it (then maybe an output) or outside (then maybe an input).
    exposed = sum(1 for i in part if not _internal(state, i) or root in i.users) \
        + len(scalars)
    return len(inputs) + exposed <= max_operands


def _independent(state: FusionState, members: list[Instruction],
                 tree_root: dict[int, Instruction]) -> bool:
    """The trees of a component meet only through broadcasts of scalars, and nothing but
    the output tuple reads the component from outside it: then no path leaves a tree's
    group and comes back into another group of the same tree except through its own
    edges (the cycle rule never refuses a tree edge, whatever producers a tree member's
    group took in first)."""
    inside = {id(i) for i in members}
    root = state.comp.root
    for m in members:
        if m.opcode == "broadcast":
            if m.operands[0].shape.rank != 0:
                return False
        else:
            r = tree_root[id(m)]
            for o in m.operands:
                if id(o) in inside and o.opcode != "broadcast" and tree_root[id(o)] is not r:
                    return False
        for u in m.users:
            if id(u) not in inside and u is not root:
                return False
    return True


def _internal(state: FusionState, inst: Instruction) -> bool:
    """``inst`` is a non-root tree node: read by one elementwise instruction of its dims
    (its tree parent) and otherwise only by the computation's root (an output)."""
    return _parent(state, inst) is not None


def _parent(state: FusionState, inst: Instruction) -> Instruction | None:
    root = state.comp.root
    if inst is root or not _elementwise(inst):
        return None
    parent = None
    for u in inst.users:
        if u is root and root.opcode == "tuple":
            continue
        if parent is not None and u is not parent:
            return None
        parent = u
    if parent is None or parent.parent is not state.comp or not _elementwise(parent) or \
            state.group_of(parent) is None or parent.shape.dims != inst.shape.dims:
        return None
    return parent


def premerge_chains(state: FusionState, policy: object, report: FusionReport,
                    max_operands: int = 96, max_size: int = 256) -> int:
    """Merge every elementwise tree (module docstring) of ``state`` into one group, log
    each edge, and return how many instructions joined a tree's root."""
    if not applicable(state, policy):
        return 0
    scalars = [g.members[0] for g in state.groups.values() if g.members[0].shape.rank == 0]
    merged = 0
    for members in _components(state):
        if len(members) < 2 or not _homogeneous(members):
            continue
        # Each internal node's tree root: its reader's, walking readers (the members are
        # in program order, so a reader's root is known when it is reached backwards).
        root: dict[int, Instruction] = {}
        trees: dict[int, list[Instruction]] = {}
        for inst in reversed(members):
            u = _parent(state, inst)
            if u is not None:
                r = root.get(id(u), u)
            else:
                r = inst
            root[id(inst)] = r
            trees.setdefault(id(r), []).append(inst)
        if not _independent(state, members, root):
            continue
        # The limits bound each part (trees joined by members that are not copied), not
        # the component: the same-shape arrays of an optimizer step share broadcasts of
        # its constants (adamw_200: 1,215 members of dims (384,), ~10 per part).
        copied = {id(b): b for b in members if _copy_readers(state, b, root) is not None}
        if not all(_bounded(state, part, _read_copies(part, copied), scalars, max_operands,
                            max_size) for part in _parts(members, set(copied))):
            continue
        # Broadcasts first, into the single instructions (forgetting one instruction's
        # readers per copy instead of a whole tree's); "several readers" counts trees,
        # the kernels the loop would see. Each tree's group then takes its members' copies.
        for b in members:
            merged += _copy_broadcast(state, report, b, root)
        for tree in reversed(list(trees.values())):     # roots in program order
            if len(tree) < 2:
                continue
            groups = [state.group_of(i) for i in reversed(tree)]
            state.merge_all([g for g in groups if g is not None])
            for inst in tree[1:]:
                report.record(FusionDecision(inst.name, _parent(state, inst).name, True, "merge",
                                             REASON, computation=state.comp.name))
            merged += len(tree) - 1
    return merged


def _read_copies(part: list[Instruction], copied: dict[int, Instruction]) -> list[Instruction]:
    """The broadcasts of ``copied`` that members of ``part`` read (copies in its groups)."""
    seen: dict[int, Instruction] = {}
    for i in part:
        for o in i.operands:
            if id(o) in copied:
                seen.setdefault(id(o), o)
    return list(seen.values())


def _copy_readers(state: FusionState, b: Instruction,
                  tree_root: dict[int, Instruction]) -> dict[int, Group] | None:
    """The groups ``_copy_broadcast`` copies ``b`` into (by id), or None where it leaves
    ``b`` alone."""
    if b.opcode != "broadcast" or b.operands[0].shape.rank != 0 or state.group_of(b) is None:
        return None
    if state.group_of(b.operands[0]) is not None and len(_unique_users(b.operands[0])) < 2:
        return None       # a kernel's scalar read by b alone: the loop may merge it into b
    root = state.comp.root
    readers: dict[int, Group] = {}
    trees: set[int] = set()
    for u in b.users:
        h = state.group_of(u)
        if h is None or u is root or id(u) not in tree_root:
            return None
        readers.setdefault(h.id, h)
        trees.add(id(tree_root[id(u)]))
    return readers if len(trees) >= 2 else None


def _copy_broadcast(state: FusionState, report: FusionReport, b: Instruction,
                    tree_root: dict[int, Instruction]) -> int:
    """Recompute ``b``, a broadcast of a value that is no kernel's (a parameter, a small
    constant), in every instruction reading it, when they are in several trees and nothing
    else reads it: priority fusion's duplicate of it is profitable (the broadcast's kernel
    and its write go, each reader reads the scalar instead of the array, and a broadcast
    adds no arithmetic), legal in a bounded part (it adds an instance and swaps an
    input), and comes before its merges into single readers (which keep the write)."""
    readers = _copy_readers(state, b, tree_root)
    g = state.group_of(b)
    if readers is None or g is None:
        return 0
    state.duplicate_all(g, list(readers.values()))
    for u in _unique_users(b):
        report.record(FusionDecision(b.name, u.name, True, "duplicate", COPY_REASON,
                                     computation=state.comp.name))
    return 1


def _unique_users(inst: Instruction) -> list[Instruction]:
    return list({id(u): u for u in inst.users}.values())
