"""The mechanics of fusion: groups of instructions that will become one kernel.

Fusion decisions are made on a ``FusionState``: every fusible instruction of a computation
starts in a group of its own; policies *merge* a producer group into a consumer group (if
the producer also has readers outside, the merged group becomes multi-output), *duplicate*
a cheap producer into a consumer (the copy is recomputed there; the original disappears
once nothing else reads it), or merge two *siblings* that read the same input. Nothing in
the IR changes until ``materialize`` builds one ``fusion`` instruction per group, with its
body in XLA's form: a ``fused_computation.N`` whose instructions are named after the
originals and whose parameters are ``param_0``, ``param_1``, ...
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Union

from hlo.attrs import Raw
from hlo.ir import Computation, Instruction
from hlo.shape import TupleShape

from .cost_model import (DeviceSpec, Estimate, KernelFacts, Work, array_bytes, elements,
                         estimate_kernel, external_reads, is_free, work_of)
from .kinds import FLASH_ATTENTION_CONFIG, TRITON_GEMM, TRITON_NORMALIZATION

_gids = itertools.count(1)

# Constants with at most this many elements are cloned into each fusion that reads them
# (XLA keeps big constants in their own buffers and reads them as parameters).
SMALL_CONSTANT_ELEMENTS = 64


@dataclass(eq=False)
class Group:
    """Instructions that will be one kernel: ``members`` are owned here, ``copies`` are
    cheap producers recomputed here whose original lives elsewhere (or nowhere)."""
    members: list[Instruction]
    copies: list[Instruction] = field(default_factory=list)
    kind: str = ""            # "" (derived from the contents), "normalization", "attention"
    config: str = ""          # backend_config text of a kCustom group that carries one
    # Values the kernel reads beyond its instructions' operands, appended as its last
    # operands (the attention backward reads the forward's output O for rowsum(dO∘O)).
    reads: list[Instruction] = field(default_factory=list)
    id: int = field(default_factory=lambda: next(_gids))
    # ids of the instances, made on the first ``in``: a group's contents never change once
    # it is made (a merge or a duplicate makes a new group), so it needs no invalidation.
    _ids: Optional[frozenset[int]] = field(default=None, init=False, repr=False)

    def instances(self) -> list[Instruction]:
        return self.members + self.copies

    def __contains__(self, inst: Instruction) -> bool:
        ids = self._ids
        if ids is None:
            ids = self._ids = frozenset(id(i) for i in self.members + self.copies)
        return id(inst) in ids

    @property
    def label(self) -> str:
        """The name a person recognizes: the last member (the group's root)."""
        return self.members[-1].name

    def __repr__(self) -> str:
        return f"<Group {self.id} [{', '.join(i.name for i in self.instances())}]>"


Node = Union[Group, Instruction]


class FusionState:
    """Groups over one computation, with the queries legality and cost need."""

    def __init__(self, comp: Computation, spec: DeviceSpec, fusible=None):
        self.comp = comp
        self.spec = spec
        self.order = {id(i): k for k, i in enumerate(comp.post_order())}
        self.groups: dict[int, Group] = {}
        self.home: dict[int, Group] = {}
        # inst id -> ids of the groups holding a copy, in insertion order (a set of group
        # ids would iterate in an order that depends on the ids' values: fusing a clone of
        # a module, whose groups get later ids, could order fusions differently).
        self.copy_in: dict[int, dict[int, None]] = {}
        self.dissolved: set[int] = set()
        self._estimates: dict[tuple, Estimate] = {}
        self._firsts: dict[int, int] = {}
        self._candidates: dict[tuple, tuple[Estimate, Estimate]] = {}
        self._candidates_of: dict[int, list[tuple]] = {}   # group id -> keys naming it
        # Ids of the groups made, or whose candidates or their estimates may have changed,
        # since the fusion loop last asked (pass_.run_ranked re-ranks exactly these): a
        # group's candidate list is made again only after ``_forget_readers_of`` drops it,
        # and cached candidate estimates are dropped only by a duplicate.
        self.changed: set[int] = set()
        self._big: dict[int, list[Instruction]] = {}
        self._consumers: dict[int, list[Node]] = {}
        self._node_estimates: dict[int, Estimate] = {}
        # group id -> the outputs its node estimate found (dropped with it): node_outputs
        self._node_outputs: dict[int, list[Instruction]] = {}
        # (producer id, consumer id) -> the consumer's kernel with the producer recomputed
        # in it (copy_estimate), and consumer id -> those keys
        self._copy_estimates: dict[tuple[int, int], Estimate] = {}
        self._copy_estimates_of: dict[int, list[tuple[int, int]]] = {}
        self._group_readers: dict[int, list[Group]] = {}      # inst id -> group_readers
        # min bytes -> (value id -> position among the values of at least that size, ids
        # of those read by two groups or more, ids of values whose group readers were
        # dropped since): shared_values
        self._shared: dict[int, tuple[dict[int, int], set[int], set[int]]] = {}
        # Bumped when shared_values looks again at a value whose group readers were dropped:
        # sibling candidates (pairs of those readers) are as they were while it and the
        # epoch stay (pass_.run_ranked keeps the round's scored siblings).
        self.shared_version = 0
        self._user_nodes: dict[int, list[Node]] = {}          # inst id -> user_nodes
        self._pc_candidates: dict[int, dict[tuple, list]] = {}  # group id -> flags -> list
        self.epoch = 0        # bumped when readers change in ways merges do not (duplicates)
        # Price groups whose dot the backend runs as library GEMM + loop kernels that way
        # (split_gemm.py; the Fusion pass's ``split_gemms`` option).
        self.split_gemms = False
        # candidate key -> whether it merges ops into a GEMM group (priority.py)
        self.gemm_merges: dict[tuple, bool] = {}
        # inst id -> its arithmetic (cost_model.work_of): the graph does not change while
        # the state lives (materialize rewrites it at the end), so it needs no invalidation.
        self._work: dict[int, Work] = {}
        # Per instruction, what estimate_kernel reads of it (cost_model.KernelFacts): valid
        # for the same reason as ``_work``.
        self._facts = KernelFacts(spec, SMALL_CONSTANT_ELEMENTS, self.work_of)
        self._summaries: dict[int, tuple] = {}     # group id -> _summary (contents fixed)
        self._instance_bytes: dict[int, int] = {}  # group id -> instance_bytes
        self._ceiling: Optional[tuple[Optional[float]]] = None   # kernel_ceiling_us
        # merge candidate key -> (the groups' own estimates it came from, its priority
        # bound) (priority.py)
        self.bounds: dict[tuple, tuple[Estimate, Estimate, float]] = {}
        # (group id, group id) -> the sibling Candidate of that pair (policy.py): a pair's
        # candidate is the same whatever round finds it (groups never change contents).
        self._siblings: dict[tuple[int, int], object] = {}
        # (producer id, consumer id) -> the merge Candidate of that pair (policy.py): the
        # same for the same pair whenever its producer's candidates are listed again.
        self._merges: dict[tuple[int, int], object] = {}
        # candidate key -> (the estimates it was computed from, priority) (priority.py)
        self.priorities: dict[tuple, tuple[tuple[Estimate, Estimate], float]] = {}
        for inst in comp.instructions:
            if fusible is None or fusible(inst):
                self._add(Group([inst]))

    # --- bookkeeping ------------------------------------------------------------------------
    def _add(self, g: Group) -> Group:
        g.members.sort(key=self.pos)
        g.copies.sort(key=self.pos)
        # The groups' order (candidates are enumerated in it) is their ids' order:
        # pass_.run_ranked breaks ties by id.
        if self.groups and next(reversed(self.groups)) > g.id:
            raise AssertionError(f"group {g.id} added after group {next(reversed(self.groups))}")
        self.groups[g.id] = g
        self.changed.add(g.id)
        for m in g.members:
            self.home[id(m)] = g
        for c in g.copies:
            self.copy_in.setdefault(id(c), {})[g.id] = None
        return g

    def _drop(self, g: Group) -> None:
        del self.groups[g.id]
        for c in g.copies:
            self.copy_in[id(c)].pop(g.id, None)

    def pos(self, inst: Instruction) -> int:
        return self.order.get(id(inst), -1)

    def group_of(self, inst: Instruction) -> Optional[Group]:
        return self.home.get(id(inst))

    def node_of(self, inst: Instruction) -> Node:
        return self.home.get(id(inst), inst)

    # --- graph queries ----------------------------------------------------------------------
    def user_nodes(self, inst: Instruction) -> list[Node]:
        """Every node (group or unfused instruction) holding an instance of a user of inst
        (do not modify the list). Cached as ``group_readers`` is: the nodes holding inst's
        users change only when a group holding one of them changes, and
        ``_forget_readers_of`` drops the entries of those groups' instances' operands."""
        out = self._user_nodes.get(id(inst))
        if out is None:
            out = self._user_nodes[id(inst)] = list(self._find_user_nodes(inst))
        return out

    def _find_user_nodes(self, inst: Instruction) -> Iterator[Node]:
        for u in inst.users:
            if u.parent is not self.comp:
                continue
            g = self.home.get(id(u))
            if g is not None:
                yield g
            elif id(u) not in self.dissolved:
                yield u
            for gid in self.copy_in.get(id(u), ()):
                yield self.groups[gid]

    def external_readers(self, inst: Instruction, inside: set[int]) -> list[Node]:
        """Nodes not in ``inside`` (group ids) that read inst's value from its home."""
        out = []
        for n in self.user_nodes(inst):
            if isinstance(n, Group):
                if n.id in inside or inst in n:
                    continue
            out.append(n)
        return out

    def outputs(self, members: Iterable[Instruction], inside: set[int]) -> list[Instruction]:
        """Members whose value is needed outside the groups ``inside``."""
        outs = []
        for m in members:
            if m is self.comp.root or self._read_outside(m, inside):
                outs.append(m)
        return outs

    def _read_outside(self, inst: Instruction, inside: set[int]) -> bool:
        """``bool(external_readers(inst, inside))``, stopping at the first reader."""
        for n in self.user_nodes(inst):
            if not isinstance(n, Group) or not (n.id in inside or inst in n):
                return True
        return False

    def external_inputs(self, instances: list[Instruction]) -> list[Instruction]:
        ids = {id(i) for i in instances}
        seen: dict[int, Instruction] = {}
        for i in instances:
            for o in i.operands:
                if id(o) not in ids and id(o) not in seen:
                    seen[id(o)] = o
        return list(seen.values())

    def consumers(self, g: Group) -> list[Node]:
        """Distinct nodes reading any of g's members from g (do not modify the list).

        Cached by group id: the fusion loop asks for every group's consumers after every
        fusion, and a fusion changes the readers of only the groups that feed it
        (``_forget_readers_of``)."""
        cached = self._consumers.get(g.id)
        if cached is not None:
            return cached
        seen: dict[int, Node] = {}
        for m in g.members:
            for n in self.external_readers(m, {g.id}):
                seen.setdefault(id(n), n)
        out = self._consumers[g.id] = list(seen.values())
        return out

    def _forget_readers_of(self, groups: Iterable[Group]) -> None:
        """Drop the cached consumers, node estimates and candidates of ``groups`` and of
        every group that feeds one of their instances, and the readers of those instances'
        operands (call before the groups change). A node's readers are the homes of its
        members' users and the groups holding copies of them (``user_nodes``): fusing or
        copying instances changes the readers of those instances' operands only."""
        for g in groups:
            self._consumers.pop(g.id, None)
            self._node_estimates.pop(g.id, None)
            self._node_outputs.pop(g.id, None)
            self._drop_copy_estimates(g.id)
            self._pc_candidates.pop(g.id, None)
            self.changed.add(g.id)
            for i in g.instances():
                for o in i.operands:
                    self._group_readers.pop(id(o), None)
                    for _, _, dropped in self._shared.values():
                        dropped.add(id(o))
                    self._user_nodes.pop(id(o), None)
                    h = self.home.get(id(o))
                    if h is not None:
                        self._consumers.pop(h.id, None)
                        self._node_estimates.pop(h.id, None)
                        self._node_outputs.pop(h.id, None)
                        self._drop_copy_estimates(h.id)
                        self._pc_candidates.pop(h.id, None)
                        self.changed.add(h.id)

    def group_readers(self, inst: Instruction) -> list[Group]:
        """The distinct groups holding an instance of a user of ``inst``, by their first
        instruction (do not modify the list). Cached as ``consumers`` is: fusing a group
        changes the readers of its instances' operands only."""
        out = self._group_readers.get(id(inst))
        if out is None:
            readers = [n for n in self.user_nodes(inst) if isinstance(n, Group)]
            out = self._group_readers[id(inst)] = sorted(
                {g.id: g for g in readers}.values(), key=self._first)
        return out

    def producers(self, g: Group) -> list[Node]:
        seen: dict[int, Node] = {}
        for o in self.external_inputs(g.instances()):
            n = self.node_of(o)
            seen.setdefault(id(n), n)
        return list(seen.values())

    def _successors(self, n: Node) -> Iterator[Node]:
        if isinstance(n, Group):
            for m in n.members:
                yield from self.external_readers(m, {n.id})
        else:
            yield from self.user_nodes(n)

    def _first(self, n: Node) -> int:
        if not isinstance(n, Group):
            return self.pos(n)
        first = self._firsts.get(n.id)     # a group's contents never change: cache by id
        if first is None:
            first = self._firsts[n.id] = min(self.pos(i) for i in n.instances())
        return first

    def _last(self, n: Node) -> int:
        return max(self.pos(i) for i in n.instances()) if isinstance(n, Group) else self.pos(n)

    def path_via_outside(self, a: Group, b: Group) -> Optional[Node]:
        """A node outside a and b on a path a -> ... -> b, or None (fusing them keeps the
        graph acyclic). Nodes that start after b's last instruction cannot reach b."""
        limit = self._last(b)
        stack = [n for n in self._successors(a) if n is not b]
        seen = {id(n) for n in stack}
        while stack:
            n = stack.pop()
            if self._first(n) > limit:
                continue
            for s in self._successors(n):
                if s is b:
                    return n
                if s is a or id(s) in seen:
                    continue
                seen.add(id(s))
                stack.append(s)
        return None

    def values_of_at_least(self, min_bytes: int) -> list[Instruction]:
        """The instructions (in program order) whose value has at least ``min_bytes``."""
        from .cost_model import array_bytes
        big = self._big.get(min_bytes)
        if big is None:
            big = self._big[min_bytes] = [i for i in self.comp.instructions
                                          if array_bytes(i.shape) >= min_bytes]
        return big

    def shared_values(self, min_bytes: int) -> list[Instruction]:
        """``values_of_at_least(min_bytes)`` read by two groups or more, in program order:
        the values sibling candidates come from. Kept across calls: a value's group readers
        change only when ``_forget_readers_of`` drops them, which marks the value to be
        looked at again (the fusion loop asks every round; most values have one reader)."""
        big = self.values_of_at_least(min_bytes)
        entry = self._shared.get(min_bytes)
        if entry is None:
            index = {id(i): k for k, i in enumerate(big)}
            entry = self._shared[min_bytes] = (index, set(), set(index))
        index, shared, dropped = entry
        for vid in dropped:
            k = index.get(vid)
            if k is not None:
                self.shared_version += 1      # a value's group readers may have changed
                if len(self.group_readers(big[k])) > 1:
                    shared.add(vid)
                else:
                    shared.discard(vid)
        dropped.clear()
        return [big[k] for k in sorted(index[v] for v in shared)]

    # --- cost -----------------------------------------------------------------------------
    def estimate(self, instances: list[Instruction], inside: set[int],
                 outs: Optional[list[Instruction]] = None) -> Estimate:
        """One kernel of ``instances`` writing its members (those whose home is a group in
        ``inside``) read outside ``inside``; ``outs``: those outputs, when the caller
        knows them (``merge_outputs``, ``node_outputs``)."""
        return self._estimate_outs(instances, inside, outs)[0]

    def merge_outputs(self, a: Group, b: Group) -> list[Instruction]:
        """``outputs(a.members + b.members, {a.id, b.id})`` from the two groups' own
        outputs: a member not written by its own group's kernel is read by no one outside
        it, so not outside both either (the same members, in the same order, looking at
        the readers of a few instead of all)."""
        inside = {a.id, b.id}
        root = self.comp.root
        return [m for g in (a, b) for m in self.node_outputs(g)
                if m is root or self._read_outside(m, inside)]

    def _estimate_outs(self, instances: list[Instruction], inside: set[int],
                       outs: Optional[list[Instruction]] = None
                       ) -> tuple[Estimate, list[Instruction]]:
        """``estimate``, and the members it found written (the kernel's outputs)."""
        if outs is None:
            home = self.home
            members = [i for i in instances
                       if (h := home.get(id(i))) is not None and h.id in inside]
            outs = self.outputs(members, inside)
        ids = frozenset(id(i) for i in instances)
        key = (ids, tuple(id(o) for o in outs))
        est = self._estimates.get(key)
        if est is None:
            # split_estimate prices groups holding one dot (None for any other group)
            if self.split_gemms and any(i.opcode == "dot" for i in instances):
                from .split_gemm import split_estimate
                est = split_estimate(instances, outs, self.spec, SMALL_CONSTANT_ELEMENTS)
            if est is None:
                # estimate_kernel(instances, outs, spec, SMALL_CONSTANT_ELEMENTS, work_of),
                # from each instruction's facts worked out once
                est = self._facts.estimate(instances, outs, ids)
            self._estimates[key] = est
        return est, outs

    def work_of(self, inst: Instruction) -> Work:
        """``cost_model.work_of(inst)``, once per instruction."""
        w = self._work.get(id(inst))
        if w is None:
            w = self._work[id(inst)] = work_of(inst)
        return w

    def candidate_estimates(self, key: tuple, compute: Callable[[], tuple[Estimate, Estimate]]
                            ) -> tuple[Estimate, Estimate]:
        """A candidate's (apart, together) estimates, by its key (action, group ids...).

        Cached: a group's contents never change (merging makes a new group), and a merge
        leaves the outputs, so the estimates, of every other group as they were. Only a
        duplicate changes readers of groups it does not replace; it drops what it touches.
        Without the cache the fusion loop re-estimates every candidate after every fusion
        (quadratic: 20-30 s at 900 instructions)."""
        est = self._candidates.get(key)
        if est is None:
            est = self._candidates[key] = compute()
            for gid in key[1:]:
                self._candidates_of.setdefault(gid, []).append(key)
        return est

    def _summary(self, g: Group) -> tuple:
        """(external reads: operand id -> [bytes, touched bytes summed over g's
        instances], flops and transcendentals of g's members, whether every instance is
        free, whether one is a dot), as estimate_kernel counts them. Cached by group id:
        a group's contents never change."""
        out = self._summaries.get(g.id)
        if out is None:
            facts = self._facts.facts
            # each instance once: the merged kernel holds each at least once
            instances = list({id(i): i for i in g.instances()}.values())
            ids = {id(i) for i in instances}
            reads = external_reads((facts(i)[1] for i in instances), ids)
            flops = trans = 0.0
            for m in g.members:
                w = facts(m)[2]
                flops += w.flops
                trans += w.transcendentals
            out = self._summaries[g.id] = (
                reads, ids, flops, trans, all(facts(i)[0] for i in instances),
                any(i.opcode == "dot" for i in instances))
        return out

    def instance_bytes(self, g: Group) -> int:
        """The bytes of the values of ``g``'s instances (priority.duplicate_bound): the most
        a kernel reading them saves when they are recomputed in it. Cached by group id (a
        group's contents never change)."""
        out = self._instance_bytes.get(g.id)
        if out is None:
            out = self._instance_bytes[g.id] = sum(array_bytes(i.shape) for i in g.instances())
        return out

    def merged_floor_us(self, a: Group, b: Group) -> float:
        """A lower bound of the predicted time of one kernel holding the instances of
        ``a`` and ``b`` (``estimate`` of a merge), without estimating it: what it must
        read (each outside value either group reads, at least as much as the one reading
        more of it reads), what it must write (``b``'s members read outside both; a
        dynamic-update-slice counted as writing nothing), the members' arithmetic, and a
        launch; 0 when everything is free or a dot may be priced split (split_gemm.py)."""
        ra, ids_a, flops_a, trans_a, free_a, dot_a = self._summary(a)
        rb, ids_b, flops_b, trans_b, free_b, dot_b = self._summary(b)
        if (free_a and free_b) or (self.split_gemms and (dot_a or dot_b)):
            return 0.0
        read = 0
        for oid, (cap, touched) in ra.items():
            if oid in ids_b:
                continue
            v = min(cap, touched)
            e = rb.get(oid)
            if e is not None:
                v = max(v, min(cap, e[1]))
            read += v
        for oid, (cap, touched) in rb.items():
            if oid not in ids_a and oid not in ra:
                read += min(cap, touched)
        written = 0
        inside = {a.id, b.id}
        root = self.comp.root
        for m in self.node_outputs(b):      # a member written apart is, if read elsewhere
            if m.opcode != "dynamic-update-slice" and (
                    m is root or self._read_outside(m, inside)):
                written += array_bytes(m.shape)
        spec = self.spec
        memory_us = (read + written) / spec.bytes_per_us
        compute_us = 0.0 + (flops_a + flops_b) / spec.cuda_rate("fp32") \
            + (trans_a + trans_b) / spec.sfu_ops_per_us
        return spec.kernel_launch_us + max(memory_us, compute_us)

    def kernel_ceiling_us(self) -> Optional[float]:
        """An upper bound of any group's own estimate in this computation, or None where
        an instruction is a dot or convolution or has tensor-core work (a group holding
        one may be priced as several kernels, split_gemm.py). A group's kernel reads
        distinct values of the computation and writes some of its members, so each is at
        most the bytes of all its values; its arithmetic is at most all of theirs."""
        if self._ceiling is None:
            work = self.work_of      # (not every instruction's facts: most are never priced)
            total = 0
            flops = trans = 0.0
            ceiling: Optional[float] = None
            for inst in self.comp.instructions:
                w = work(inst)
                if inst.opcode in ("dot", "convolution") or w.tensor_flops:
                    break
                total += array_bytes(inst.shape)
                flops += w.flops
                trans += w.transcendentals
            else:
                spec = self.spec
                ceiling = spec.kernel_launch_us + max(
                    (total + total) / spec.bytes_per_us,
                    0.0 + flops / spec.cuda_rate("fp32") + trans / spec.sfu_ops_per_us)
            self._ceiling = (ceiling,)
        return self._ceiling[0]

    def node_outputs(self, g: Group) -> list[Instruction]:
        """``outputs(g.members, {g.id})``: the members ``g``'s own kernel writes (do not
        modify the list). Kept with the node estimate, and dropped with it."""
        outs = self._node_outputs.get(g.id)
        if outs is None or g.id not in self._node_estimates:
            self._node_estimates.pop(g.id, None)
            self.node_estimate(g)
            outs = self._node_outputs[g.id]
        return outs

    def node_estimate(self, n: Node) -> Estimate:
        """The predicted cost of one node as it is now. Cached: an instruction's never
        changes; a group's changes only with its outputs, i.e. with its readers, so it is
        dropped with its consumers (``_forget_readers_of``)."""
        key = n.id if isinstance(n, Group) else -1 - id(n)   # group ids are positive
        est = self._node_estimates.get(key)
        if est is None:
            if isinstance(n, Group):
                est, self._node_outputs[key] = self._estimate_outs(n.instances(), {n.id})
            else:
                est = estimate_kernel([n], [n], self.spec) if not is_free(n) else \
                    estimate_kernel([], [], self.spec)
            self._node_estimates[key] = est
        return est

    def copy_estimate(self, producer: Group, consumer: Group) -> Estimate:
        """The predicted cost of ``consumer``'s kernel with ``producer`` recomputed in it
        (a duplicate's, per consumer). Cached as ``node_estimate`` is, and dropped with the
        consumer's: the kernel writes the consumer's outputs (the copies are not outputs),
        which change only with the consumer's readers; both groups' contents never change.
        A producer read by hundreds of groups (a scalar's broadcast in an optimizer step)
        gets a new duplicate candidate each time one of them fuses, and all but one of its
        consumers are as they were."""
        key = (producer.id, consumer.id)
        est = self._copy_estimates.get(key)
        if est is None:
            inst = consumer.instances() + [i for i in producer.instances() if i not in consumer]
            # Its members are the consumer's (a producer instance is in no group of the
            # consumer's id), so its outputs are the consumer kernel's own.
            est = self._copy_estimates[key] = self.estimate(inst, {consumer.id},
                                                            self.node_outputs(consumer))
            self._copy_estimates_of.setdefault(consumer.id, []).append(key)
        return est

    def _drop_copy_estimates(self, consumer_id: int) -> None:
        for key in self._copy_estimates_of.pop(consumer_id, ()):
            self._copy_estimates.pop(key, None)

    # --- actions --------------------------------------------------------------------------
    def merge(self, a: Group, b: Group) -> Group:
        """One group holding both (multi-output if a member is still read outside)."""
        members = a.members + b.members
        ids = {id(m) for m in members}
        copies = [c for c in _unique(a.copies + b.copies) if id(c) not in ids]
        kind = "normalization" if "normalization" in (a.kind, b.kind) else ""
        self._forget_readers_of((a, b))
        self._drop(a)
        self._drop(b)
        return self._add(Group(members, copies, kind, reads=_unique(a.reads + b.reads)))

    def duplicate(self, producer: Group, consumer: Group) -> Group:
        """Recompute the producer inside the consumer; the producer disappears when no one
        else reads it."""
        return self.duplicate_all(producer, [consumer])[0]

    def duplicate_all(self, producer: Group, consumers: list[Group]) -> list[Group]:
        """``duplicate(producer, g)`` for each of ``consumers`` (distinct groups), in one
        step: the same groups, made in that order, and the same caches dropped (the
        union of what each would drop), with the producer's readers looked up once
        (chains.py copies a broadcast into 4-8 kernels at once)."""
        self.epoch += 1
        # The producer loses a reader (its members' outputs may change) and its inputs'
        # groups gain one (the copy): estimates naming them are stale.
        touched = {producer.id} | {n.id for n in self.producers(producer) if isinstance(n, Group)}
        # The candidates naming a touched group, estimated or not (pass_.run_ranked keeps
        # only a bound for some): a touched group's own, and those of the groups feeding
        # it (a group's candidates name its consumers). Their groups are ranked again.
        for gid in touched:
            self.changed.add(gid)
            for n in self.producers(self.groups[gid]):
                if isinstance(n, Group):
                    self.changed.add(n.id)
        for gid in touched:        # by the index, not a scan of every cached candidate
            for k in self._candidates_of.pop(gid, ()):
                if self._candidates.pop(k, None) is not None:
                    self.changed.add(k[1])     # k's producer: its priorities are stale
        self._forget_readers_of([producer] + list(consumers))
        made = []
        for consumer in consumers:
            new = [i for i in producer.instances() if i not in consumer]
            self._drop(consumer)
            made.append(self._add(Group(consumer.members, consumer.copies + new, consumer.kind,
                                        reads=consumer.reads)))
        if not self.consumers(producer) and not any(m is self.comp.root for m in producer.members):
            self._drop(producer)
            for m in producer.members:
                del self.home[id(m)]
                self.dissolved.add(id(m))
                for o in m.operands:    # m is no longer a node reading them
                    self._user_nodes.pop(id(o), None)
        return made

    def take_changed(self) -> list[int]:
        """The ids in ``changed`` (ascending), which is emptied."""
        out = sorted(self.changed)
        self.changed.clear()
        return out

    def merge_all(self, groups: list[Group]) -> Group:
        """One group holding the members and copies of ``groups`` (plain groups: no kind,
        no extra reads), made at once: what merging them one by one gives, without the
        groups in between (chains.py)."""
        members = [m for g in groups for m in g.members]
        ids = {id(m) for m in members}
        copies = [c for c in _unique([c for g in groups for c in g.copies]) if id(c) not in ids]
        self._forget_readers_of(groups)
        for g in groups:
            self._drop(g)
        return self._add(Group(members, copies))

    def merge_many(self, groups: list[Group], kind: str = "") -> Group:
        g = groups[0]
        for other in groups[1:]:
            g = self.merge(g, other)
        g.kind = kind or g.kind
        return g


def _is_arange(inst: Instruction) -> bool:
    """A 1-D integer constant that counts 0, 1, 2, ... (what jax emits for jnp.arange)."""
    import numpy as np
    if inst.opcode != "constant" or inst.literal is None or inst.shape.rank != 1 or \
            not inst.shape.dtype.is_integer:
        return False
    arr = np.asarray(inst.literal)
    return arr.ndim == 1 and np.array_equal(arr, np.arange(arr.size))


def _unique(items: list[Instruction]) -> list[Instruction]:
    seen: set[int] = set()
    out = []
    for i in items:
        if id(i) not in seen:
            seen.add(id(i))
            out.append(i)
    return out


# --- materialize ----------------------------------------------------------------------------
def group_kind(g: Group) -> tuple[str, Optional[str]]:
    """(XLA fusion kind, backend_config text or None) for a group."""
    if g.kind == "normalization":
        return "kCustom", TRITON_NORMALIZATION
    if g.kind == "attention":
        return "kCustom", g.config or FLASH_ATTENTION_CONFIG
    insts = g.instances()
    if any(i.opcode == "dot" for i in insts):
        return "kCustom", TRITON_GEMM
    from .legality import is_hero
    if any(is_hero(i) for i in g.members):
        return "kInput", None
    return "kLoop", None


def needs_fusion(g: Group) -> bool:
    """A group of one unfused instruction stays as it is (a plain dot is a library call)."""
    return len(g.instances()) > 1


def materialize(state: FusionState) -> dict[int, Instruction]:
    """Rewrite the computation: one ``fusion`` per group of two or more instructions.
    Returns group id -> fusion instruction."""
    comp, module = state.comp, state.comp.parent
    assert module is not None
    groups = [g for g in state.groups.values() if needs_fusion(g)]
    fused_ids = {g.id for g in groups}
    value: dict[int, Instruction] = {}        # original instruction -> value replacing it
    fusions: dict[int, Instruction] = {}
    bodies: list[Computation] = []

    def value_of(inst: Instruction) -> Instruction:
        return value.get(id(inst), inst)

    for g in _topological(state, groups):
        instances = sorted(g.instances(), key=state.pos)
        outs = state.outputs(g.members, {g.id})
        body = Computation("fused_computation")
        clone: dict[int, Instruction] = {}
        operands: list[Instruction] = []
        for inst in instances:
            for o in inst.operands:
                if id(o) in clone or any(o is i for i in instances):
                    continue
                if o.opcode == "constant" and elements(o.shape) <= SMALL_CONSTANT_ELEMENTS:
                    c = Instruction("constant", [], o.shape, dict(o.attrs), name=o.name,
                                    literal=o.literal)
                elif g.kind == "attention" and _is_arange(o):
                    # jnp.arange positions (a sliding window's compares): an iota in the
                    # body, so the kernels see the band test instead of a position vector
                    c = Instruction("iota", [], o.shape, {"iota_dimension": 0}, name=o.name)
                else:
                    c = Instruction("parameter", [], o.shape, name=f"param_{len(operands)}",
                                    parameter_number=len(operands))
                    operands.append(value_of(o))
                clone[id(o)] = body.add_instruction(c)
            new = Instruction(inst.opcode, [clone[id(o)] for o in inst.operands], inst.shape,
                              dict(inst.attrs), name=inst.name, literal=inst.literal)
            clone[id(inst)] = body.add_instruction(new)
        for o in g.reads:           # parameters no instruction of the body reads
            if id(o) not in clone:
                clone[id(o)] = body.add_instruction(Instruction(
                    "parameter", [], o.shape, name=f"param_{len(operands)}",
                    parameter_number=len(operands)))
                operands.append(value_of(o))
        if len(outs) == 1:
            body.root = clone[id(outs[0])]
            shape = outs[0].shape
        else:
            body.root = body.add_instruction(Instruction(
                "tuple", [clone[id(o)] for o in outs],
                TupleShape(tuple(o.shape for o in outs)), name="tuple"))
            shape = body.root.shape
        kind, config = group_kind(g)
        attrs: dict = {"kind": kind, "calls": body}
        md = outs[-1].attrs.get("metadata")
        if md is not None:
            attrs["metadata"] = md
        if config is not None:
            attrs["backend_config"] = Raw(config)
        fusion = comp.add_instruction(Instruction("fusion", operands, shape, attrs, name="fusion"))
        body.fusion_instruction = fusion
        fusions[g.id] = fusion
        bodies.append(body)
        if len(outs) == 1:
            value[id(outs[0])] = fusion
        else:
            for k, o in enumerate(outs):
                value[id(o)] = comp.add_instruction(Instruction(
                    "get-tuple-element", [fusion], o.shape, {"index": k},
                    name="get-tuple-element"))

    # Unfused instructions (and groups of one) now read the fusions' results.
    originals = [i for i in comp.instructions
                 if (id(i) in state.home and state.home[id(i)].id in fused_ids)
                 or id(i) in state.dissolved]
    gone = {id(i) for i in originals}
    for inst in list(comp.instructions):
        if id(inst) not in gone:
            inst.replace_operands(value)
    if id(comp.root) in value:
        comp.root = value[id(comp.root)]
    comp.remove_instructions(sorted(originals, key=state.pos, reverse=True))
    comp.instructions = comp.post_order()
    at = module.computations.index(comp)
    for body in bodies:
        module.add_computation(body)
        module.computations.remove(body)
        module.computations.insert(at, body)
        at += 1
    return fusions


def _topological(state: FusionState, groups: list[Group]) -> list[Group]:
    """Groups ordered so that a group comes after the groups producing its inputs."""
    by_id = {g.id: g for g in groups}
    deps: dict[int, dict[int, None]] = {}     # ordered, as copy_in (determinism)
    for g in groups:
        d: dict[int, None] = {}
        for o in state.external_inputs(g.instances()) + g.reads:
            h = state.home.get(id(o))
            if h is not None and h.id in by_id and h.id != g.id:
                d[h.id] = None
        deps[g.id] = d
    order: list[Group] = []
    ready = sorted((gid for gid, d in deps.items() if not d),
                   key=lambda gid: state._first(by_id[gid]))
    users: dict[int, list[int]] = {}
    for gid, d in deps.items():
        for p in d:
            users.setdefault(p, []).append(gid)
    while ready:
        gid = ready.pop(0)
        order.append(by_id[gid])
        for u in users.get(gid, ()):
            deps[u].pop(gid, None)
            if not deps[u]:
                ready.append(u)
    if len(order) != len(groups):
        from hlo.errors import HlotkError
        raise HlotkError("fusion groups form a cycle (a legality check is missing)")
    return order
