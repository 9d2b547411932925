"""The ``fusion`` pass: normalization groups, then a policy's fusions, then the rewrite.

``fusion{policy=priority,target=h100,max_operands=96}`` in a pipeline spec.
``library_dots=f32+f64`` keeps dots on those operand types out of every fusion: the CUDA
pipeline sets it for the types cuBLAS runs faster than a generated GEMM. ``policy`` is a
registered name (priority, greedy, none) or ``module:Class``; a policy object can be given
in Python (``Fusion(policy=MyPolicy())``). ``target`` names a device spec of the cost model
(h100, h200, a100, or one a user registered). ``chains=false`` turns off the pre-pass that
merges elementwise trees before priority fusion ranks (chains.py; the same kernels, fewer
rounds). After the pass, ``report_for(module)`` holds the decision log.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hlo.dtypes import BY_NAME
from hlo.ir import Computation, Instruction, Module

from ..base import PassError, register_pass
from . import greedy, priority  # noqa: F401  (register the built-in policies)
from .cost_model import count_kernels, get_device, predict, resolve_target
from .attention_pass import find_attention, form_attention_group
from .chains import premerge_chains
from .explain import FusionDecision, FusionReport, attach
from .kinds import fusion_kind
from .legality import Decision, can_duplicate, can_fuse_siblings, can_merge, fusible
from .normalization import form_groups
from .policy import Candidate, FusionPolicy, estimates, resolve_policy
from .rewrite import FusionState, Group, materialize

# Called computations that are scalar functions (reducers, comparators), not programs.
_SCALAR_BODIES = ("to_apply", "select", "scatter")


def fusion_roots(module: Module) -> list[Computation]:
    """Computations whose instructions become kernels: the entry and control-flow bodies."""
    scalar: set[int] = set()
    for comp in module.computations:
        for inst in comp.instructions:
            for key in _SCALAR_BODIES:
                c = inst.attrs.get(key)
                if isinstance(c, Computation) and inst.opcode not in ("call",):
                    scalar.add(id(c))
    return [c for c in module.reachable_computations()
            if c.fusion_instruction is None and id(c) not in scalar]


def _edges(c: Candidate) -> list[tuple[str, str]]:
    if c.action == "sibling":
        return [(c.producer.label, c.consumer.label)]
    out = []
    for g in c.consumers:
        for u in g.instances():
            for o in u.operands:
                if o in c.producer.members:
                    out.append((o.name, u.name))
    return out or [(c.producer.label, c.consumer.label)]


def check(c: Candidate, state: FusionState, max_operands: int, max_size: int) -> Decision:
    if c.action == "merge":
        return can_merge(state, c.producer, c.consumer, max_operands, max_size)
    if c.action == "sibling":
        return can_fuse_siblings(state, c.producer, c.consumer, max_operands, max_size)
    for g in c.consumers:
        d = can_duplicate(state, c.producer, g, max_operands, max_size)
        if not d:
            return d
    return Decision(True, "legal")


def apply(c: Candidate, state: FusionState) -> Optional[Group]:
    """Apply ``c``; the group a merge or sibling fusion made (None for a duplicate)."""
    if c.action == "merge" or c.action == "sibling":
        return state.merge(c.producer, c.consumer)
    # one step for every consumer: what a duplicate per consumer gives, with the
    # producer's readers forgotten once (rewrite.FusionState.duplicate_all)
    state.duplicate_all(c.producer, list(c.consumers))
    return None


def run_policy(state: FusionState, policy: FusionPolicy, report: FusionReport,
               max_operands: int = 96, max_size: int = 256) -> int:
    """Apply the policy's best legal wanted candidate until none is left. Returns how many
    fusions were applied."""
    if ranks_by_group(policy):
        return run_ranked(state, policy, report, max_operands, max_size)
    said: dict[tuple, tuple[bool, str]] = {}
    edges_of: dict[tuple, list] = {}
    rejected: dict[tuple, Decision] = {}
    applied = 0
    while True:
        cands = list(policy.candidates(state))
        # Highest priority first, ties in the policy's order (k is unique: c is never
        # compared). A heap, popped until a candidate is taken (usually the first or the
        # second of ~300): the order sorting would give, without sorting the rest.
        scored = [(-policy.priority(c, state), k, c) for k, c in enumerate(cands)]
        heapq.heapify(scored)
        taken = None
        while scored:
            c = heapq.heappop(scored)[2]
            d = _decide(c, state, policy, rejected, max_operands, max_size)
            _log(report, said, c, state, d, edges_of)
            if d:
                taken = c
                break
        if taken is None:
            return applied
        apply(taken, state)
        applied += 1


def ranks_by_group(policy: FusionPolicy) -> bool:
    """Whether ``run_ranked`` may run ``policy``: its candidates and priorities are
    priority fusion's own (a subclass that changes either goes the general way)."""
    from .priority import PriorityPolicy
    return isinstance(policy, PriorityPolicy) and \
        type(policy).candidates is PriorityPolicy.candidates and \
        type(policy).priority is PriorityPolicy.priority


def run_ranked(state: FusionState, policy: FusionPolicy, report: FusionReport,
               max_operands: int = 96, max_size: int = 256,
               audit: Optional[Callable[[dict], None]] = None) -> int:
    """``run_policy``'s loop for priority fusion: the same decisions in the same order,
    without scoring every candidate after every fusion (issue 13: an AdamW step over 200
    arrays, 5,800 instructions, ~3,000 rounds x ~3,000 candidates: 35 s of fusion), and
    without estimating candidates that never come near the top (the Adam step: ~2,600
    candidates estimated, ~440 looked at).

    ``run_policy`` walks ``sorted((-priority, k))`` over one round's candidates (k: the
    position in the enumeration: each group's list, groups in the state's order, which is
    their ids' order, then the siblings): the order of (-priority, group id, index in the
    group's list). Here each live group keeps a heap of its candidates keyed so, with the
    exact priority or, until it is asked for, an upper bound of it
    (``PriorityPolicy.priority_bound``; a candidate without one is scored when its group
    is ranked), and one heap kept across rounds holds each group's top. A bound popped
    from it is replaced by the exact priority, in the group's heap; an exact entry popped
    is then the best of all candidates, as sorting would give (every other key is at most
    its candidate's priority, ties broken by (group id, index) alike), and the group's
    next one takes its place. A group is ranked again (its heap made anew) when
    ``FusionState.changed`` names it (made, its candidate list dropped, or estimates naming
    it dropped by a duplicate): nothing else changes a priority, so a bound stays valid
    while its heap lives. Where the last fusion was a merge that only replaced some of the
    group's consumers, its ranking is deferred: it keeps one entry bounding all its
    candidates and is ranked when that entry reaches the top (below, ``defer``). Exact
    entries popped and not taken go back after the round.
    Siblings are ranked the same way in a heap of their own, and come after the groups'
    candidates of equal priority; the round's sibling heap is last round's while
    ``sibling_stamp`` and the state's epoch say the siblings are the same. ``audit``:
    called each round with group id -> (candidate list, exact priority or bound per
    candidate, which are exact, the group's heap, its consumers when ranked); a deferred
    group's is (None, None, None, [(-bound, -1, False)], that count) (tests)."""
    from .policy import group_candidates, sibling_candidates, sibling_stamp
    said: dict[tuple, tuple[bool, str]] = {}
    edges_of: dict[tuple, list] = {}
    rejected: dict[tuple, Decision] = {}
    bound = getattr(policy, "priority_bound", None)
    last_stamp: Optional[tuple] = None
    scored: list[tuple] = []
    # A group candidate keyed at most this (-priority) comes before every sibling, whose
    # priority is its benefit less SIBLING_PENALTY and its benefit at most the two groups'
    # times: the round's siblings are not even listed while the best group candidate is
    # such (-inf: always listed). PriorityPolicy.sibling_floor says why it holds.
    floor = getattr(policy, "sibling_floor", None)
    above_siblings = floor(state) if floor is not None else float("-inf")
    # group id -> [candidate list, key value per candidate (-priority or -bound), whether
    #              that value is exact, the group's heap of (value, index, exact)]
    ranked: dict[int, list] = {}
    # (-priority or -bound, group id, index, exact, seq, entry): each group's top, when it
    # was pushed (an entry is live while it is still its group's top); seq keeps entries
    # of one position apart (the entry lists are never compared).
    heap: list[tuple] = []
    seq = itertools.count()

    def push_top(gid: int, entry: list) -> None:
        if entry[3]:
            value, j, exact = entry[3][0]
            heapq.heappush(heap, (value, gid, j, exact, next(seq), entry))

    def rank(gid: int, g: Group) -> None:
        cands = group_candidates(state, g)
        values: list[float] = []
        exact: list[bool] = []
        for c in cands:
            ub = bound(c, state) if bound is not None else None
            values.append(-policy.priority(c, state) if ub is None else -ub)
            exact.append(ub is None)
        gheap = [(values[j], j, exact[j]) for j in range(len(cands))]
        heapq.heapify(gheap)
        entry = ranked[gid] = [cands, values, exact, gheap, len(state.consumers(g))]
        push_top(gid, entry)

    # Deferred ranking. After a merge or sibling fusion made group n out of a and b, a
    # group p feeding them is ranked again (its consumers changed) although only a and b
    # left its consumers and n came: its other candidates and their values are as they
    # were (a merge changes no other group's outputs, so no estimate or bound). Its
    # candidates are then at most its kept top, the bound of merge(p, n) and that of its
    # duplicate (PriorityPolicy.new_consumer_bound): p keeps one entry of that value
    # (index -1, before its own candidates on ties) and is ranked when it comes to the
    # top, if ever (adamw_200: a bias correction read by 200 arrays' kernels, listed anew
    # whenever one of them fused: ~1,100 rankings of 201 candidates, each a duplicate
    # estimate over 400 kernels). Its consumers are at most as many as when it was
    # ranked: if n reads p, a or b did (n holds p's value iff one of them did).
    new_bound = getattr(policy, "new_consumer_bound", None)

    def defer(gid: int, g: Group, made: Group) -> bool:
        kept = ranked.get(gid)
        if kept is None or new_bound is None:
            return False
        ub = new_bound(g, made, kept[4], state)
        if ub is None:
            return False
        if kept[3]:
            ub = max(ub, -kept[3][0][0])
        entry = ranked[gid] = [None, None, None, [(-ub, -1, False)], kept[4]]
        push_top(gid, entry)
        return True

    applied = 0
    made: Optional[Group] = None       # the group the last fusion made (merge, sibling)
    while True:
        for gid in state.take_changed():
            g = state.groups.get(gid)
            if g is None:
                ranked.pop(gid, None)
                continue
            if made is None or gid == made.id or not defer(gid, g, made):
                rank(gid, g)
        if audit is not None:
            audit(ranked)
        siblings: Optional[list] = None if policy.siblings else []  # type: ignore[attr-defined]
        popped: list[tuple] = []      # this round's exact entries not taken: back after it
        taken = None
        while True:
            while heap:
                top = heap[0]
                entry = ranked.get(top[1])
                if entry is top[5] and entry[3] and entry[3][0][1] == top[2] \
                        and entry[3][0][2] == top[3]:
                    break
                heapq.heappop(heap)   # a group gone or ranked again, or not its top now
            if heap and not heap[0][3]:
                # A bound on top: the candidate's priority, in its place.
                _, gid, j, _, _, entry = heapq.heappop(heap)
                if j < 0:      # a deferred group's: rank it now
                    rank(gid, state.groups[gid])
                    continue
                heapq.heappop(entry[3])
                value = entry[1][j] = -policy.priority(entry[0][j], state)
                entry[2][j] = True
                heapq.heappush(entry[3], (value, j, True))
                push_top(gid, entry)
                continue
            if siblings is None and not (heap and heap[0][0] <= above_siblings):
                # The round's siblings, scored again only when a value they come from has
                # other group readers or a duplicate dropped estimates (the epoch): else
                # they are last round's, whose priorities come from the same estimates.
                stamp = (state.epoch, sibling_stamp(state))
                if stamp != last_stamp:
                    # (-priority or -bound, position, exact, candidate), as the groups'
                    scored = []
                    for s, c in enumerate(sibling_candidates(state)):
                        ub = bound(c, state) if bound is not None else None
                        scored.append((-policy.priority(c, state), s, True, c) if ub is None
                                      else (-ub, s, False, c))
                    heapq.heapify(scored)
                    last_stamp = stamp
                siblings = list(scored)
            if heap and (not siblings or heap[0][0] <= siblings[0][0]):
                _, gid, j, _, _, entry = heapq.heappop(heap)
                popped.append((gid, entry, heapq.heappop(entry[3])))
                push_top(gid, entry)          # the group's next candidate
                c = entry[0][j]
            elif siblings:
                if not siblings[0][2]:
                    # A sibling's bound on top (a group candidate at least as high would
                    # have been taken first): its priority, in its place.
                    _, s, _, c = heapq.heappop(siblings)
                    heapq.heappush(siblings, (-policy.priority(c, state), s, True, c))
                    continue
                c = heapq.heappop(siblings)[3]
            else:
                break
            d = _decide(c, state, policy, rejected, max_operands, max_size)
            _log(report, said, c, state, d, edges_of)
            if d:
                taken = c
                break
        if taken is None:
            return applied
        for gid, entry, item in popped:
            if ranked.get(gid) is entry:
                heapq.heappush(entry[3], item)
                push_top(gid, entry)
        made = apply(taken, state)
        applied += 1


def _decide(c: Candidate, state: FusionState, policy: Any, rejected: dict,
            max_operands: int, max_size: int) -> Decision:
    """Legality, then the policy's verdict on ``c``; a "no" is remembered for the rest of
    this epoch (nothing it depends on changes until a fusion is applied)."""
    key = c.key + (state.epoch,)
    d = rejected.get(key)
    if d is None:
        d = check(c, state, max_operands, max_size)
        if d:
            d = policy.should_fuse(c, state)
        if not d:
            rejected[key] = d
    return d


def _log(report: FusionReport, said: dict, c: Candidate, state: FusionState, d: Decision,
         edges_of: Optional[dict] = None) -> None:
    """Record ``c``'s edges whose last recorded verdict was another. ``edges_of``: candidate
    key -> its edges, kept by the caller: they depend on the candidate's groups only, which
    never change (the loop looks at a rejected candidate again every round it comes
    before the one taken; a GPT training step: ~37,000 looks)."""
    reason = d.reason if not d.ok else f"fused ({c.action})"
    if edges_of is None:
        edges = _edges(c)
    else:
        edges = edges_of.get(c.key)
        if edges is None:
            edges = edges_of[c.key] = _edges(c)
    for pair in edges:
        if said.get(pair) == (d.ok, reason):
            continue
        said[pair] = (d.ok, reason)
        apart, together = estimates(c, state)
        report.record(FusionDecision(pair[0], pair[1], d.ok, c.action, reason,
                                     apart.time_us, together.time_us, state.comp.name))


def library_dot_rule(library_dots: frozenset[str]) -> Callable[[Instruction], Decision]:
    """``fusible`` with dots on ``library_dots`` operand types kept whole: they run as library
    calls (cuBLAS), which read plain buffers, so nothing fuses into or after them. Their
    neighbours then fuse with each other instead (a bias add and the ReLU after it become one
    loop kernel), as in XLA:GPU, whose gemm rewriter takes such dots before fusion."""
    def rule(inst: Instruction) -> Decision:
        if inst.opcode == "dot" and library_dots and any(
                o.shape.dtype.name in library_dots for o in inst.operands):
            types = "/".join(sorted({o.shape.dtype.name for o in inst.operands}))
            return Decision(False, f"a {types} dot is a library call on this target "
                                   "(library_dots): it fuses with nothing")
        return fusible(inst)
    return rule


def fuse_computation(comp: Computation, policy: FusionPolicy, target: str, report: FusionReport,
                     max_operands: int = 96, max_size: int = 256,
                     normalization: bool = True,
                     library_dots: frozenset[str] = frozenset(), attention: bool = True,
                     split_gemms: bool = False, chains: bool = True) -> int:
    spec = get_device(target)
    rule = library_dot_rule(library_dots)
    verdicts: dict[int, Decision] = {}

    def may_fuse(inst: Instruction) -> Decision:
        # once per instruction: asked for each of its edges and by the state
        d = verdicts.get(id(inst))
        if d is None:
            d = verdicts[id(inst)] = rule(inst)
        return d
    matches = find_attention(comp.instructions, report, backward=True) if attention else []
    # Dots of an attention are one kernel with it, whatever library_dots says.
    in_attention = {id(i) for m in matches for i in m.members}
    state = FusionState(comp, spec,
                        fusible=lambda i: id(i) in in_attention or bool(may_fuse(i)))
    state.split_gemms = split_gemms
    for inst in comp.instructions:
        for o in inst.operands:
            report.edges[(o.name, inst.name)] = False
            if id(o) in in_attention and id(inst) in in_attention:
                continue
            d, who = may_fuse(o), o
            if d:
                d, who = may_fuse(inst), inst
            if not d:
                report.record(FusionDecision(o.name, inst.name, False, "none",
                                             f"%{who.name} is not fusible: {d.reason}",
                                             computation=comp.name))
    for m in matches:
        form_attention_group(state, m, report)
    if normalization and getattr(policy, "normalization", True):
        form_groups(state, report, max_operands=max_operands, max_size=max_size)
    if chains:
        premerge_chains(state, policy, report, max_operands, max_size)
    run_policy(state, policy, report, max_operands, max_size)
    # Which unfused edges ended inside one kernel.
    for inst in comp.instructions:
        g = state.group_of(inst)
        for o in inst.operands:
            h = state.group_of(o)
            same = (g is not None and h is g and len(g.instances()) > 1) or (
                g is not None and o in g)
            copied = any(o in state.groups[gid] for gid in state.copy_in.get(id(inst), ()))
            report.edges[(o.name, inst.name)] = same or copied
    fusions = materialize(state)
    # The state's tables (groups, candidates, estimates) refer to each other in cycles: let
    # reference counting free them now instead of the cyclic collector later (issue 13: ~54K
    # objects after an AdamW step over 200 arrays, which the next collections would walk).
    state.__dict__.clear()
    return len(fusions)


@register_pass
@dataclass(frozen=True)
class Fusion:
    """Fuse instructions into kernels (XLA's priority fusion by default)."""
    name = "fusion"
    policy: Any = "priority"
    target: str = "h100"
    max_operands: int = 96
    max_size: int = 256
    normalization: bool = True
    # Scaled dot-product attention as one flash-attention fusion (passes/fusion/attention.py).
    attention: bool = True
    # Operand types ('+'-separated, e.g. f32+f64) whose dots stay unfused library calls.
    library_dots: str = ""
    # The backend runs GEMM fusions whose dot its GEMM template cannot tile as prologue
    # kernels + a library GEMM + an epilogue kernel: price them so (split_gemm.py).
    split_gemms: bool = False
    # Elementwise chains merged before the ranked loop (chains.py): the same kernels,
    # fewer rounds; false runs priority fusion on single instructions (tests compare).
    chains: bool = True

    def run(self, module: Module) -> bool:
        policy = resolve_policy(self.policy)
        spec = get_device(self.target)
        report = FusionReport(target=spec.key, policy=getattr(policy, "name", str(policy)))
        library = frozenset(t for t in self.library_dots.split("+") if t)
        unknown = sorted(library - set(BY_NAME))
        if unknown:
            raise PassError(f"fusion{{library_dots={self.library_dots}}}: unknown element "
                            f"type {unknown[0]!r}; known: {', '.join(BY_NAME)}")
        report.kernels_before = count_kernels(module)
        before = predict(module, spec)
        report.time_before_us, report.bytes_before = before.time_us, before.bytes_moved
        made = 0
        for comp in fusion_roots(module):
            made += fuse_computation(comp, policy, spec.key, report, self.max_operands,
                                     self.max_size, self.normalization, library,
                                     self.attention, self.split_gemms, self.chains)
            # Small constants are copied into every fusion that reads them (XLA does the
            # same); the originals left without readers go.
            comp.remove_dead()
        if self.split_gemms:
            _record_library_epilogues(module, report)
        after = predict(module, spec)
        report.kernels_after = count_kernels(module)
        report.time_after_us, report.bytes_after = after.time_us, after.bytes_moved
        attach(module, report)
        return made > 0


def _record_library_epilogues(module: Module, report: FusionReport) -> None:
    """One line per GEMM fusion whose rest cuBLASLt applies as its epilogue (explain-fusion
    lists them: the decisions alone do not say how the fused GEMM runs)."""
    from .split_gemm import fusion_epilogue
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode != "fusion" or fusion_kind(inst) in ("attention", "attention_backward"):
                continue
            lib = fusion_epilogue(inst)
            if lib is not None:
                dot = next(i for i in inst.attrs["calls"].instructions if i.opcode == "dot")
                report.record(FusionDecision(
                    dot.name, "-", True, "library-epilogue",
                    f"one cuBLASLt GEMM with the {lib.label} epilogue (%{inst.name})",
                    computation=comp.name))


def with_target(spec: str, target: str | None) -> str:
    """``spec`` with ``target=<target>`` given to every pass that has a ``target`` option
    (fusion, layout-assignment ...) and does not name one already."""
    import dataclasses
    import re

    from ..base import PASSES
    if not target or not spec:
        return spec
    target = resolve_target(target)     # a device file registers its device, by key
    get_device(target)          # an unknown target fails here, naming the known ones
    names = [n for n, cls in PASSES.items()
             if any(f.name == "target" for f in dataclasses.fields(cls))]
    if not names:
        return spec
    pat = re.compile(r"(?<![\w\-.])(" + "|".join(re.escape(n) for n in names)
                     + r")(?![\w\-.])(\{[^}]*\})?")

    def add(m: re.Match) -> str:
        opts = m.group(2)
        if opts is None:
            return f"{m.group(1)}{{target={target}}}"
        if re.search(r"[{,]\s*target\s*=", opts):
            return m.group(0)
        inner = opts[1:-1].strip()
        return f"{m.group(1)}{{{inner + ',' if inner else ''}target={target}}}"
    return pat.sub(add, spec)
