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
from .rewrite import FusionState, Group

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
        subtraction is monotonic, so the bound holds as computed. A duplicate:
        ``duplicate_bound``."""
        if type(self)._priority is not PriorityPolicy._priority or c.key in state._candidates:
            return None
        if c.action == "duplicate":
            return self.duplicate_bound(c.producer, len(c.consumers), state)
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

    def new_consumer_bound(self, p: Group, made: Group, readers: int,
                           state: FusionState) -> Optional[float]:
        """An upper bound of the priorities of the candidates ``p`` has now and did not
        have before ``made`` (a merge or sibling fusion of two groups, at least one a
        consumer of ``p``) replaced its consumers: merge(p, made) and the duplicate of
        ``p`` into its at most ``readers`` consumers (others now), or None
        (pass_.run_ranked then ranks ``p`` at once)."""
        from .policy import merge_candidate
        if type(self)._priority is not PriorityPolicy._priority:
            return None
        c = merge_candidate(state, p, made)
        merge = self.priority(c, state) if c.key in state._candidates else \
            self.priority_bound(c, state)
        copy = self.duplicate_bound(p, readers, state)
        if merge is None or copy is None:
            return None
        return max(merge, copy)

    def duplicate_bound(self, p: Group, k: int, state: FusionState) -> Optional[float]:
        """An upper bound of the priority of duplicating ``p`` into at most ``k``
        consumers, whoever they are, or None (a dot, convolution or tensor-core op in the
        computation: a kernel holding one may be priced split, split_gemm.py). O(p's
        instances): a scalar read by 200 arrays' kernels (an optimizer's bias correction)
        gets a new duplicate candidate whenever one of them fuses, and its estimate sums
        400 kernels.

        benefit = p's kernel + sum(g's kernel) - sum(g's kernel with p recomputed in it).
        The kernel with p in it writes g's outputs (copy_estimate), reads what g reads but
        p's values (each at most its bytes, counted once per kernel) and does at least g's
        arithmetic (integral flop counts: exact sums), so each copy's time is at least g's
        less (bytes of p's instances) / bandwidth, up to rounding: the benefit is at most
        p's time + k x that. The sums of k+1 times, each at most ``kernel_ceiling_us``,
        round by at most (k+1)^2 ulps of it: ``slack`` covers both folds and this sum
        with room (about 1e-7 us at 200 consumers)."""
        ceiling = state.kernel_ceiling_us()
        if ceiling is None:
            return None
        n = k + 1
        saved = k * state.instance_bytes(p) / state.spec.bytes_per_us
        slack = 8.0 * n * n * ceiling * 2.0 ** -53 + 1e-9
        return max(state.node_estimate(p).time_us + saved + slack, 1e-3)

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
