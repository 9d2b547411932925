"""Two loops sharing one body computation: each gets its own copy, so each its own state."""
import numpy as np

import hlo
import runtime
from passes import make_pass

SHARED_BODY = """HloModule m

%cond (s: (s32[], f32[2])) -> pred[] {
  %s = (s32[], f32[2]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (b: (s32[], f32[2])) -> (s32[], f32[2]) {
  %b = (s32[], f32[2]{0}) parameter(0)
  %bi = s32[] get-tuple-element(%b), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%bi, %one)
  %v = f32[2]{0} get-tuple-element(%b), index=1
  %v2 = f32[2]{0} add(%v, %v)
  ROOT %t = (s32[], f32[2]{0}) tuple(%next, %v2)
}

ENTRY %main (x: f32[2]) -> (f32[2], f32[2]) {
  %x = f32[2]{0} parameter(0)
  %zero = s32[] constant(0)
  %init1 = (s32[], f32[2]{0}) tuple(%zero, %x)
  %w1 = (s32[], f32[2]{0}) while(%init1), condition=%cond, body=%body
  %r1 = f32[2]{0} get-tuple-element(%w1), index=1
  %neg = f32[2]{0} negate(%r1)
  %init2 = (s32[], f32[2]{0}) tuple(%zero, %neg)
  %w2 = (s32[], f32[2]{0}) while(%init2), condition=%cond, body=%body
  %r2 = f32[2]{0} get-tuple-element(%w2), index=1
  ROOT %out = (f32[2]{0}, f32[2]{0}) tuple(%r1, %r2)
}
"""


def test_flatten_clones_the_second_call_site():
    m = hlo.parse_hlo(SHARED_BODY)
    assert make_pass("flatten-call-graph").run(m)
    hlo.verify(m)
    w1, w2 = [i for i in m.entry.instructions if i.opcode == "while"]
    assert w1.attrs["body"] is not w2.attrs["body"]
    assert w1.attrs["condition"] is not w2.attrs["condition"]
    assert {c.name for c in m.computations} >= {"body", "body.clone", "cond", "cond.clone"}
    assert not make_pass("flatten-call-graph").run(m)     # already flat


def test_loops_sharing_a_body_keep_their_own_results_in_the_arena():
    # x * 2^3 after the first loop, -(x * 8) * 8 after the second; a shared state buffer
    # would make r1 come out as the second loop's value.
    x = np.array([1.0, -2.0], np.float32)
    c = runtime.client("cpu")
    exe = c.compile(hlo.parse_hlo(SHARED_BODY), pipeline="schedule", poison=True)
    r1, r2 = [b.to_numpy() for b in exe.execute([c.buffer_from_pyval(x)])]
    np.testing.assert_array_equal(r1, x * 8)
    np.testing.assert_array_equal(r2, -x * 64)
