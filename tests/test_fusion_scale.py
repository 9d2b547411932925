"""The ranked fusion loop on optimizer steps over many arrays (issue 13: the fusion pass grew
faster than the program): deferred rankings and the duplicates' bound make the decisions,
and the log, of the loop that ranks every changed group at once, and of the general loop
that scores every candidate every round; the chains pre-pass merges the trees of
components larger than the limits, part by part, with the same kernels."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from passes.fusion import pass_, policy as policy_mod, priority as priority_mod

sys.path.insert(0, str(Path(__file__).parent))
from test_fusion_caches import _adam, _compile, _many  # noqa: E402
from test_fusion_chains import _premerged, _same_kernels  # noqa: E402


def _counting(monkeypatch) -> dict:
    """Counts listings of a group's candidates (a ranking) and deferrals."""
    counts = {"listed": 0, "deferred": 0}
    real_list = policy_mod.group_candidates
    real_bound = priority_mod.PriorityPolicy.new_consumer_bound

    def listed(state, g, *a):
        counts["listed"] += 1
        return real_list(state, g, *a)

    def bound(self, *a):
        out = real_bound(self, *a)
        counts["deferred"] += out is not None
        return out
    monkeypatch.setattr(policy_mod, "group_candidates", listed)
    monkeypatch.setattr(priority_mod.PriorityPolicy, "new_consumer_bound", bound)
    return counts


def test_deferred_rankings_decide_as_ranking_at_once_and_as_the_general_loop(monkeypatch):
    """After a merge, the groups feeding it keep one bound and are ranked when it comes to
    the top: the same module and decision log (every pair looked at, in order, with its
    predicted times) as ranking them at once, and as scoring every candidate every round;
    fewer rankings."""
    args = _many(12)
    with monkeypatch.context() as m:
        counts = _counting(m)
        deferred = _compile(_adam, args, chains=False)
    assert counts["deferred"] > 50
    with monkeypatch.context() as m:
        m.setattr(priority_mod.PriorityPolicy, "new_consumer_bound", lambda *a: None)
        at_once_counts = _counting(m)
        m.setattr(priority_mod.PriorityPolicy, "new_consumer_bound", lambda *a: None)
        at_once = _compile(_adam, args, chains=False)
    assert at_once_counts["deferred"] == 0
    assert deferred == at_once
    assert counts["listed"] < at_once_counts["listed"]
    with monkeypatch.context() as m:
        m.setattr(pass_, "ranks_by_group", lambda policy: False)
        assert _compile(_adam, args, chains=False) == deferred


def test_a_merge_that_changes_a_neighbours_best_candidate(monkeypatch):
    """%x feeds %a and %c; once %a and %b merge, x's best candidate is merge(x, {a, b})
    (new: the group did not exist when x was ranked), deferred behind a bound. The loop's
    decisions are the general loop's."""
    import hlo
    from passes.fusion.explain import report_for
    from passes.fusion.pass_ import Fusion
    text = """HloModule m

ENTRY %main (p0: f32[1024,256], p1: f32[1024,256]) -> (f32[1024,256], f32[1024,256]) {
  %p0 = f32[1024,256]{1,0} parameter(0)
  %p1 = f32[1024,256]{1,0} parameter(1)
  %x = f32[1024,256]{1,0} exponential(%p0)
  %a = f32[1024,256]{1,0} multiply(%x, %p1)
  %b = f32[1024,256]{1,0} add(%a, %p1)
  %c = f32[1024,256]{1,0} subtract(%x, %p1)
  %d = f32[1024,256]{1,0} tanh(%c)
  ROOT %t = (f32[1024,256], f32[1024,256]) tuple(%b, %d)
}
"""
    def fused(general: bool) -> str:
        m = hlo.parse_hlo(text)
        with monkeypatch.context() as mp:
            if general:
                mp.setattr(pass_, "ranks_by_group", lambda policy: False)
            Fusion(target="h200", chains=False).run(m)
        return m.to_text() + "\n".join(map(repr, report_for(m).decisions))
    with monkeypatch.context() as m:
        counts = _counting(m)
        ranked = fused(False)
    assert counts["deferred"] >= 1
    assert ranked == fused(True)
    assert "fusion" in ranked


@pytest.mark.parametrize("n", [48])
def test_a_component_over_the_limits_premerges_part_by_part(n):
    """48 arrays of two shapes: ~340 members in each component (shared broadcasts of the
    constants), more than max_size, but each part (a tree and the broadcasts copied into
    it) within the limits: the trees are merged first, the bias corrections' broadcasts
    (a kernel's scalar read by several broadcasts) copied, and the kernels are the
    loop's."""
    merged = _same_kernels(_adam, _many(n))
    assert len(merged) > 10 * n
    copies = {p for p, _, a in merged if a == "duplicate"}
    assert copies


def test_a_part_over_the_limits_is_left_to_the_loop():
    """With max_size below one tree and its copies, nothing is pre-merged."""
    assert _same_kernels(_adam, _many(6), max_size=12) == []


def test_the_fusion_pass_leaves_no_cyclic_garbage_of_its_state():
    """The pass's tables (groups, candidates, estimates) point at each other; once it ends
    reference counting frees them (the state's tables are dropped), so the collector does
    not walk tens of thousands of them at its next pass (issue 13)."""
    import gc

    from passes.fusion.rewrite import FusionState
    from passes.fusion.policy import Candidate
    args = _many(8)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _compile(_adam, args)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (FusionState, Candidate))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert left == []
