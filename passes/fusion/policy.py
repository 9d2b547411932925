"""The ``FusionPolicy`` protocol: profitability, apart from legality.

A policy answers three questions about a ``FusionState`` (groups of instructions that will
be kernels; see ``rewrite.py``):

- ``candidates(state)``: which fusions to consider now (``Candidate`` objects: merge a
  producer group into a consumer group, duplicate a cheap producer into all its consumers,
  or merge two siblings that read the same input);
- ``priority(candidate, state)``: a number, the highest is tried first;
- ``should_fuse(candidate, state)``: a ``Decision`` (yes/no with a reason).

The driver (``driver.run_policy``) repeatedly takes the best candidate that is legal and
that the policy wants, applies it, and asks again, until no candidate is taken. Every
candidate looked at is recorded with its reason and predicted times. A user's policy is a
class with these three methods (``name`` too), passed by object or as ``"module:Class"``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Protocol, Union, runtime_checkable

from hlo.errors import HlotkError

from .cost_model import Estimate
from .legality import Decision
from .rewrite import FusionState, Group


@dataclass(frozen=True)
class Candidate:
    action: str                     # "merge" | "duplicate" | "sibling"
    producer: Group                 # for siblings: the first of the two
    consumers: tuple[Group, ...]    # merge/sibling: one group; duplicate: every consumer

    # (action, producer id, consumer ids...): asked for on every scoring, so made once with
    # the candidate (groups never change their id) as a plain attribute.
    key: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.action, self.producer.id)
                           + tuple(g.id for g in self.consumers))

    @property
    def consumer(self) -> Group:
        return self.consumers[0]


@runtime_checkable
class FusionPolicy(Protocol):
    name: str

    def candidates(self, state: FusionState) -> Iterable[Candidate]: ...

    def priority(self, candidate: Candidate, state: FusionState) -> float: ...

    def should_fuse(self, candidate: Candidate, state: FusionState) -> Decision: ...


# --- helpers a policy can use ------------------------------------------------------------------
def producer_consumer_candidates(state: FusionState, duplicates: bool = True,
                                 multi_output: bool = True) -> Iterator[Candidate]:
    """merge(P, C) for every producer group P and consumer group C; duplicate(P, all C)
    when every reader of P is a group and there are several.

    A group's candidates depend on its consumers only, so they are kept with them in the
    state (dropped when those change): the fusion loop asks after every fusion, and the
    same objects come back, each computing its key once."""
    for p in list(state.groups.values()):
        yield from group_candidates(state, p, duplicates, multi_output)


def group_candidates(state: FusionState, p: Group, duplicates: bool = True,
                     multi_output: bool = True) -> list[Candidate]:
    """The candidates with producer ``p`` (do not modify the list): the same list object
    until ``p``'s consumers change (the state drops it then)."""
    flags = (duplicates, multi_output)
    per_group = state._pc_candidates.setdefault(p.id, {})
    cands = per_group.get(flags)
    if cands is None:
        cands = per_group[flags] = _group_candidates(state, p, duplicates, multi_output)
    return cands


def _group_candidates(state: FusionState, p: Group, duplicates: bool,
                      multi_output: bool) -> list[Candidate]:
    out = []
    readers = state.consumers(p)
    groups = [n for n in readers if isinstance(n, Group)]
    only_groups = len(groups) == len(readers) and not any(
        m is state.comp.root for m in p.members)
    if duplicates and only_groups and len(groups) > 1:
        out.append(Candidate("duplicate", p, tuple(groups)))
    for c in groups:
        if multi_output or (only_groups and len(groups) == 1):
            out.append(merge_candidate(state, p, c))
    return out


def merge_candidate(state: FusionState, p: Group, c: Group) -> Candidate:
    """merge(p, c): the same object for the same pair in every ranking."""
    m = state._merges.get((p.id, c.id))
    if m is None:
        m = state._merges[(p.id, c.id)] = Candidate("merge", p, (c,))
    return m  # type: ignore[return-value]


def sibling_candidates(state: FusionState, min_shared_bytes: int = 1 << 16) -> Iterator[Candidate]:
    """Pairs of groups (in program order) that read the same input of at least
    ``min_shared_bytes``."""
    seen: set[tuple[int, int]] = set()
    made = state._siblings       # the same object for the same pair in every round
    for inst in state.shared_values(min_shared_bytes):
        readers = state.group_readers(inst)
        if all(inst in g for g in readers):
            # Every reader recomputes the value (a broadcast duplicated into each): nothing
            # is read once for all of them, and the merged kernel would only be a bigger
            # compile (adam_step's same-shape updates sharing one broadcast of a scalar).
            continue
        for a, b in zip(readers, readers[1:]):
            pair = (a.id, b.id)
            if pair not in seen:
                seen.add(pair)
                c = made.get(pair)
                if c is None:
                    c = made[pair] = Candidate("sibling", a, (b,))
                yield c


def sibling_stamp(state: FusionState, min_shared_bytes: int = 1 << 16) -> int:
    """A number that changes whenever ``sibling_candidates(state, min_shared_bytes)`` may
    give other pairs: the state's count of looks at values whose group readers changed
    (after bringing the shared values up to date)."""
    state.shared_values(min_shared_bytes)
    return state.shared_version


def estimates(c: Candidate, state: FusionState) -> tuple[Estimate, Estimate]:
    """(unfused, fused): predicted cost of the kernels involved, apart and after fusing
    (computed once per candidate: ``FusionState.candidate_estimates``)."""
    key = c.key
    known = state._candidates.get(key)    # the hot path (every candidate, every round)
    if known is not None:
        return known
    return state.candidate_estimates(key, lambda: _estimates(c, state))


def _fields(e: Estimate) -> list:
    """An estimate's fields in ``Estimate``'s order, to sum in place: summed field by field
    in the order ``Estimate.__add__`` sums them (the same floats), without an Estimate per
    step (a duplicate candidate sums one pair per consumer)."""
    return [e.time_us, e.bytes_read, e.bytes_written, e.flops, e.kernels, e.memory_us,
            e.compute_us]


def _add_fields(acc: list, e: Estimate) -> None:
    for k, v in enumerate(_fields(e)):
        acc[k] += v


def _estimates(c: Candidate, state: FusionState) -> tuple[Estimate, Estimate]:
    p = c.producer
    if c.action == "duplicate":
        # apart = node(p) + node(g1) + node(g2) ...; together = copy(p, g1) + copy(p, g2) ...
        # as Estimate.__add__ sums them, field by field in the same order (the same floats),
        # without an Estimate per step (a broadcast read by 24 groups: 48 of them).
        a = _fields(state.node_estimate(p))
        t: Optional[list] = None
        for g in c.consumers:
            _add_fields(a, state.node_estimate(g))
            e = state.copy_estimate(p, g)
            if t is None:
                t = _fields(e)
            else:
                _add_fields(t, e)
        assert t is not None
        return Estimate(*a), Estimate(*t)
    g = c.consumer
    apart = state.node_estimate(p) + state.node_estimate(g)
    members = p.members + g.members
    inst = members + [i for i in p.copies + g.copies if i not in members]
    # The kernel's members are exactly p's and g's (a copy left in ``inst`` has its home
    # in neither: one whose original is a member of p or g is dropped above).
    return apart, state.estimate(inst, {p.id, g.id}, state.merge_outputs(p, g))


def split_note(c: Candidate, state: FusionState) -> str:
    """For a rejection: how the fused group would run when the backend splits it into
    library GEMM + loop kernels (``FusionState.split_gemms``), else ''."""
    if not state.split_gemms or c.action == "sibling":
        return ""
    from .split_gemm import split_reason
    for g in c.consumers:
        inst = g.instances() + [i for i in c.producer.instances() if i not in g]
        why = split_reason(inst, [])
        if why is not None:
            _, together = estimates(c, state)
            return (f"; fused, it runs split into {together.kernels} kernels ({why}: "
                    "cuBLAS reads its operands from memory, so the fused producer "
                    "becomes a prologue kernel per GEMM)")
    return ""


def benefit_us(c: Candidate, state: FusionState) -> float:
    apart, together = estimates(c, state)
    return apart.time_us - together.time_us


# --- policies by name ----------------------------------------------------------------------------
POLICIES: dict[str, type] = {}


def register_policy(cls: type) -> type:
    POLICIES[cls.name] = cls
    return cls


def resolve_policy(policy: Union[str, FusionPolicy, type]) -> FusionPolicy:
    """A policy object from a registered name, a ``module:Class`` path, a class or an object."""
    if isinstance(policy, type):
        return policy()
    if not isinstance(policy, str):
        return policy
    if policy in POLICIES:
        return POLICIES[policy]()
    if ":" in policy or "." in policy:
        # "pkg.module:Class", or "pkg.module.Class" (pipeline specs cannot hold ':')
        mod, _, attr = policy.partition(":") if ":" in policy else policy.rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise HlotkError(f"cannot load fusion policy {policy!r}: {e}") from None
        obj = cls() if isinstance(cls, type) else cls
        for m in ("candidates", "priority", "should_fuse"):
            if not callable(getattr(obj, m, None)):
                raise HlotkError(f"fusion policy {policy!r} has no method {m}()")
        return obj
    raise HlotkError(f"unknown fusion policy {policy!r}; known: {', '.join(sorted(POLICIES))} "
                     "or a module:Class (module.Class in a pipeline spec) path")
