"""XLA's classic instruction fusion: fuse whatever is legal, consumers first.

No cost model: visit consumers from the root towards the parameters and fuse each
producer that has no other reader, or that is cheap enough to recompute in every consumer
(never an expensive one). No multi-output fusion.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .legality import YES, Decision
from .policy import Candidate, producer_consumer_candidates, register_policy
from .rewrite import FusionState


@register_policy
@dataclass
class GreedyPolicy:
    name = "greedy"

    def candidates(self, state: FusionState) -> Iterator[Candidate]:
        yield from producer_consumer_candidates(state, duplicates=True, multi_output=False)

    def priority(self, c: Candidate, state: FusionState) -> float:
        # Consumers late in the program first (reverse post order), merges before copies.
        return max(state.pos(i) for i in c.consumer.members) * 2 + (c.action == "merge")

    def should_fuse(self, c: Candidate, state: FusionState) -> Decision:
        return YES


@register_policy
@dataclass
class NoFusionPolicy:
    """Every instruction its own kernel (a baseline)."""
    name = "none"

    def candidates(self, state: FusionState) -> Iterator[Candidate]:
        return iter(())

    def priority(self, c: Candidate, state: FusionState) -> float:
        return 0.0

    def should_fuse(self, c: Candidate, state: FusionState) -> Decision:
        return Decision(False, "policy none fuses nothing")
