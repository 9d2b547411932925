"""The pass contract, the pipeline spec, instrumentation, DCE and CSE."""
import pytest

import hlo
import passes
from passes import PassError, parse_pipeline, run_pipeline

TEXT = """HloModule m

ENTRY %main (p0: f32[4], p1: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  %a = f32[4]{0} add(%p0, %p1)
  %b = f32[4]{0} add(%p0, %p1)
  %dead = f32[4]{0} multiply(%p0, %p0)
  ROOT %m = f32[4]{0} multiply(%a, %b)
}
"""


def test_spec_round_trips_and_lists_known_passes():
    spec = "cse,fixpoint(dce,cse){max_iterations=3},dce{remove_computations=false}"
    assert str(parse_pipeline(spec)) == spec
    with pytest.raises(PassError, match="unknown pass 'nope'; known passes: .*cse.*dce"):
        parse_pipeline("cse,nope")
    with pytest.raises(PassError, match="no option 'bogus'; its options: only_constants"):
        parse_pipeline("cse{bogus=1}")
    with pytest.raises(PassError, match="column 5"):
        parse_pipeline("cse,(")
    with pytest.raises(PassError, match="not a valid bool"):
        parse_pipeline("dce{remove_computations=maybe}")


def test_cse_then_dce_rewrites_and_records():
    m = hlo.parse_hlo(TEXT)
    records = run_pipeline(m, "cse,dce", verify=True)
    assert [r.name for r in records] == ["cse", "dce"]
    assert [r.changed for r in records] == [True, True]
    assert records[0].instructions_before == 6 and records[0].instructions_after == 5
    assert records[1].instructions_after == 4
    root = m.entry.root
    assert root.opcode == "multiply" and root.operands[0] is root.operands[1]
    assert [i.name for i in m.entry.instructions] == ["p0", "p1", "a", "m"]
    x = [1.0, 2.0, 3.0, 4.0]
    y = [0.5, 0.5, 0.5, 0.5]
    import numpy as np
    np.testing.assert_allclose(hlo.evaluate(m, [np.float32(x), np.float32(y)]),
                               (np.float32(x) + np.float32(y)) ** 2)


def test_fixpoint_stops_when_nothing_changes():
    m = hlo.parse_hlo(TEXT)
    records = run_pipeline(m, "fixpoint(cse,dce)")
    # iteration 0 changes, iteration 1 confirms the fixed point
    assert [(r.name, r.iteration, r.changed) for r in records] == [
        ("cse", 0, True), ("dce", 0, True), ("cse", 1, False), ("dce", 1, False)]


def test_hooks_see_before_and_after():
    m = hlo.parse_hlo(TEXT)
    seen = []
    run_pipeline(m, "dce", hooks=[lambda ev, p, mod, rec: seen.append((ev, p.name, rec and rec.changed))])
    assert seen == [("before", "dce", None), ("after", "dce", True)]


def test_cse_keeps_side_effects_and_distinct_constants():
    text = """HloModule m

ENTRY %main () -> (f32[], f32[], f32[]) {
  %c1 = f32[] constant(1)
  %c1b = f32[] constant(1)
  %c2 = f32[] constant(2)
  ROOT %t = (f32[], f32[], f32[]) tuple(%c1, %c1b, %c2)
}
"""
    m = hlo.parse_hlo(text)
    assert passes.make_pass("cse").run(m)
    t = m.entry.root
    assert t.operands[0] is t.operands[1] and t.operands[2] is not t.operands[0]


def test_cse_merges_reduces_whose_bodies_are_equal_copies_not_different_ones():
    # jnp code that computes x.max() twice imports as two reduces with their own regions
    text = """HloModule m

%max1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%max2 (c: f32[], d: f32[]) -> f32[] {
  %c = f32[] parameter(0)
  %d = f32[] parameter(1)
  ROOT %n = f32[] maximum(%c, %d)
}

%min1 (e: f32[], f: f32[]) -> f32[] {
  %e = f32[] parameter(0)
  %f = f32[] parameter(1)
  ROOT %o = f32[] minimum(%e, %f)
}

%max_swapped (g: f32[], h: f32[]) -> f32[] {
  %g = f32[] parameter(0)
  %h = f32[] parameter(1)
  ROOT %q = f32[] maximum(%h, %g)
}

ENTRY %main (p: f32[4,8]) -> (f32[4], f32[4], f32[4], f32[4]) {
  %p = f32[4,8]{1,0} parameter(0)
  %init = f32[] constant(-inf)
  %r1 = f32[4]{0} reduce(%p, %init), dimensions={1}, to_apply=%max1
  %r2 = f32[4]{0} reduce(%p, %init), dimensions={1}, to_apply=%max2
  %r3 = f32[4]{0} reduce(%p, %init), dimensions={1}, to_apply=%min1
  %r4 = f32[4]{0} reduce(%p, %init), dimensions={1}, to_apply=%max_swapped
  ROOT %t = (f32[4], f32[4], f32[4], f32[4]) tuple(%r1, %r2, %r3, %r4)
}
"""
    import numpy as np
    m = hlo.parse_hlo(text)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    want = hlo.evaluate(m, [x])
    assert passes.make_pass("cse").run(m)
    t = m.entry.root
    assert t.operands[0] is t.operands[1]                 # equal bodies, other names
    assert t.operands[2] is not t.operands[0]             # minimum is another reduce
    assert t.operands[3] is not t.operands[0]             # operands swapped: not the same text
    for got, w in zip(hlo.evaluate(m, [x]), want):
        np.testing.assert_array_equal(got, w)


# --- verification after passes (issue 13: only where the module changed, as XLA) ----------
class _Pass:
    """A test pass: ``edit`` (module -> None) applied, ``changed`` reported."""

    def __init__(self, name, changed=False, edit=None):
        self.name, self.changed, self.edit = name, changed, edit

    def run(self, module):
        if self.edit is not None:
            self.edit(module)
        return self.changed


def _break_root(m):
    """An instruction whose declared shape is wrong (the verifier's shape check)."""
    root = m.entry.root
    root.shape = hlo.parse_hlo(TEXT.replace("f32[4]", "f32[5]")).entry.root.shape


def _drop_dead(m):
    m.entry.remove_dead()


def test_verification_runs_after_the_first_pass_and_after_changes(monkeypatch):
    import hlo.verifier
    seen = []
    real = hlo.verifier.verify
    monkeypatch.setattr(hlo.verifier, "verify", lambda m: (seen.append(1), real(m)))
    m = hlo.parse_hlo(TEXT)
    run_pipeline(m, [_Pass("a"), _Pass("b"), _Pass("c", changed=True), _Pass("d")], verify=True)
    assert len(seen) == 2            # after a (first) and c (changed)
    seen.clear()
    run_pipeline(m, [_Pass("a"), _Pass("b")], verify=True, verified=True)
    assert seen == []                # the caller verified it; nothing changed
    seen.clear()
    # Reported unchanged, but an instruction went: verified all the same.
    run_pipeline(m, [_Pass("a"), _Pass("liar", edit=_drop_dead)], verify=True, verified=True)
    assert len(seen) == 1


def test_a_broken_module_is_still_reported():
    # An invalid input and passes that change nothing: the first pass's verification says so.
    m = hlo.parse_hlo(TEXT)
    _break_root(m)
    with pytest.raises(PassError, match="after pass a"):
        run_pipeline(m, [_Pass("a"), _Pass("b")], verify=True)
    # A pass that breaks the module and says so.
    m = hlo.parse_hlo(TEXT)
    with pytest.raises(PassError, match="after pass breaks"):
        run_pipeline(m, [_Pass("a"), _Pass("breaks", changed=True, edit=_break_root)],
                     verify=True)


def _verify_counter(monkeypatch) -> list:
    import hlo.verifier
    seen: list = []
    real = hlo.verifier.verify
    monkeypatch.setattr(hlo.verifier, "verify", lambda m: (seen.append(1), real(m))[1])
    return seen


def _replay_of(m):
    """``replay`` for run_pipeline: copies of ``m`` as it is now, counted."""
    made = []
    original = m.copy()

    def replay():
        made.append(1)
        return original.copy()
    return replay, made


def test_with_replay_a_valid_pipeline_is_verified_once(monkeypatch):
    seen = _verify_counter(monkeypatch)
    m = hlo.parse_hlo(TEXT)
    replay, made = _replay_of(m)
    records = run_pipeline(m, "cse,dce", verify=True, verified=True, replay=replay)
    assert [r.changed for r in records] == [True, True]
    assert len(seen) == 1 and made == []          # after the pipeline; nothing replayed
    assert len(m.entry.instructions) == 4
    seen.clear()
    run_pipeline(m, [_Pass("a"), _Pass("b")], verify=True, verified=True, replay=replay)
    assert seen == []                             # verified input, nothing changed
    run_pipeline(m, [_Pass("a"), _Pass("b")], verify=True, replay=replay)
    assert len(seen) == 1                         # an input nobody verified: once


def test_with_replay_the_pass_that_broke_the_module_is_named(monkeypatch):
    m = hlo.parse_hlo(TEXT)
    replay, made = _replay_of(m)
    passes_ = [_Pass("a", changed=True, edit=_drop_dead),
               _Pass("breaks", changed=True, edit=_break_root), _Pass("c")]
    with pytest.raises(PassError, match="after pass breaks"):
        run_pipeline(m, passes_, verify=True, verified=True, replay=replay)
    assert made == [1]
    # A later pass that trips over the broken module (here: raises) does not hide it.

    def trips(module):
        raise RuntimeError("a pass that assumed a valid module")
    m = hlo.parse_hlo(TEXT)
    replay, made = _replay_of(m)
    with pytest.raises(PassError, match="after pass breaks"):
        run_pipeline(m, [_Pass("breaks", changed=True, edit=_break_root),
                         _Pass("trips", edit=trips)], verify=True, verified=True, replay=replay)
    assert made == [1]


def test_with_replay_a_pass_error_is_raised_as_it_was(monkeypatch):
    def refuses(module):
        raise PassError("pass refuses: this program has no kernel for it")
    m = hlo.parse_hlo(TEXT)
    replay, made = _replay_of(m)
    with pytest.raises(PassError, match="pass refuses"):
        run_pipeline(m, [_Pass("a", changed=True, edit=_drop_dead), _Pass("r", edit=refuses)],
                     verify=True, verified=True, replay=replay)
    assert made == [1]


def test_a_client_compile_names_the_pass_that_broke_the_module(monkeypatch, tmp_path):
    """Through ``Client.compile`` (the module cache, verification once after the passes):
    a registered pass that breaks the module is named, as after each pass before."""
    import dataclasses

    import runtime
    from passes.base import PASSES
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))

    @dataclasses.dataclass(frozen=True)
    class BreaksRoot:
        name = "test-breaks-root"

        def run(self, module):
            _break_root(module)
            return True
    monkeypatch.setitem(PASSES, BreaksRoot.name, BreaksRoot)     # registered for this test
    m = hlo.parse_hlo(TEXT)
    text = m.to_text()
    with pytest.raises(PassError, match="after pass test-breaks-root"):
        runtime.client("cpu").compile(m, pipeline="cse,test-breaks-root,dce")
    assert m.to_text() == text                    # the caller's module as it was


def test_default_pipelines_report_changes_honestly():
    """The rule above trusts ``changed``: every pass of the default CPU and CUDA pipelines
    that reports no change leaves the module's text as it was (on a few programs)."""
    import jax.numpy as jnp
    import numpy as np

    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    texts = {}

    def hook(event, p, module, record):
        if event == "before":
            texts["before"] = module.to_text()
        elif not record.changed:
            assert module.to_text() == texts["before"], f"{record.name} changed silently"

    def prog(x, w, b):
        h = jnp.tanh(x @ w + b)
        return (h * h).sum(-1), jnp.maximum(h, 0.0).mean()

    args = (np.ones((16, 8), np.float32), np.ones((8, 8), np.float32), np.ones((8,), np.float32))
    for spec in (pipeline_spec("default", "cpu"),
                 with_target(pipeline_spec("default", "cuda"), "h200")):
        m = hlo.from_jax(prog, *args)
        records = run_pipeline(m, spec, verify=True, hooks=[hook])
        assert any(not r.changed for r in records)


def test_module_snapshot_sees_what_printing_would_and_nothing_else():
    from hlo.shape import Layout
    from passes.base import ModuleSnapshot
    m = hlo.parse_hlo(TEXT2D)
    snap = ModuleSnapshot(m)
    assert not snap.changed(m)
    entry = m.entry
    add = [i for i in entry.instructions if i.opcode == "add"][0]
    add.shape = add.shape.with_layout(Layout((1, 0)))      # an equal shape, new object
    assert not snap.changed(m)
    add.shape = add.shape.with_layout(Layout((0, 1)))      # a layout change
    assert snap.changed(m)
    m = hlo.parse_hlo(TEXT2D)
    snap = ModuleSnapshot(m)
    m.entry.root.replace_operand(0, m.entry.parameters[1])  # an operand moved
    assert snap.changed(m)
    m = hlo.parse_hlo(TEXT2D)
    snap = ModuleSnapshot(m)
    m.config["entry_computation_layout"] = None              # a config entry replaced
    assert snap.changed(m)
    m = hlo.parse_hlo(TEXT2D)
    snap = ModuleSnapshot(m)
    from hlo.attrs import Metadata
    m.entry.root.attrs["metadata"] = Metadata((("op_name", "m"),))   # an attribute added
    assert snap.changed(m)


TEXT2D = """HloModule m

ENTRY %main (p0: f32[2,3], p1: f32[2,3]) -> f32[2,3] {
  %p0 = f32[2,3]{1,0} parameter(0)
  %p1 = f32[2,3]{1,0} parameter(1)
  %a = f32[2,3]{1,0} add(%p0, %p1)
  ROOT %m = f32[2,3]{1,0} multiply(%a, %p0)
}
"""


def test_module_snapshot_with_two_config_entries_sees_no_change():
    """The config's entries are compared as entries whatever their number (two of them once
    read as a computation and its root: always a change)."""
    from passes.base import ModuleSnapshot
    m = hlo.parse_hlo(TEXT2D)
    m.config.clear()
    m.config.update({"a": 1, "b": (2, 3)})
    snap = ModuleSnapshot(m)
    assert not snap.changed(m)
    m.config["b"] = (2, 4)
    assert snap.changed(m)


def test_cse_merges_through_chains_of_duplicates():
    """A duplicate's users become duplicates once it is merged (removed at the end of the
    computation, issue 13): the module stays consistent (verified) and evaluates the same."""
    text = """HloModule m

ENTRY %main (p0: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %p0 = f32[4]{0} parameter(0)
  %a = f32[4]{0} add(%p0, %p0)
  %b = f32[4]{0} add(%p0, %p0)
  %c = f32[4]{0} multiply(%a, %a)
  %d = f32[4]{0} multiply(%b, %b)
  %e = f32[4]{0} subtract(%d, %c)
  %f = f32[4]{0} subtract(%c, %c)
  ROOT %t = (f32[4]{0}, f32[4]{0}, f32[4]{0}) tuple(%c, %e, %f)
}
"""
    m = hlo.parse_hlo(text)
    assert passes.make_pass("cse").run(m)
    hlo.verify(m)
    assert [i.name for i in m.entry.instructions] == ["p0", "a", "c", "e", "t"]
    t = m.entry.root
    assert [o.name for o in t.operands] == ["c", "e", "e"]
    assert [u.name for u in m.entry.get("c").users] == ["e", "t"]


def test_cse_removing_a_control_predecessor_lets_its_successor_merge():
    """%b merges into %a and is removed at once: %z then has no control predecessor and
    merges into %w (as each removal did before merged instructions were batched)."""
    text = """HloModule m

ENTRY %main (p0: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %p0 = f32[4]{0} parameter(0)
  %a = f32[4]{0} add(%p0, %p0)
  %w = f32[4]{0} multiply(%p0, %p0)
  %b = f32[4]{0} add(%p0, %p0)
  %z = f32[4]{0} multiply(%p0, %p0), control-predecessors={%b}
  ROOT %t = (f32[4]{0}, f32[4]{0}, f32[4]{0}) tuple(%a, %w, %z)
}
"""
    m = hlo.parse_hlo(text)
    assert passes.make_pass("cse").run(m)
    hlo.verify(m)
    assert [i.name for i in m.entry.instructions] == ["p0", "a", "w", "t"]
    assert [o.name for o in m.entry.root.operands] == ["a", "w", "w"]


def test_remove_dead_keeps_order_and_drops_stale_users():
    """A dead chain goes (users before operands, the list filtered once); a users entry
    naming an instruction of another computation is dropped, every copy of it."""
    m = hlo.parse_hlo(TEXT)
    entry = m.entry
    p0 = entry.get("p0")
    other = hlo.parse_hlo(TEXT).entry.get("a")      # belongs to another module's entry
    p0.users.extend([other, other])
    dead = entry.get("dead")
    assert entry.remove_dead() == 1
    assert [i.name for i in entry.instructions] == ["p0", "p1", "a", "b", "m"]
    assert dead.parent is None and dead.operands == []
    assert [u.name for u in p0.users] == ["a", "b"]
