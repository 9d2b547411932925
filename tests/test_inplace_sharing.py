"""In-place buffer sharing follows XLA's CanShareOperandBufferWithUser.

A result may be written over a dying operand's buffer only where a parallel kernel reads
each operand element at the index it writes (elementwise paths), or where the op updates
the operand in place by design (dynamic-update-slice, scatter, fusions rooted at them).

Each fusion case is checked three ways: the rule (``can_share_operand_buffer``), what buffer
assignment then does on a scheduled module run through the CPU executable with a poisoned
arena (the answer must equal the reference interpreter's), and a model of a parallel kernel
writing in place: output elements are produced one at a time, each straight into the shared
buffer, every one computed from the buffer as it stands. Where the rule says "share", that
model must give the right answer; where it says "no", it must give a wrong one, which is
why the rule refuses.
"""
from __future__ import annotations

import numpy as np
import pytest

import hlo
from passes.buffer_assignment import assign_buffers
from passes.dataflow import (
    can_share_operand_buffer,
    in_place_operand_candidates,
    in_place_pairs,
    reads_at_same_index,
    same_iteration_space,
)
from passes.scheduling import Schedule
from runtime.executable import CpuExecutable

SUM = """\
%sum (sum.a: f32[], sum.b: f32[]) -> f32[] {
  %sum.a = f32[] parameter(0)
  %sum.b = f32[] parameter(1)
  ROOT %sum.r = f32[] add(%sum.a, %sum.b)
}
%max (max.a: f32[], max.b: f32[]) -> f32[] {
  %max.a = f32[] parameter(0)
  %max.b = f32[] parameter(1)
  ROOT %max.r = f32[] maximum(%max.a, %max.b)
}
"""

# Fused bodies over p0 = f32[4,4] (the operand that may be overwritten) and p1 = f32[4,4].
BODIES: dict[str, tuple[str, bool]] = {
    "elementwise": ("""
  %a = f32[4,4] add(%p0, %p1)
  %t = f32[4,4] tanh(%p0)
  ROOT %r = f32[4,4] multiply(%a, %t)""", True),
    "transpose": ("""
  %t = f32[4,4] transpose(%p0), dimensions={1,0}
  ROOT %r = f32[4,4] add(%t, %p1)""", False),
    "reverse": ("""
  %v = f32[4,4] reverse(%p0), dimensions={1}
  ROOT %r = f32[4,4] add(%v, %p1)""", False),
    "slice": ("""
  %lo = f32[4,2] slice(%p0), slice={[0:4], [0:2]}
  %hi = f32[4,2] slice(%p0), slice={[0:4], [2:4]}
  %c = f32[4,4] concatenate(%hi, %lo), dimensions={1}
  ROOT %r = f32[4,4] add(%c, %p1)""", False),
    "broadcast": ("""
  %b = f32[4,4] broadcast(%p0), dimensions={1,0}
  ROOT %r = f32[4,4] add(%b, %p1)""", False),
    "reduce": ("""
  %z = f32[] constant(0)
  %s = f32[4] reduce(%p0, %z), dimensions={1}, to_apply=%sum
  %b = f32[4,4] broadcast(%s), dimensions={0}
  ROOT %r = f32[4,4] add(%b, %p1)""", False),
    "row_softmax": ("""
  %ninf = f32[] constant(-inf)
  %z = f32[] constant(0)
  %mx = f32[4] reduce(%p0, %ninf), dimensions={1}, to_apply=%max
  %bm = f32[4,4] broadcast(%mx), dimensions={0}
  %sh = f32[4,4] subtract(%p0, %bm)
  %ex = f32[4,4] exponential(%sh)
  %sm = f32[4] reduce(%ex, %z), dimensions={1}, to_apply=%sum
  %bs = f32[4,4] broadcast(%sm), dimensions={0}
  %d = f32[4,4] divide(%ex, %bs)
  ROOT %r = f32[4,4] add(%d, %p1)""", False),
}


def fused_module(body: str, kind: str = "kLoop") -> hlo.Module:
    """ENTRY: e = exp(x) dies at fusion(e, y): the fusion may take e's buffer."""
    text = f"""HloModule m
{SUM}
%fc (p0: f32[4,4], p1: f32[4,4]) -> f32[4,4] {{
  %p0 = f32[4,4] parameter(0)
  %p1 = f32[4,4] parameter(1){body}
}}
ENTRY %main (x: f32[4,4], y: f32[4,4]) -> f32[4,4] {{
  %x = f32[4,4] parameter(0)
  %y = f32[4,4] parameter(1)
  %e = f32[4,4] exponential(%x)
  ROOT %f = f32[4,4] fusion(%e, %y), kind={kind}, calls=%fc
}}
"""
    return scheduled(text)


def scheduled(text: str) -> hlo.Module:
    m = hlo.parse_hlo(text)
    Schedule().run(m)
    hlo.verify(m)
    return m


def run_poisoned(m: hlo.Module, args: list[np.ndarray]):
    """The CPU executable over the assigned arena (poisoned) next to the interpreter."""
    ba = assign_buffers(m)
    got = CpuExecutable(m, ba, poison=True).run(args)
    want = hlo.evaluate(m, args)
    want = list(want) if isinstance(want, tuple) else [want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    return ba


def in_place_kernel_model(fusion: hlo.Instruction, args: list[np.ndarray], operand: int,
                          output: int | None) -> np.ndarray:
    """A parallel kernel writing fused output ``output`` over argument ``operand``: one
    program per output element, in row-major order, each computing its element from the
    shared buffer as earlier programs left it and storing it there at once."""
    comp = fusion.attrs["calls"]
    args = [np.array(a) for a in args]
    buf = args[operand]
    for idx in np.ndindex(buf.shape):
        full = hlo.evaluate(comp, args)
        buf[idx] = (full[output] if output is not None else full)[idx]
    return buf


def rng_args(*shapes, seed: int = 0) -> list[np.ndarray]:
    r = np.random.RandomState(seed)
    return [r.uniform(-1, 1, s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("case", list(BODIES))
def test_fusion_shares_only_when_it_reads_the_operand_at_the_same_index(case: str):
    body, shares = BODIES[case]
    m = fused_module(body)
    f, e = m.entry.get("f"), m.entry.get("e")
    assert can_share_operand_buffer(f, 0, ()) is shares
    assert reads_at_same_index(f, 0, 0) is shares
    assert can_share_operand_buffer(f, 1, ()) is True      # p1 is only added elementwise
    x, y = rng_args((4, 4), (4, 4), seed=1)
    ba = run_poisoned(m, [x, y])
    assert (ba.buffer(f) is ba.buffer(e)) is shares
    assert (("f", "e") in ba.shared_in_place) is shares

    # The kernel model over the fusion's own arguments: right exactly where sharing is allowed.
    want = hlo.evaluate(f.attrs["calls"], [np.exp(x), y])
    model = in_place_kernel_model(f, [np.exp(x), y], operand=0, output=None)
    assert np.allclose(model, want, rtol=1e-6) is shares


def test_the_rule_does_not_depend_on_the_fusion_kind():
    for kind in ("kLoop", "kInput", "kOutput", "kCustom"):
        for case, (body, shares) in BODIES.items():
            f = fused_module(body, kind).entry.get("f")
            assert can_share_operand_buffer(f, 0, ()) is shares, (kind, case)


def test_elementwise_convert_shares_same_width_only_and_layout_changes_never():
    m = scheduled("""HloModule m
ENTRY %main (x: f32[4,4]) -> (s32[4,4], f16[4,4], f32[4,4]) {
  %x = f32[4,4]{1,0} parameter(0)
  %a = f32[4,4]{1,0} exponential(%x)
  %b = f32[4,4]{1,0} negate(%x)
  %c = f32[4,4]{1,0} tanh(%x)
  %i = s32[4,4]{1,0} convert(%a)
  %h = f16[4,4]{1,0} convert(%b)
  %t = f32[4,4]{0,1} copy(%c)
  ROOT %r = (s32[4,4]{1,0}, f16[4,4]{1,0}, f32[4,4]{0,1}) tuple(%i, %h, %t)
}
""")
    get = m.entry.get
    # Same element width, same index: a 4-byte convert writes where it read.
    assert can_share_operand_buffer(get("i"), 0)
    # Different widths: element i of the result is not at element i's bytes.
    assert not can_share_operand_buffer(get("h"), 0)
    # A layout-changing copy is a transpose in memory.
    assert not can_share_operand_buffer(get("t"), 0)
    assert not same_iteration_space(get("c").shape, get("t").shape)
    x, = rng_args((4, 4), seed=2)
    ba = run_poisoned(m, [x])
    assert ("i", "a") in ba.shared_in_place
    assert not any(u in ("h", "t") for u, _ in ba.shared_in_place)


def test_a_fusion_reading_one_operand_twice_needs_both_reads_at_the_same_index():
    m = scheduled("""HloModule m
%fc (p0: f32[4,4], p1: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4] parameter(0)
  %p1 = f32[4,4] parameter(1)
  %t = f32[4,4] transpose(%p1), dimensions={1,0}
  ROOT %r = f32[4,4] add(%p0, %t)
}
ENTRY %main (x: f32[4,4]) -> f32[4,4] {
  %x = f32[4,4] parameter(0)
  %e = f32[4,4] exponential(%x)
  ROOT %f = f32[4,4] fusion(%e, %e), kind=kLoop, calls=%fc
}
""")
    f = m.entry.get("f")
    assert reads_at_same_index(f, 0, 0) and not reads_at_same_index(f, 1, 0)
    assert in_place_operand_candidates(f) == []
    x, = rng_args((4, 4), seed=3)
    ba = run_poisoned(m, [x])
    assert ba.shared_in_place == []
    np.testing.assert_allclose(CpuExecutable(m, ba).run([x])[0],
                               np.exp(x) + np.exp(x).T, rtol=1e-6)


MULTI_OUTPUT = f"""HloModule m
{SUM}
%fc (p0: f32[4,4], p1: f32[4,4]) -> (f32[4,4], f32[4,4], f32[4]) {{
  %p0 = f32[4,4] parameter(0)
  %p1 = f32[4,4] parameter(1)
  %n = f32[4,4] negate(%p0)
  %q = f32[4,4] multiply(%p1, %p1)
  %z = f32[] constant(0)
  %s = f32[4] reduce(%p1, %z), dimensions={{1}}, to_apply=%sum
  ROOT %t = (f32[4,4], f32[4,4], f32[4]) tuple(%n, %q, %s)
}}
ENTRY %main (x: f32[4,4], y: f32[4,4]) -> (f32[4,4], f32[4,4], f32[4]) {{
  %x = f32[4,4] parameter(0)
  %y = f32[4,4] parameter(1)
  %e = f32[4,4] exponential(%x)
  %g = f32[4,4] tanh(%y)
  ROOT %f = (f32[4,4], f32[4,4], f32[4]) fusion(%e, %g), kind=kInput, calls=%fc
}}
"""


def test_multi_output_fusion_shares_per_output():
    m = scheduled(MULTI_OUTPUT)
    f, e, g = (m.entry.get(n) for n in ("f", "e", "g"))
    # p0 reaches output 0 only, elementwise; p1 is also reduced over rows for output 2.
    assert in_place_operand_candidates(f) == [((0,), 0)]
    assert not can_share_operand_buffer(f, 0, (1,))        # p0 does not reach output 1
    assert not can_share_operand_buffer(f, 1, (1,))        # the reduce reads p1 by rows
    x, y = rng_args((4, 4), (4, 4), seed=4)
    ba = run_poisoned(m, [x, y])
    assert ba.buffer(f, (0,)) is ba.buffer(e)
    assert ba.buffer(f, (1,)) is not ba.buffer(g)
    # The model: output 1 over p1 breaks output 2 (the row sums read overwritten values).
    args = [np.exp(x), np.tanh(y)]
    want = hlo.evaluate(f.attrs["calls"], args)
    comp = f.attrs["calls"]
    shared = [np.array(a) for a in args]
    for idx in np.ndindex(4, 4):
        shared[1][idx] = hlo.evaluate(comp, shared)[1][idx]
    np.testing.assert_allclose(shared[1], want[1], rtol=1e-6)   # output 1 itself is fine ...
    assert not np.allclose(hlo.evaluate(comp, shared)[2], want[2])  # ... its neighbour is not


# --- in place by design: dynamic-update-slice and scatter ------------------------------------
def dus_module(fused_root: str, extra: str = "") -> hlo.Module:
    return scheduled(f"""HloModule m
%fc (p0: f32[4,4], p1: f32[1,4], p2: s32[]) -> f32[4,4] {{
  %p0 = f32[4,4] parameter(0)
  %p1 = f32[1,4] parameter(1)
  %p2 = s32[] parameter(2)
  %zero = s32[] constant(0){extra}
  ROOT %d = f32[4,4] {fused_root}
}}
ENTRY %main (x: f32[4,4], u: f32[1,4], i: s32[]) -> f32[4,4] {{
  %x = f32[4,4] parameter(0)
  %u = f32[1,4] parameter(1)
  %i = s32[] parameter(2)
  %e = f32[4,4] exponential(%x)
  ROOT %f = f32[4,4] fusion(%e, %u, %i), kind=kLoop, calls=%fc
}}
""")


DUS_CASES = {
    # Rooted at the update, operand 0 a fused parameter: in place by design.
    "dus_root": ("dynamic-update-slice(%p0, %p1, %p2, %zero)", "", True),
    # Operand 0 through an elementwise op: still each element at its own index.
    "dus_after_negate": ("dynamic-update-slice(%n, %p1, %p2, %zero)",
                         "\n  %n = f32[4,4] negate(%p0)", True),
    # The update is read from the operand itself, one row up (rows 0:2 written at 1:3):
    # row 1 is overwritten before it is copied into row 2.
    "dus_update_from_operand": ("dynamic-update-slice(%p0, %rows, %p2, %zero)",
                                "\n  %rows = f32[2,4] slice(%p0), slice={[0:2], [0:4]}", False),
}


@pytest.mark.parametrize("case", list(DUS_CASES))
def test_fusion_rooted_at_dynamic_update_slice_shares_operand_0(case: str):
    root, extra, shares = DUS_CASES[case]
    m = dus_module(root, extra)
    f, e = m.entry.get("f"), m.entry.get("e")
    assert can_share_operand_buffer(f, 0) is shares
    assert ((0, ()) in in_place_pairs(f)) is (case == "dus_root")
    x, = rng_args((4, 4), seed=5)
    u = np.full((1, 4), 7.0, np.float32)
    ba = run_poisoned(m, [x, u, np.int32(1)])
    assert (ba.buffer(f) is ba.buffer(e)) is shares
    want = hlo.evaluate(f.attrs["calls"], [np.exp(x), u, np.int32(1)])
    model = in_place_kernel_model(f, [np.exp(x), u, np.int32(1)], operand=0, output=None)
    assert np.allclose(model, want) is shares


def test_dynamic_update_slice_shares_operand_0_only():
    m = scheduled("""HloModule m
ENTRY %main (x: f32[8], i: s32[]) -> f32[8] {
  %x = f32[8] parameter(0)
  %i = s32[] parameter(1)
  %e = f32[8] exponential(%x)
  %u = f32[8] negate(%x)
  %d = f32[8] dynamic-update-slice(%e, %u, %i)
  ROOT %r = f32[8] sqrt(%d)
}
""")
    d = m.entry.get("d")
    assert in_place_pairs(d) == [(0, ())]
    # The update has the result's shape here, but it is read at an offset: never shared.
    assert can_share_operand_buffer(d, 0) and not can_share_operand_buffer(d, 1)
    x = np.linspace(0.1, 1, 8, dtype=np.float32)
    ba = run_poisoned(m, [x, np.int32(0)])
    assert ba.buffer(d) is ba.buffer(m.entry.get("e"))
    assert ("d", "u") not in ba.shared_in_place


SCATTER = """HloModule m
%add (add.a: f32[], add.b: f32[]) -> f32[] {
  %add.a = f32[] parameter(0)
  %add.b = f32[] parameter(1)
  ROOT %add.r = f32[] add(%add.a, %add.b)
}
%fc (p0: f32[6], p1: s32[3,1], p2: f32[3]) -> f32[6] {
  %p0 = f32[6] parameter(0)
  %p1 = s32[3,1] parameter(1)
  %p2 = f32[3] parameter(2)
  ROOT %s = f32[6] scatter(%p0, %p1, %p2), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}
ENTRY %main (x: f32[6], idx: s32[3,1], upd: f32[3]) -> f32[6] {
  %x = f32[6] parameter(0)
  %idx = s32[3,1] parameter(1)
  %upd = f32[3] parameter(2)
  %e = f32[6] exponential(%x)
  ROOT %f = f32[6] fusion(%e, %idx, %upd), kind=kLoop, calls=%fc
}
"""


def test_fusion_rooted_at_scatter_shares_its_operand():
    m = scheduled(SCATTER)
    f, e = m.entry.get("f"), m.entry.get("e")
    assert in_place_pairs(f) == [(0, ())]
    assert can_share_operand_buffer(f, 0)
    assert not reads_at_same_index(f, 0, 0)     # not elementwise: shared by design instead
    x = np.linspace(0, 1, 6, dtype=np.float32)
    idx = np.array([[1], [4], [1]], np.int32)
    upd = np.array([10, 20, 30], np.float32)
    ba = run_poisoned(m, [x, idx, upd])
    assert ba.buffer(f) is ba.buffer(e)
    want = np.exp(x)
    want[1] += 40
    want[4] += 20
    np.testing.assert_allclose(CpuExecutable(m, ba, poison=True).run([x, idx, upd])[0], want,
                               rtol=1e-6)


def test_scatter_of_two_inputs_updates_each_in_place():
    m = scheduled("""HloModule m
%add2 (k.a: f32[], k.b: s32[], k.c: f32[], k.d: s32[]) -> (f32[], s32[]) {
  %k.a = f32[] parameter(0)
  %k.b = s32[] parameter(1)
  %k.c = f32[] parameter(2)
  %k.d = s32[] parameter(3)
  %k.s = f32[] add(%k.a, %k.c)
  %k.t = s32[] add(%k.b, %k.d)
  ROOT %k.r = (f32[], s32[]) tuple(%k.s, %k.t)
}
ENTRY %main (x: f32[5], y: s32[5], idx: s32[2,1], u: f32[2], v: s32[2]) -> (f32[5], s32[5]) {
  %x = f32[5] parameter(0)
  %y = s32[5] parameter(1)
  %idx = s32[2,1] parameter(2)
  %u = f32[2] parameter(3)
  %v = s32[2] parameter(4)
  %a = f32[5] exponential(%x)
  %b = s32[5] negate(%y)
  ROOT %s = (f32[5], s32[5]) scatter(%a, %b, %idx, %u, %v), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add2
}
""")
    s = m.entry.get("s")
    assert in_place_pairs(s) == [(0, (0,)), (1, (1,))]
    assert in_place_operand_candidates(s) == [((0,), 0), ((1,), 1)]
    x = np.linspace(0, 1, 5, dtype=np.float32)
    y = np.arange(5, dtype=np.int32)
    idx = np.array([[0], [3]], np.int32)
    ba = run_poisoned(m, [x, y, idx, np.array([1, 2], np.float32), np.array([5, 6], np.int32)])
    assert ba.buffer(s, (0,)) is ba.buffer(m.entry.get("a"))
    assert ba.buffer(s, (1,)) is ba.buffer(m.entry.get("b"))


def test_sort_shares_only_an_operand_it_alone_reads():
    m = scheduled("""HloModule m
%lt (lt.a: f32[], lt.b: f32[]) -> pred[] {
  %lt.a = f32[] parameter(0)
  %lt.b = f32[] parameter(1)
  ROOT %lt.r = pred[] compare(%lt.a, %lt.b), direction=LT
}
ENTRY %main (x: f32[6]) -> (f32[6], f32[6]) {
  %x = f32[6] parameter(0)
  %e = f32[6] exponential(%x)
  %n = f32[6] negate(%x)
  %s1 = f32[6] sort(%e), dimensions={0}, to_apply=%lt
  %m = f32[6] multiply(%n, %n)
  %s2 = f32[6] sort(%n), dimensions={0}, to_apply=%lt
  ROOT %r = (f32[6], f32[6]) tuple(%s1, %s2)
}
""")
    assert can_share_operand_buffer(m.entry.get("s1"), 0)
    assert not can_share_operand_buffer(m.entry.get("s2"), 0)   # %n is also multiplied


def test_constants_and_tuples_are_never_shared():
    m = scheduled("""HloModule m
ENTRY %main (x: f32[3]) -> f32[3] {
  %x = f32[3] parameter(0)
  %c = f32[3] constant({1, 2, 3})
  ROOT %a = f32[3] add(%x, %c)
}
""")
    a = m.entry.get("a")
    assert can_share_operand_buffer(a, 0) and not can_share_operand_buffer(a, 1)


def test_cuda_runtime_uses_the_analysis_rule():
    pytest.importorskip("torch")
    from runtime.cuda import thunks
    assert thunks.reads_at_same_index is reads_at_same_index


def test_a_parameter_feeding_two_outputs_shares_only_in_a_single_pass_kernel():
    # Adam's moment: m feeds the new moment and, through it, the new parameter. A kernel
    # that computes both outputs in the pass that reads m (a loop kernel) may write the new
    # moment over m; one that might re-read m for the second output may not.
    m = hlo.parse_hlo("""HloModule adam_like
%fc (p: f32[8], m: f32[8], g: f32[8]) -> (f32[8], f32[8]) {
  %p = f32[8] parameter(0)
  %m = f32[8] parameter(1)
  %g = f32[8] parameter(2)
  %m2 = f32[8] add(%m, %g)
  %p2 = f32[8] subtract(%p, %m2)
  ROOT %t = (f32[8], f32[8]) tuple(%p2, %m2)
}
ENTRY %main (x: f32[8], y: f32[8], z: f32[8]) -> (f32[8], f32[8]) {
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %z = f32[8] parameter(2)
  ROOT %f = (f32[8], f32[8]) fusion(%x, %y, %z), kind=kLoop, calls=%fc
}
""")
    f = m.entry.get("f")
    assert reads_at_same_index(f, 0, 0)                  # p reaches p2 only
    assert not reads_at_same_index(f, 1, 1)              # m reaches m2 and p2
    assert reads_at_same_index(f, 1, 1, single_pass=True)
    assert reads_at_same_index(f, 1, 0, single_pass=True)   # p2 reads m at its own index too
    assert not reads_at_same_index(f, 2, 0)              # g also reaches both outputs
