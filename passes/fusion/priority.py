"""XLA's priority fusion: the most beneficial fusion first, by the cost model.

benefit = predicted time of the kernels apart - predicted time of the fused kernel. A
producer is merged into a consumer (multi-output when it is read elsewhere) or, when it is
cheap, recomputed in every consumer. After each fusion the candidates are scored again;
scores of groups that did not change come from a cache, so in effect only the neighbours
of the fused groups are re-scored. Sibling (multi-output) fusions of groups reading the
same input come after all producer-consumer fusions, as XLA runs multi-output fusion after
priority fusion.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from .legality import YES, Decision, no
from .policy import (Candidate, benefit_us, estimates, producer_consumer_candidates,
                     register_policy, sibling_candidates, split_note)
from .rewrite import FusionState

SIBLING_PENALTY = 1e9


@register_policy
@dataclass
class PriorityPolicy:
    name = "priority"
    siblings: bool = True
    min_benefit_us: float = 0.0

    def candidates(self, state: FusionState) -> Iterator[Candidate]:
        yield from producer_consumer_candidates(state)
        if self.siblings:
            yield from sibling_candidates(state)

    def priority(self, c: Candidate, state: FusionState) -> float:
        # The fusion loop asks for every candidate's priority after every fusion (~300 x
        # 360 on the Adam step). It is a function of the candidate's estimates and of its
        # groups' contents, which never change for a group id: kept in the state beside
        # the estimates object it was computed from, and recomputed when the state has
        # dropped those estimates and made new ones (a duplicate changes readers).
        key = c.key
        est = state._candidates.get(key) or estimates(c, state)
        known = state.priorities.get(key)
        if known is not None and known[0] is est:
            return known[1]
        value = self._priority(c, state)
        state.priorities[key] = (est, value)
        return value

    def priority_bound(self, c: Candidate, state: FusionState) -> Optional[float]:
        """An upper bound of ``priority(c, state)`` that needs no estimate of the fused
        kernel, or None (the fusion loop then asks for the priority): the loop estimates a
        candidate only when its bound reaches the top of its ranking (pass_.run_ranked).
        For a merge or siblings: the benefit is the two groups' times apart (their own
        estimates, which the exact priority sums too) less the fused kernel's, which is at
        least ``FusionState.merged_floor_us``; the other terms of ``_priority`` only lower
        a positive benefit, give 1e-3 (a merge) or subtract the siblings' penalty. Float
        subtraction is monotonic, so the bound holds as computed."""
        if c.action == "duplicate" or type(self)._priority is not PriorityPolicy._priority \
                or c.key in state._candidates:
            return None
        p, g = c.producer, c.consumer
        # Kept while both groups' own estimates are the objects it came from: the state
        # drops a group's estimate whenever its readers change, and the bound depends on
        # nothing else that changes (the groups' contents never do).
        known = state.bounds.get(c.key)
        if known is not None:
            own = state._node_estimates       # by group id (node_estimate's cache)
            if own.get(p.id) is known[0] and own.get(g.id) is known[1]:
                return known[2]
        ep, eg = state.node_estimate(p), state.node_estimate(g)
        # (ep + eg).time_us, without making the Estimate
        value = max((ep.time_us + eg.time_us) - state.merged_floor_us(p, g), 1e-3)
        if c.action == "sibling":
            value -= SIBLING_PENALTY
        state.bounds[c.key] = (ep, eg, value)
        return value

    def sibling_floor(self, state: FusionState) -> float:
        """A key (-priority) at or below which a candidate comes before every sibling
        candidate of ``state``, or -inf. A sibling's priority is its benefit less
        SIBLING_PENALTY, and its benefit at most its two groups' times apart. Where no
        instruction of the computation is a dot or has tensor-core work (so no group is
        priced split, split_gemm.py), each group's time is ``estimate_kernel``'s: a launch
        plus the larger of memory time (reads and writes, each at most the bytes of all
        the computation's values) and compute time (at most all its instructions'
        arithmetic): ``FusionState.kernel_ceiling_us``. Float arithmetic is monotonic, so
        the bound holds as computed."""
        if type(self)._priority is not PriorityPolicy._priority:
            return float("-inf")
        ceiling = state.kernel_ceiling_us()
        if ceiling is None:
            return float("-inf")
        return -((ceiling + ceiling) - SIBLING_PENALTY)

    def _priority(self, c: Candidate, state: FusionState) -> float:
        b = benefit_us(c, state)
        if b == 0.0 and _free(c):
            b = 1e-3        # fold views (reshape/bitcast) into their consumer
        elif b > 0.0 and _into_gemm(c, state):
            # Ops join a GEMM after they have merged with their elementwise neighbours: a
            # GELU between two matmuls then becomes whole before either GEMM takes it, and
            # the first one's cuBLASLt epilogue (gemm_epilogue.py) can win over the second
            # one's prologue, which runs split as a kernel of its own (transcendental).
            b *= 0.5
        return b - SIBLING_PENALTY if c.action == "sibling" else b

    def should_fuse(self, c: Candidate, state: FusionState) -> Decision:
        b = benefit_us(c, state)
        if b == 0.0 and _free(c):
            return YES
        if b <= self.min_benefit_us:
            return no(f"not profitable: benefit {b:.2f} us{split_note(c, state)}")
        return YES


def _into_gemm(c: Candidate, state: FusionState) -> bool:
    """A merge of ops without a dot into a GEMM group (a prologue, or an input of its
    epilogue), under split-GEMM pricing."""
    if c.action != "merge" or not state.split_gemms:
        return False
    known = state.gemm_merges.get(c.key)
    if known is None:
        known = state.gemm_merges[c.key] = \
            any(i.opcode == "dot" for i in c.consumer.instances()) and \
            not any(i.opcode == "dot" for i in c.producer.instances())
    return known


def _free(c: Candidate) -> bool:
    """Views (bitcasts, row-major reshapes) folded for free into their consumer, unless the
    consumer is a dot alone: that runs as a library GEMM reading the view as a strided
    operand, and the fold would only turn it into a generated GEMM."""
    from .cost_model import is_free
    consumer = c.consumer.instances()
    if len(consumer) == 1 and consumer[0].opcode == "dot":
        return False
    return c.action != "sibling" and all(is_free(i) for i in c.producer.instances())
